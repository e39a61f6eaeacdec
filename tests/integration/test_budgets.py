"""Queue budgets on a real server: once a queue has used its GPU-hours for the period, its new work waits
with the reason `budget` while other queues' work runs; raising the budget lets it start; the CLI and API
show what was used. Real jobs, real accounting from their attempts."""

from __future__ import annotations

import json
import time

from tests.support.server import ServerProcess


def test_work_waits_once_its_queues_budget_is_used_and_starts_when_raised(server: ServerProcess) -> None:
    # 0.001 GPU-hours a day is 3.6 GPU-seconds: one GPU for 5 s spends it
    server.cli("queue", "create", "lab", "--budget", "0.001/day", check=True)
    server.cli("queue", "create", "nlp", "--parent", "lab", check=True)
    server.cli("queue", "create", "cv", check=True)
    spent = server.cli("run", "-q", "nlp", "--wait", "--", "sleep", "5")
    assert spent.returncode == 0, spent.stderr
    time.sleep(11)  # the head counts the hours again every 10 s

    waiting = server.submit({"queue": "nlp", "commands": ["true"], "resources": {"gpu": 1}})
    other = server.submit({"queue": "cv", "commands": ["true"], "resources": {"gpu": 1}})
    # said at submit (under its parent's budget), as a GPU model the pool lacks is
    (warned,) = waiting["warnings"]
    assert warned.startswith("budget: queue lab used 0.00") and f"`gpupool cancel {waiting['id']}`" in warned
    assert other["warnings"] == []
    assert server.wait_for(other["id"])["state"] == "succeeded"  # another queue's work runs on
    why = server.wait_for_reason(waiting["id"])
    assert why["state"] == "pending" and why["reason_code"] == "budget", why
    assert "queue lab used 0.00" in why["reason"] and "of its 0.001 GPU-hour budget for 20" in why["reason"]
    assert "`gpupool queue update lab --budget N/day`" in why["reason"]

    queues = {q["name"]: q for q in json.loads(server.cli("queues", "--json", check=True).stdout)}
    budget = queues["lab"]["budget"]
    assert budget["gpu_hours"] == 0.001 and budget["period"] == "day" and budget["spent"] is True
    # what the budget counts, the department's own report shows: nlp's hours under lab's
    report = json.loads(server.cli("usage", "--since", "1d", "--queue", "lab", "--json", check=True).stdout)
    assert [row["key"] for row in report["rows"]] == ["nlp", "lab"] and report["total"]["gpu_hours"] > 0.0013
    lab = report["rows"][1]  # the department's own line: nothing of its own, its queues' hours beside it
    assert lab["gpu_hours"] == 0.0 and lab["gpu_hours_below"] == report["total"]["gpu_hours"], report
    assert 0.0013 < budget["used_gpu_hours"] < 0.01  # a GPU for 5 s and a little more
    assert queues["nlp"]["budget"] is None and queues["cv"]["budget"] is None
    # a child queue says its parent's spent budget holds its work back (it showed "-" and nothing else)
    assert queues["nlp"]["budget_spent_above"]["queue"] == "lab"
    assert queues["cv"]["budget_spent_above"] is None
    shown = server.cli("queue", "show", "nlp", check=True).stdout
    assert "under queue lab's budget, which is spent (" in shown and "new work waits until 20" in shown, shown
    assert "- (lab's spent)" in server.cli("queues", check=True).stdout
    table = server.cli("queues", check=True).stdout
    assert "0.001 a day, spent" in table, table
    with server.http() as client:
        metrics = client.get("/metrics").text
    assert 'gpupool_queue_budget_gpu_hours{period="day",queue="lab"} 0.001' in metrics, metrics
    assert 'gpupool_queue_budget_used_gpu_hours{period="day",queue="lab"} 0.00' in metrics

    server.cli("queue", "update", "lab", "--budget", "1", check=True)  # its period stays a day
    assert server.wait_for(waiting["id"])["state"] == "succeeded"
    listed = {q["name"]: q for q in json.loads(server.cli("queues", "--json", check=True).stdout)}
    raised = listed["lab"]["budget"]
    assert (raised["gpu_hours"], raised["period"]) == (1, "day"), raised
    server.cli("queue", "update", "lab", "--budget", "none", check=True)
    listed = {q["name"]: q for q in json.loads(server.cli("queues", "--json", check=True).stdout)}
    assert listed["lab"]["budget"] is None


def test_a_bad_budget_is_refused_with_the_fix_and_changes_nothing(server: ServerProcess) -> None:
    for flag, said in (
        ("lots", "--budget lots: GPU-hours, optionally per day, week or month"),
        ("5/year", "budget.period: 'year' is not one of 'day', 'week', 'month'"),
        ("0", "budget.gpu_hours: 0 must be greater than 0"),
    ):
        refused = server.cli("queue", "create", "lab", "--budget", flag)
        assert refused.returncode == 1 and said in refused.stderr, refused.stderr
    with server.http() as client:
        assert [q["name"] for q in client.get("/api/v1/queues").json()] == ["default"]
        refused = client.post("/api/v1/queues", json={"name": "lab", "budget": {"gpu_hours": -1}})
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "budget.gpu_hours"


def test_with_when_spent_stop_running_work_is_stopped_and_runs_again_once_the_budget_is_raised(
    server: ServerProcess,
) -> None:
    """A department's budget that says `when_spent: stop`: once used, its queues' running work is stopped
    (its history says why, actor `budget`; no restart used) and waits pending with the reason `budget`;
    raised, the budget lets it start again, from its checkpoint. Another queue's used budget that says
    wait (the default) lets its running work go on."""
    server.cli("queue", "create", "lab", "--budget", "0.001/day", "--budget-when-spent", "stop", check=True)
    server.cli("queue", "create", "nlp", "--parent", "lab", check=True)
    server.cli("queue", "create", "cv", "--budget", "0.001/day", check=True)
    # the second attempt ends at once, so that it shows the work started again
    resumes = 'if [ "$GPUPOOL_ATTEMPT" -ge 1 ]; then exit 0; fi; exec sleep 300'
    stopped = server.submit(
        {"queue": "nlp", "commands": [resumes], "resources": {"gpu": 1}, "grace_period": 5,
         "checkpoint": {"dir": "./ckpt"}}
    )  # fmt: skip
    goes_on = server.submit({"queue": "cv", "commands": ["exec sleep 300"], "resources": {"gpu": 1}})
    server.wait_for(goes_on["id"], ("running",))

    # 3.6 GPU-seconds spend the budget; the head counts them again every 10 s
    waiting = server.wait_until(
        stopped["id"], lambda w: w["state"] == "pending" and w["reason_code"] == "budget", timeout=40
    )
    assert waiting["restarts"] == 0 and "queue lab used 0.00" in waiting["reason"], waiting
    assert "its work waits until" in waiting["reason"], waiting["reason"]
    asked, settled = [e for e in waiting["events"] if e["actor"] == "budget"]
    assert asked["reason"].startswith("queue lab's budget of 0.001 GPU-hours for 20"), asked
    assert "is used (0.00" in asked["reason"] and "when_spent: stop): stopping it" in asked["reason"], asked
    assert settled["to"] == "pending" and settled["reason"].startswith("stopped: queue lab's budget of 0.001")
    assert settled["reason"].endswith("with no restart used (it resumes from its checkpoint)"), settled
    (first,) = waiting["attempt_list"]
    assert first["state"] == "evicted" and first["reason"].endswith(" is used; exit code 143"), first
    assert server.workload(goes_on["id"])["state"] == "running"  # cv's budget, spent too, says wait
    queues = {q["name"]: q for q in json.loads(server.cli("queues", "--json", check=True).stdout)}
    assert queues["lab"]["budget"]["when_spent"] == "stop" and queues["lab"]["budget"]["spent"] is True
    assert queues["cv"]["budget"]["when_spent"] == "wait" and queues["cv"]["budget"]["spent"] is True

    server.cli("queue", "update", "lab", "--budget", "1", check=True)  # it still says stop
    done = server.wait_for(stopped["id"])
    assert done["state"] == "succeeded" and done["restarts"] == 0, done
    assert [a["number"] for a in done["attempt_list"]] == [0, 1]
    assert server.workload(goes_on["id"])["state"] == "running"
    listed = {q["name"]: q for q in json.loads(server.cli("queues", "--json", check=True).stdout)}
    assert listed["lab"]["budget"]["when_spent"] == "stop" and listed["lab"]["budget"]["gpu_hours"] == 1


def test_a_bad_when_spent_is_refused_with_the_choices_and_changes_nothing(server: ServerProcess) -> None:
    server.cli("queue", "create", "lab", "--budget", "5/week", check=True)
    for args, said in (
        (["--budget-when-spent", "kill"], "--budget-when-spent kill: wait (running work goes on"),
        (["--budget", "none", "--budget-when-spent", "stop"], "give --budget-when-spent only with a budget"),
    ):
        refused = server.cli("queue", "update", "lab", *args)
        assert refused.returncode == 1 and said in refused.stderr, refused.stderr
    refused = server.cli("queue", "create", "cv", "--budget-when-spent", "stop")
    assert refused.returncode == 1 and "budget: {'when_spent': 'stop'} has no gpu_hours" in refused.stderr, (
        refused.stderr
    )
    with server.http() as client:
        refused = client.patch("/api/v1/queues/lab", json={"budget": {"when_spent": "sometimes"}})
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "budget.when_spent"
        assert "is not one of 'wait', 'stop'" in refused.json()["error"]["message"], refused.json()
        (lab,) = [q for q in client.get("/api/v1/queues").json() if q["name"] == "lab"]
    assert lab["budget"]["when_spent"] == "wait" and lab["budget"]["period"] == "week", lab
    server.cli("queue", "update", "lab", "--budget-when-spent", "stop", check=True)  # its hours stay
    shown = json.loads(server.cli("queue", "show", "lab", "--json", check=True).stdout)["budget"]
    assert (shown["gpu_hours"], shown["period"], shown["when_spent"]) == (5, "week", "stop"), shown
