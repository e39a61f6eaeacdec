"""Dependencies between workloads (`after`, Slurm's --dependency), on a real server running real jobs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.support.process import kill_attempts_under
from tests.support.server import ServerProcess


def _refused(server: ServerProcess, spec: dict[str, Any]) -> dict[str, Any]:
    with server.http() as client:
        before = len(client.get("/api/v1/workloads", params={"all": "true"}).json())
        response = client.post("/api/v1/workloads", json=spec)
        assert response.status_code == 422, response.text
        assert len(client.get("/api/v1/workloads", params={"all": "true"}).json()) == before
    return dict(response.json()["error"])


def test_a_pipeline_runs_each_step_after_the_one_before_succeeded(
    server: ServerProcess, job_dir: Path
) -> None:
    gate = job_dir / "gate"
    prep = server.submit(
        {
            "name": "prep",
            "resources": {"gpu": 1},
            "commands": [f"while [ ! -e {gate} ]; do sleep 0.05; done", "date +%s.%N > prep.done"],
            "workdir": str(job_dir),
        }
    )
    train = server.submit(
        {
            "name": "train",
            "resources": {"gpu": 1},
            "commands": ["test -e prep.done", "date +%s.%N > train.done"],
            "workdir": str(job_dir),
            "after": [prep["id"]],
        }
    )
    evaluate = server.submit(
        {"name": "eval", "commands": ["test -e train.done"], "workdir": str(job_dir), "after": train["id"]}
    )
    # While prep runs, train waits with its reason, and holds no GPU though 7 of 8 are free.
    said = f"waits for workload {prep['id']} (prep) to succeed (it is running)"
    waiting = server.wait_until(
        train["id"], lambda w: w["reason_code"] == "dependency" and said in w["reason"]
    )
    assert waiting["state"] == "pending"
    why = server.cli("why", str(train["id"]))
    assert "dependency" in why.stdout and "(prep) to succeed" in why.stdout, why.stdout
    later = server.wait_until(evaluate["id"], lambda w: w["reason_code"] == "dependency")
    assert f"workload {train['id']} (train) to succeed (it is pending)" in later["reason"]
    time.sleep(1.0)  # several passes: still nothing started
    assert server.workload(train["id"])["attempts"] == 0
    gate.touch()
    for workload in (prep, train, evaluate):
        assert server.wait_for(workload["id"])["state"] == "succeeded"
    assert float((job_dir / "prep.done").read_text()) < float((job_dir / "train.done").read_text())
    shown = server.cli("show", str(evaluate["id"]))
    assert f"after: {train['id']} succeeded" in shown.stdout, shown.stdout


def test_work_after_a_failure_is_cancelled_with_the_chain_behind_it(
    server: ServerProcess, job_dir: Path
) -> None:
    # `flaky` fails once the work after it is submitted (ended before, that work would be refused at submit).
    gate = job_dir / "gate"
    first = server.submit(
        {"name": "flaky", "commands": [f'while [ ! -e "{gate}" ]; do sleep 0.05; done', "exit 3"]}
    )
    on_success = server.submit({"name": "next", "commands": ["true"], "after": [first["id"]]})
    behind = server.submit({"name": "last", "commands": ["true"], "after": [on_success["id"]]})
    cleanup = server.submit({"name": "cleanup", "commands": ["true"], "after": [f"failed:{first['id']}"]})
    report = server.submit({"name": "report", "commands": ["true"], "after": [f"ended:{first['id']}"]})
    gate.touch()
    assert server.wait_for(first["id"])["state"] == "failed"
    cancelled = server.wait_for(on_success["id"])
    assert cancelled["state"] == "cancelled" and cancelled["attempts"] == 0
    assert cancelled["reason"] == (
        f"dependency never satisfied: workload {first['id']} (flaky) failed, and this one was to start "
        "after it succeeded"
    )
    chained = server.wait_for(behind["id"])
    assert chained["state"] == "cancelled"
    assert f"workload {on_success['id']} (next) was cancelled before it started" in chained["reason"]
    assert server.wait_for(cleanup["id"])["state"] == "succeeded"
    assert server.wait_for(report["id"])["state"] == "succeeded"
    events = server.workload(on_success["id"])["events"]
    assert events[-1]["actor"] == "dependencies" and events[-1]["to"] == "cancelled"


def test_a_dependency_that_cannot_be_met_or_names_nothing_is_refused_at_submit(server: ServerProcess) -> None:
    failed = server.submit({"commands": ["exit 1"]})
    assert server.wait_for(failed["id"])["state"] == "failed"
    body = _refused(server, {"commands": ["true"], "after": [failed["id"]]})
    assert body["field"] == "after[0]"
    assert f"workload {failed['id']}" in body["message"] and "failed" in body["message"]
    assert "would never start" in body["message"]
    body = _refused(server, {"commands": ["true"], "after": [424242]})
    assert body["field"] == "after[0].workload" and "no workload with id 424242" in body["message"]
    web = server.submit({"kind": "service", "commands": ["sleep 600"]})
    body = _refused(server, {"commands": ["true"], "after": [f"succeeded:{web['id']}"]})
    assert body["field"] == "after[0].when" and "is a service" in body["message"]
    body = _refused(server, {"commands": ["true"], "after": ["soon"]})
    assert body["field"] == "after[0].workload"
    body = _refused(server, {"commands": ["true"], "after": [failed["id"], f"ended:{failed['id']}"]})
    assert body["field"] == "after[1]" and "already listed" in body["message"]
    # A service may wait for nothing to end; work may wait for a service to start.
    client_job = server.submit({"commands": ["true"], "after": [f"started:{web['id']}"]})
    assert server.wait_for(client_job["id"])["state"] == "succeeded"
    server.cli("cancel", str(web["id"]))


def test_a_cancel_meets_neither_failed_nor_started_unlike_slurms_afternotok_and_after(
    server: ServerProcess,
) -> None:
    with server.http() as client:  # held: it never starts
        never_ran = client.post(
            "/api/v1/workloads", json={"commands": ["true"]}, params={"hold": "true"}
        ).json()
    server.cli("cancel", str(never_ran["id"]), check=True)
    assert server.wait_for(never_ran["id"])["state"] == "cancelled"
    body = _refused(server, {"commands": ["true"], "after": [f"started:{never_ran['id']}"]})
    assert body["message"] == (
        f"after[0]: workload {never_ran['id']} ({never_ran['name']}) was cancelled before it started, and "
        "this one was to start after it started: it would never start; drop the entry, or wait with when: "
        "ended"
    )
    body = _refused(server, {"commands": ["true"], "after": [f"failed:{never_ran['id']}"]})
    assert "was cancelled before it started, and this one was to start after it failed" in body["message"]
    after_any = server.submit({"commands": ["true"], "after": [f"ended:{never_ran['id']}"]})
    assert server.wait_for(after_any["id"])["state"] == "succeeded"


def test_dependencies_hold_across_a_kill_9_of_the_head(tmp_path: Path, job_dir: Path) -> None:
    server = ServerProcess(home=tmp_path / "home").start()
    gate = job_dir / "gate"
    try:
        up = job_dir / "up"
        first = server.submit({"commands": [f"touch {up}; while [ ! -e {gate} ]; do sleep 0.05; done"]})
        second = server.submit({"commands": ["true"], "after": [first["id"]]})
        server.wait_until(second["id"], lambda w: w["reason_code"] == "dependency")
        # Killed once the first runs, so that it is re-adopted (a kill between its start being recorded and
        # its launch requeues it instead: test_restart.py's test_a_job_the_server_died_while_starting_...).
        deadline = time.time() + 20
        while not up.exists():
            assert time.time() < deadline, "the first job never started"
            time.sleep(0.05)
        server.kill9()
        server.start()
        assert server.workload(second["id"])["state"] == "pending"
        time.sleep(1.0)
        assert server.workload(second["id"])["attempts"] == 0
        gate.touch()
        # what became of the first says why, when the second did not run
        done, before = server.wait_for(second["id"]), server.workload(first["id"])
        history = [(e["to"], e["reason"]) for e in before["events"]]
        assert done["state"] == "succeeded", (done["reason"], before["state"], history)
    finally:
        server.stop()
        kill_attempts_under(tmp_path)


def test_the_cli_chains_steps_with_parsable_ids(server: ServerProcess, job_dir: Path) -> None:
    first = server.cli("run", "--parsable", "--gpus", "0", "--", "sh", "-c", "sleep 0.3", cwd=job_dir)
    first_id = first.stdout.strip()
    assert first_id.isdigit(), first.stdout
    second = server.cli(
        "run", "--parsable", "--gpus", "0", "--after", f"ended:{first_id}", "--", "true", cwd=job_dir
    )
    second_id = int(second.stdout.strip())
    assert server.workload(second_id)["spec"]["after"] == [{"workload": int(first_id), "when": "ended"}]
    assert server.wait_for(second_id)["state"] == "succeeded"
    bad = server.cli("run", "--after", "when:1", "--", "true", cwd=job_dir, check=False)
    assert bad.returncode != 0 and "after[0].when" in bad.stderr + bad.stdout
