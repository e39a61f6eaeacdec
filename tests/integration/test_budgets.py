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
    assert [row["key"] for row in report["rows"]] == ["nlp"] and report["total"]["gpu_hours"] > 0.0013, report
    assert 0.0013 < budget["used_gpu_hours"] < 0.01  # a GPU for 5 s and a little more
    assert queues["nlp"]["budget"] is None and queues["cv"]["budget"] is None
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
