"""Holding work (`gpupool hold` / `release`, Slurm's scontrol hold, Run:ai's suspend and resume) on a real
server running real processes: held work waits pending, running work stops with its grace period and
resumes from its checkpoint once released."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.support.process import kill_attempts_under
from tests.support.server import ServerProcess

# Counts to 1000, one step per 0.05 s; on SIGTERM saves the step it reached and exits 0; starts again from
# the saved step. Each attempt's first step goes to starts.log.
COUNTER = """
import os, signal, sys, time, pathlib
ckpt = pathlib.Path(os.environ["GPUPOOL_CHECKPOINT_DIR"]) / "step"
step = int(ckpt.read_text()) if ckpt.exists() else 0
with open("starts.log", "a") as log:
    log.write(f"{os.environ['GPUPOOL_ATTEMPT']} {step}\\n")
def stop(*_):
    ckpt.write_text(str(step))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while step < 1000:
    step += 1
    time.sleep(0.05)
"""


def _counter(server: ServerProcess, job_dir: Path) -> dict[str, Any]:
    """COUNTER as a 2-GPU job in job_dir, checkpointing to job_dir/ckpt, with no restart to spend."""
    (job_dir / "counter.py").write_text(COUNTER)
    spec = {"name": "train", "resources": {"gpu": 2}, "commands": ["python3 counter.py"],
            "workdir": str(job_dir), "checkpoint": {"dir": "ckpt"}, "retry": {"max_restarts": 0}}  # fmt: skip
    return server.submit(spec)


def test_held_work_waits_pending_with_the_gpus_free_and_starts_once_released(server: ServerProcess) -> None:
    blocker = server.submit({"name": "big", "resources": {"gpu": 8}, "commands": ["sleep 600"]})
    server.wait_for(blocker["id"], states=("running",))
    held = server.cli("hold", str(blocker["id"]), check=True)
    assert "held; waits pending until `gpupool release" in held.stdout, held.stdout
    w = server.wait_until(blocker["id"], lambda w: w["state"] == "pending" and w["reason_code"] == "held")
    assert w["held"] is True and w["attempts"] == 1  # it had started: stopped, now waiting
    time.sleep(1.0)  # several passes: 8 GPUs free, and still it waits
    assert server.workload(blocker["id"])["state"] == "pending"
    why = server.cli("why", str(blocker["id"]), check=True)  # who held it, still, after several passes
    assert "held by admin: stopped, and waits pending until `gpupool release" in why.stdout, why.stdout
    # Its queue's pending demand says the scheduler does not see it: no fair share counts it, no reclaim
    # runs for it, and the starved-queue alert (pending less held back) stays quiet.
    assert "pending demand 8 GPUs (all of them held back or never fitting" in why.stdout, why.stdout
    with server.http() as client:
        queue = client.get("/api/v1/queues/default").json()
        metrics = client.get("/metrics").text
    assert (queue["gpus_pending"], queue["gpus_held_back"]) == (8, 8), queue
    assert 'gpupool_queue_held_back_gpus{queue="default"} 8.0' in metrics
    assert 'gpupool_queue_pending_gpus{queue="default"} 8.0' in metrics
    server.cli("release", str(blocker["id"]), check=True)
    again = server.wait_for(blocker["id"], states=("running",))
    assert again["held"] is False and again["attempts"] == 2
    with server.http() as client:
        assert client.get("/api/v1/queues/default").json()["gpus_held_back"] == 0
    events = [e["reason"] for e in again["events"]]
    assert any(r.startswith("held by admin") for r in events) and "released by admin" in events
    server.cli("cancel", str(blocker["id"]), check=True)


def test_held_running_work_stops_gracefully_and_resumes_from_its_checkpoint(
    tmp_path: Path, job_dir: Path
) -> None:
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        created = _counter(server, job_dir)
        server.wait_for(created["id"], states=("running",))
        time.sleep(1.5)
        with server.http() as client:
            response = client.post(f"/api/v1/workloads/{created['id']}/hold")
            assert response.status_code == 200, response.text
        held = server.wait_until(
            created["id"], lambda w: w["state"] == "pending" and w["reason_code"] == "held"
        )
        first = held["attempt_list"][0]
        assert first["state"] == "evicted" and first["reason"].startswith("held by admin: stopping it")
        assert held["restarts"] == 0  # a hold uses no restart: max_restarts 0 still lets it resume
        saved = int((job_dir / "ckpt" / "step").read_text())
        assert saved > 0
        with server.http() as client:
            assert client.post(f"/api/v1/workloads/{created['id']}/release").status_code == 200
        server.wait_for(created["id"], states=("running",))
        server.wait_until(
            created["id"], lambda w: len((job_dir / "starts.log").read_text().splitlines()) == 2
        )
        starts = (job_dir / "starts.log").read_text().split()
        assert starts == ["0", "0", "1", str(saved)]  # attempt 1 began where attempt 0 stopped
        server.cli("cancel", str(created["id"]), check=True)
    finally:
        server.stop()
        kill_attempts_under(tmp_path)


def test_requeued_work_stops_gracefully_and_starts_again_from_its_checkpoint_unheld(
    tmp_path: Path, job_dir: Path
) -> None:
    """`gpupool requeue` (Slurm's scontrol requeue): running work stops with its grace period and goes back
    to the scheduler, which starts it again at once here (nothing holds it), from its checkpoint."""
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        created = _counter(server, job_dir)
        huge = server.submit({"name": "huge", "resources": {"gpu": 16}, "commands": ["true"]})
        server.wait_for(created["id"], states=("running",))
        time.sleep(1.5)
        out = server.cli("requeue", str(created["id"]), check=True).stdout
        assert f"{created['id']} (train): requeued; stopping" in out, out
        again = server.wait_until(created["id"], lambda w: w["attempts"] == 2 and w["state"] == "running")
        first = again["attempt_list"][0]
        assert first["state"] == "evicted" and first["reason"].startswith("requeued by admin; exit code ")
        assert again["restarts"] == 0 and not again["held"]  # no restart used, nothing holds it
        reasons = [e["reason"] for e in again["events"]]
        assert "requeued by admin: stopping it, to wait pending for the scheduler" in reasons, reasons
        assert any(r.startswith("requeued by admin: stopped, and waits pending") for r in reasons), reasons
        server.wait_until(
            created["id"], lambda _: len((job_dir / "starts.log").read_text().splitlines()) == 2
        )
        saved = int((job_dir / "ckpt" / "step").read_text())
        starts = (job_dir / "starts.log").read_text().split()
        assert starts[:2] == ["0", "0"] and starts[2] == "1" and 0 < int(starts[3]) <= saved, starts

        refused = server.cli("requeue", str(huge["id"]))
        assert refused.returncode != 0 and "is pending, not running; nothing to requeue" in refused.stderr
        assert "it waits for the scheduler" in refused.stderr
        assert server.workload(huge["id"])["state"] == "pending"
        server.cli("hold", str(huge["id"]), check=True)
        held = server.cli("requeue", str(huge["id"]))
        assert f"nothing to requeue (it is held: `gpupool release {huge['id']}` lets it start)" in held.stderr
        server.cli("cancel", str(created["id"]), str(huge["id"]), check=True)
    finally:
        server.stop()
        kill_attempts_under(tmp_path)


def test_hold_names_what_cancel_names_and_refuses_what_has_ended(server: ServerProcess) -> None:
    sweep = server.submit({"array": "0-2", "resources": {"gpu": 4}, "commands": ["sleep 600"]})
    with server.http() as client:
        whole = client.post(f"/api/v1/workloads/{sweep['id']}/hold").json()
        assert whole["held_ids"] == sweep["array_ids"]
        for wid in sweep["array_ids"]:
            server.wait_until(wid, lambda w: w["state"] == "pending" and w["held"])
        one = client.post(f"/api/v1/workloads/{sweep['id']}/release", params={"task": "true"}).json()
        assert one["held_ids"] == [sweep["id"]]
        server.wait_for(sweep["id"], states=("running",))
        assert all(server.workload(w)["state"] == "pending" for w in sweep["array_ids"][1:])
        done = server.submit({"commands": ["true"]})
        server.wait_for(done["id"])
        refused = client.post(f"/api/v1/workloads/{done['id']}/hold")
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["message"] == f"workload {done['id']} has succeeded; nothing to hold"
        assert client.post("/api/v1/workloads/999999/hold").status_code == 404
    server.cli("cancel", str(sweep["id"]), check=True)


def test_several_ids_act_on_each_that_can_be_whatever_their_order(server: ServerProcess) -> None:
    """As scancel and scontrol: an id the server refuses (its work has ended) is said on stderr, the others
    are still cancelled, held or released, in either order, and the command exits 1. Holding what is held,
    or releasing what is not, says so rather than claiming to have done it."""
    done = server.submit({"commands": ["true"]})["id"]
    server.wait_for(done)
    first, second = (server.submit({"commands": ["sleep 600"]})["id"] for _ in range(2))
    for wid in (first, second):
        server.wait_for(wid, states=("running",))
    not_held = server.cli("release", str(first), check=True)
    assert not_held.stdout.strip() == f"{first} (job-{first}): not held; nothing to release", not_held.stdout
    held = server.cli("hold", str(done), str(first))
    assert held.returncode == 1 and f"workload {done} has succeeded; nothing to hold" in held.stderr
    assert f"{first} (job-{first}): held;" in held.stdout, held.stdout
    again = server.cli("hold", str(first), check=True)
    assert again.stdout.strip() == f"{first} (job-{first}): already held; nothing more to do"
    released = server.cli("release", str(first), str(done))
    assert released.returncode == 1 and f"{first} (job-{first}): released;" in released.stdout
    server.cli("hold", str(second), check=True)  # it ran, and waits again: cancelled "while it waited"
    server.wait_until(second, lambda w: w["state"] == "pending")
    for order in ((done, first), (second, done)):
        out = server.cli("cancel", *map(str, order))
        assert out.returncode == 1, out.stderr
        assert out.stderr.strip() == f"error: workload {done} has succeeded; nothing to cancel", out.stderr
    for wid in (first, second):
        assert server.wait_for(wid)["state"] == "cancelled"
    assert server.workload(second)["reason"] == "cancelled by admin while it waited"
    assert server.workload(first)["reason"].startswith("cancelled by admin; exit code")  # it was running


def test_raising_a_waiting_jobs_priority_lets_it_preempt_and_start_first(server: ServerProcess) -> None:
    first = server.submit({"name": "first", "resources": {"gpu": 8}, "commands": ["sleep 600"]})
    server.wait_for(first["id"], states=("running",))
    second = server.submit({"name": "second", "resources": {"gpu": 8}, "commands": ["sleep 600"]})
    urgent = server.submit({"name": "urgent", "resources": {"gpu": 8}, "commands": ["sleep 600"]})
    server.wait_for_reason(urgent["id"])
    out = server.cli("update", str(urgent["id"]), "--priority", "build", check=True)
    assert f"{urgent['id']} (urgent): priority 100" in out.stdout, out.stdout
    running = server.wait_for(urgent["id"], states=("running",))
    assert any(e["reason"] == "priority 50 -> 100 by admin" for e in running["events"])
    assert server.workload(first["id"])["state"] == "pending"  # preempted, requeued
    assert server.workload(second["id"])["state"] == "pending"
    with server.http() as client:
        for body, field in (
            ({"priority": 1001}, "priority"),
            ({"priority": "urgent"}, "priority"),
            ({"nice": 1}, "nice"),
        ):
            refused = client.patch(f"/api/v1/workloads/{second['id']}", json=body)
            assert refused.status_code == 422 and refused.json()["error"]["field"] == field, refused.text
    server.cli("cancel", str(first["id"]), str(second["id"]), str(urgent["id"]), check=True)


def test_a_new_time_limit_applies_to_running_work_and_a_bad_change_changes_nothing(
    server: ServerProcess,
) -> None:
    """`gpupool update --max-duration` (Slurm's scontrol update TimeLimit=): a running attempt's limit
    counts from its start, so lowering it below the time run stops the work as its own limit would."""
    job = server.submit({"name": "long", "resources": {"gpu": 1}, "commands": ["sleep 600"],
                         "max_duration": "1h"})  # fmt: skip
    waiting = server.submit({"name": "big", "resources": {"gpu": 16}, "commands": ["true"]})
    server.wait_for(job["id"], states=("running",))
    out = server.cli("update", str(job["id"]), str(waiting["id"]), "--max-duration", "4h", check=True)
    assert f"{job['id']} (long): max duration 4h" in out.stdout, out.stdout
    assert f"{waiting['id']} (big): max duration 4h" in out.stdout, out.stdout
    shown = server.cli("show", str(job["id"]), check=True).stdout
    assert "time limit: 4h per attempt (max_duration); 3h59m" in shown, shown  # what is left of it
    out = server.cli("update", str(waiting["id"]), "--max-duration", "none", check=True)
    assert "no time limit" in out.stdout and server.workload(waiting["id"])["max_duration"] is None
    assert "time limit" not in server.cli("show", str(waiting["id"]), check=True).stdout
    for args, message in (
        (("--max-duration", "5x"), "max_duration: '5x' is not a duration"),
        (("--max-duration", "0"), "max_duration must be longer than 0 seconds"),
        (("--priority", "2000", "--max-duration", "1s"), "priority must be 0..1000"),
        (("--priority", "urgent"), "--priority: 'urgent' is not a number 0..1000 or a class name"),
        ((), "give --priority, --max-duration or --queue"),
    ):
        refused = server.cli("update", str(job["id"]), *args)
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr
    time.sleep(1.0)  # passes: a refused change stopped nothing and changed nothing
    still = server.workload(job["id"])
    assert (still["state"], still["priority"], still["max_duration"]) == ("running", 50, 4 * 3600.0), still
    with server.http() as client:
        refused = client.patch(f"/api/v1/workloads/{job['id']}", json={"max_duration": True})
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "max_duration", refused.text
    time.sleep(1.5)  # it has run longer than the limit it is about to get
    server.cli("update", str(job["id"]), "--max-duration", "1s", check=True)
    ended = server.wait_for(job["id"], states=("failed",))
    assert ended["reason"].startswith("exceeded max_duration (1s)"), ended["reason"]
    reasons = [e["reason"] for e in ended["events"]]
    assert "max_duration 1h -> 4h by admin" in reasons and "max_duration 4h -> 1s by admin" in reasons
    server.cli("cancel", str(waiting["id"]), check=True)
    # Stopped for its limit, a job that ignores SIGTERM has its limit removed during its grace period: it
    # is still killed, and fails for the limit it had.
    stubborn = server.submit({"name": "stubborn", "resources": {"gpu": 1}, "grace_period": 6, "commands": [
        "python3 -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'"
    ]})  # fmt: skip
    server.wait_for(stubborn["id"], states=("running",))
    time.sleep(1.2)
    with server.http() as client:
        path = f"/api/v1/workloads/{stubborn['id']}"
        assert client.patch(path, json={"max_duration": 1}).status_code == 200
        stopping = f"event=attempt_stopping workload={stubborn['id']} attempt=0 why=max_duration"
        deadline = time.time() + 10
        while stopping not in server.log():  # SIGTERM sent, ignored: SIGKILL comes after the grace period
            assert time.time() < deadline, server.log()
            time.sleep(0.05)
        assert client.patch(path, json={"max_duration": None}).status_code == 200
    ended = server.wait_for(stubborn["id"], states=("failed",))
    assert ended["reason"].startswith("exceeded max_duration (its limit, since removed)"), ended["reason"]


def test_work_submitted_held_waits_until_released_tasks_and_replicas_alike(server: ServerProcess) -> None:
    submitted = server.cli("run", "--hold", "--array", "0-2", "--gpus", "1", "--", "true", check=True)
    assert "held until `gpupool release" in submitted.stdout, submitted.stdout
    array = server.workload(int(submitted.stdout.split()[1]))
    tasks = [t["id"] for t in array["task_list"]]
    with server.http() as client:
        response = client.post(
            "/api/v1/workloads?hold=true",
            json={"kind": "service", "replicas": 2, "commands": ["sleep 600"]},
        )
        assert response.status_code == 201, response.text
        service = response.json()
    assert service["held"] is True and service["reason_code"] == "held"
    time.sleep(1.5)  # passes with every GPU free: nothing starts
    for wid in (*tasks, *service["replica_ids"]):
        w = server.workload(wid)
        assert (w["state"], w["held"], w["attempts"]) == ("pending", True, 0), w
        assert w["reason"].startswith("held") and "`gpupool release" in w["reason"], w  # as submit said
    server.cli("release", str(array["id"]), str(service["id"]), check=True)
    for wid in tasks:
        server.wait_for(wid, states=("succeeded",))
    for wid in service["replica_ids"]:
        server.wait_for(wid, states=("running",))
    server.cli("cancel", str(service["id"]), check=True)


def test_releasing_an_array_where_one_task_is_held_says_it_released_that_one(server: ServerProcess) -> None:
    submitted = server.cli("run", "--array", "0-2", "--gpus", "1", "--", "sleep", "600", check=True)
    array = server.workload(int(submitted.stdout.split()[1]))
    held = array["task_list"][1]["id"]
    assert "held" in server.cli("hold", f"{array['id']}_1", check=True).stdout
    out = server.cli("release", str(array["id"]), check=True).stdout
    assert f"released (1 of 3 workloads: {held}; 2 not held)" in out, out
    out = server.cli("hold", str(array["id"]), check=True).stdout
    assert "held (3 workloads:" in out, out  # all three were free to hold
    server.cli("cancel", str(array["id"]), check=True)
