"""Evictions on a real server: the scheduler's reclaim and preempt decisions carried out on real processes."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.support.process import kill_attempts_under
from tests.support.server import ServerProcess

CHECKPOINTING = """
import json, os, signal, sys, time, pathlib
ckpt = pathlib.Path(os.environ["GPUPOOL_CHECKPOINT_DIR"]) / "step"
step = int(ckpt.read_text()) if ckpt.exists() else 0
print(f"attempt {os.environ['GPUPOOL_ATTEMPT']} starts at step {step}", flush=True)
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
while step < int(os.environ.get("STEPS", "1000")):
    time.sleep(0.1)
    step += 1
    ckpt.write_text(str(step))
    if stop:
        print(f"checkpointed at step {step}", flush=True)
        sys.exit(143)
print("done", flush=True)
"""


def _queue(server: ServerProcess, body: dict[str, object]) -> None:
    with server.http() as client:
        response = client.post("/api/v1/queues", json=body)
        assert response.status_code == 201, response.text


def _log(server: ServerProcess, workload_id: int, attempt: int | None = None) -> str:
    with server.http() as client:
        params = {} if attempt is None else {"attempt": attempt}
        return str(client.get(f"/api/v1/workloads/{workload_id}/logs", params=params).json()["data"])


def test_higher_priority_preempts_and_the_victim_resumes_from_its_checkpoint(
    server: ServerProcess, job_dir: Path
) -> None:
    (job_dir / "train.py").write_text(CHECKPOINTING)
    _queue(server, {"name": "team", "resources": {"gpu": {"quota": 8}}})
    low = server.submit(
        {
            "queue": "team",
            "priority": "train",
            "resources": {"gpu": 8},
            "workdir": str(job_dir),
            "commands": ["python3 train.py"],
            "env": {"STEPS": 40},
            "checkpoint": "ckpt-low",
        }
    )
    server.wait_for(low["id"], states=("running",))
    # Until it has checkpointed a few steps (its SIGTERM handler is in place), not for a fixed second: on a
    # loaded machine python3 may not even have started by then, and SIGTERM would kill it unsaved.
    step = job_dir / "ckpt-low" / "step"
    deadline = time.time() + 30
    while not (step.exists() and int(step.read_text() or 0) >= 5):
        assert time.time() < deadline, "the low-priority job never checkpointed 5 steps"
        time.sleep(0.1)
    high = server.submit(
        {
            "queue": "team",
            "priority": 90,
            "preemptible": True,
            "resources": {"gpu": 4},
            "commands": ["sleep 1"],
        }
    )
    assert server.wait_for(high["id"], states=("running", "succeeded"), timeout=30)["state"] in (
        "running",
        "succeeded",
    )
    victim = server.workload(low["id"])
    assert victim["attempt_list"][0]["state"] == "evicted"
    assert "preempted by workload" in victim["attempt_list"][0]["reason"]
    assert "checkpointed at step" in _log(server, low["id"], attempt=0)
    done = server.wait_for(low["id"], timeout=60)
    assert done["state"] == "succeeded" and done["attempts"] == 2 and done["restarts"] == 0
    resumed = _log(server, low["id"], attempt=1)
    assert "attempt 1 starts at step 0" not in resumed and "attempt 1 starts at step" in resumed


def test_higher_priority_work_preempts_within_its_queues_limit(server: ServerProcess) -> None:
    """A queue at its GPU limit: its higher-priority work stops its lower-priority work, whose GPUs count
    toward the limit, though GPUs of the pool are idle (before, it waited as long as that work ran)."""
    _queue(server, {"name": "lim", "resources": {"gpu": {"quota": 4, "limit": 4}}})
    low = server.submit(
        {
            "queue": "lim",
            "priority": 50,
            "resources": {"gpu": 4},
            "commands": ["sleep 60"],
            "grace_period": "1s",
        }
    )
    server.wait_for(low["id"], states=("running",))
    high = server.submit(
        {"queue": "lim", "priority": 1000, "resources": {"gpu": 2}, "commands": ["echo served"]}
    )
    assert server.wait_for(high["id"], timeout=30)["state"] == "succeeded"
    evicted = server.workload(low["id"])["attempt_list"][0]
    assert evicted["state"] == "evicted", evicted
    said = f"preempted by workload {high['id']} (priority 1000 > 50), queue lim, to keep queue lim within"
    assert f"{said} its limit" in evicted["reason"], evicted["reason"]
    assert server.wait_for(low["id"], states=("running",), timeout=30)["attempts"] == 2
    server.cli("cancel", str(low["id"]), check=True)


def test_a_queue_below_its_quota_reclaims_borrowed_gpus(server: ServerProcess) -> None:
    _queue(server, {"name": "a", "resources": {"gpu": {"quota": 4}}})
    _queue(server, {"name": "b", "resources": {"gpu": {"quota": 4}}})
    borrowers = [server.submit({"queue": "a", "resources": {"gpu": 1}, "commands": ["sleep 60"],
                                "grace_period": "1s"})["id"] for _ in range(8)]  # fmt: skip
    for wid in borrowers:
        server.wait_for(wid, states=("running",))
    claimant = server.submit(
        {"queue": "b", "resources": {"gpu": 3}, "commands": ["echo reclaimed; sleep 0.5"]}
    )
    assert server.wait_for(claimant["id"], timeout=30)["state"] == "succeeded"
    states = [server.workload(wid) for wid in borrowers]
    evicted = [w for w in states if w["attempts"] > 1 or w["state"] == "pending"]
    assert len(evicted) == 3, "exactly the GPUs needed are reclaimed"
    first = next(w for w in states if w["attempt_list"][0]["state"] == "evicted")
    assert "reclaimed for queue b" in first["attempt_list"][0]["reason"]
    with server.http() as client:
        queues = {q["name"]: q for q in client.get("/api/v1/queues").json()}
        assert queues["a"]["fair_share"]["gpu"] == 8  # b wants nothing now: a may use it all
        for wid in borrowers:
            client.post(f"/api/v1/workloads/{wid}/cancel")


def test_a_job_that_borrows_gpus_is_reclaimed_whole_for_a_queue_owed_its_quota(server: ServerProcess) -> None:
    """a (quota 4) runs one 8-GPU preemptible job, 4 of its GPUs borrowed; b (quota 4) asks for 4. The
    job goes whole, though a ends below its quota (KAI-Scheduler's rule: the job borrows, so it is
    borrowed whole): b's quota is a guarantee. Before, b waited as long as the job ran."""
    _queue(server, {"name": "a", "resources": {"gpu": {"quota": 4}}})
    _queue(server, {"name": "b", "resources": {"gpu": {"quota": 4}}})
    big = server.submit(
        {"queue": "a", "resources": {"gpu": 8}, "commands": ["sleep 60"], "preemptible": True,
         "grace_period": "1s"}
    )  # fmt: skip
    server.wait_for(big["id"], states=("running",))
    claimant = server.submit({"queue": "b", "resources": {"gpu": 4}, "commands": ["echo served"]})
    assert server.wait_for(claimant["id"], timeout=30)["state"] == "succeeded"
    evicted = server.workload(big["id"])["attempt_list"][0]
    assert evicted["state"] == "evicted", evicted
    assert "reclaimed for queue b (below its quota of 4 GPUs)" in evicted["reason"], evicted["reason"]
    assert "a job that borrows is stopped whole" in evicted["reason"]
    # a's job runs again once b is done: it may borrow the idle GPUs, and b has nothing left to reclaim for.
    again = server.wait_for(big["id"], states=("running",), timeout=30)
    assert again["attempts"] == 2
    server.cli("cancel", str(big["id"]), check=True)


def test_why_explains_a_pending_workload(server: ServerProcess) -> None:
    _queue(server, {"name": "capped", "resources": {"gpu": {"quota": 1, "limit": 2}}})
    server.submit({"queue": "capped", "resources": {"gpu": 2}, "commands": ["sleep 30"]})
    waiting = server.submit({"queue": "capped", "resources": {"gpu": 1}, "commands": ["true"]})
    server.wait_for_reason(waiting["id"])
    out = server.cli("why", str(waiting["id"]), check=True).stdout
    assert "[queue-limit]" in out and "queue capped is at its limit (2/2 GPUs)" in out
    assert "fair share" in out
    table = server.cli("queues", check=True).stdout
    assert "FAIR SHARE" in table and "capped" in table


def test_a_queue_within_its_quota_reclaims_from_one_above_its_quota_below_its_fair_share(
    server: ServerProcess,
) -> None:
    """a (quota 1) runs a 6-GPU and a 1-GPU job, 3 GPUs above its fair share of 4: reclaim by fair share
    may take only the 1-GPU job, too little for b's 4 GPUs. b stays within its quota of 6, so it reclaims
    by quota: the 6-GPU job goes, a keeps its quota."""
    _queue(server, {"name": "a", "resources": {"gpu": {"quota": 1}}})
    _queue(server, {"name": "b", "resources": {"gpu": {"quota": 6}}})
    big, small = (
        server.submit(
            {"queue": "a", "resources": {"gpu": gpus}, "commands": ["sleep 60"], "grace_period": "1s"}
        )
        for gpus in (6, 1)
    )
    for wid in (big["id"], small["id"]):
        server.wait_for(wid, states=("running",))
    claimant = server.submit({"queue": "b", "resources": {"gpu": 4}, "commands": ["echo reclaimed"]})
    assert server.wait_for(claimant["id"], timeout=30)["state"] == "succeeded"
    evicted = server.workload(big["id"])["attempt_list"][0]
    assert evicted["state"] == "evicted"
    assert "reclaimed for queue b (below its quota of 6 GPUs)" in evicted["reason"], evicted["reason"]
    assert "queue a holds GPUs beyond its quota, and a job that borrows is stopped whole" in evicted["reason"]
    kept = server.workload(small["id"])
    assert kept["state"] == "running" and kept["attempts"] == 1
    with server.http() as client:
        for wid in (big["id"], small["id"]):
            client.post(f"/api/v1/workloads/{wid}/cancel")


SLOW_TO_STOP = """
import signal, sys, time
def on_term(*_):
    time.sleep(3)  # a long checkpoint
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
deadline = time.time() + 60  # never outlives the test by long, even if nothing stops it
while time.time() < deadline:
    time.sleep(0.1)
"""


def test_work_waiting_for_a_victim_to_stop_is_told_which_one(server: ServerProcess, job_dir: Path) -> None:
    (job_dir / "slow.py").write_text(SLOW_TO_STOP)
    _queue(server, {"name": "team", "resources": {"gpu": {"quota": 8}}})
    low = server.submit(
        {
            "queue": "team", "priority": "train", "resources": {"gpu": 8}, "workdir": str(job_dir),
            "commands": ["python3 slow.py"], "grace_period": "30s",
        }
    )  # fmt: skip
    server.wait_for(low["id"], states=("running",))
    deadline = time.time() + 30
    while "ready" not in _log(server, low["id"]):  # its SIGTERM handler is in place
        assert time.time() < deadline, "the low-priority job never started its loop"
        time.sleep(0.1)
    high = server.submit({"queue": "team", "priority": 90, "resources": {"gpu": 8}, "commands": ["true"]})
    told = server.wait_for_reason(high["id"])
    assert told["reason_code"] == "waiting-for-release", told
    out = server.cli("why", str(high["id"]), check=True).stdout
    assert f"workload {low['id']} stops for it" in out, out
    assert server.wait_for(high["id"], timeout=60)["state"] == "succeeded"
    with server.http() as client:  # the victim runs again once the GPUs are free: stop it before the server
        client.post(f"/api/v1/workloads/{low['id']}/cancel")
    assert server.wait_for(low["id"], timeout=30)["state"] == "cancelled"


def test_max_stopping_gpus_stops_work_in_waves(tmp_path: Path, job_dir: Path) -> None:
    """scheduling.yaml's `max_stopping_gpus: 4`: two higher-priority 4-GPU jobs would each preempt a 4-GPU
    job of their queue, but only 4 GPUs may be stopping at once. The first victim stops (an 8 s checkpoint)
    while the second gainer waits as `stopping-limit`; once those GPUs are released the second victim goes."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "scheduling.yaml").write_text("max_stopping_gpus: 4\n")
    server = ServerProcess(home=home).start()
    try:
        (job_dir / "slow.py").write_text(
            SLOW_TO_STOP.replace("time.sleep(3)", "print('asked to stop', flush=True); time.sleep(8)")
        )
        _queue(server, {"name": "team", "resources": {"gpu": {"quota": 8}}})
        lows = [
            server.submit(
                {"queue": "team", "priority": "train", "resources": {"gpu": 4}, "workdir": str(job_dir),
                 "commands": ["python3 slow.py"], "grace_period": "30s"}
            )["id"]
            for _ in range(2)
        ]  # fmt: skip
        deadline = time.time() + 30
        for wid in lows:
            server.wait_for(wid, states=("running",))
            while "ready" not in _log(server, wid):  # its SIGTERM handler is in place
                assert time.time() < deadline, f"workload {wid} never started its loop"
                time.sleep(0.1)
        highs = [
            server.submit(
                {"queue": "team", "priority": 90, "resources": {"gpu": 4}, "commands": ["sleep 60"]}
            )["id"]
            for _ in range(2)
        ]
        deadline = time.time() + 20
        while True:
            reasons = sorted(server.workload(wid)["reason_code"] for wid in highs)
            if reasons == ["stopping-limit", "waiting-for-release"]:
                break
            assert time.time() < deadline, f"never one gainer waiting and one held by the limit: {reasons}"
            time.sleep(0.05)
        with server.http() as client:  # what is being released, as an operator watches it
            scraped = client.get("/metrics").text
        assert 'gpupool_stopping_gpus{queue="team",reason="preempt"} 4.0' in scraped, scraped[-3000:]
        held = next(wid for wid in highs if server.workload(wid)["reason_code"] == "stopping-limit")
        out = server.cli("why", str(held), check=True).stdout
        assert "at most 4 may be stopping at once (scheduling.yaml max_stopping_gpus)" in out, out
        # one victim asked to stop, the other left running while the first releases its GPUs
        asked = [wid for wid in lows if "asked to stop" in _log(server, wid, attempt=0)]
        assert len(asked) == 1, asked
        for wid in highs:  # the second wave follows once the first victim's GPUs are released
            server.wait_for(wid, states=("running",), timeout=60)
        assert all(server.workload(wid)["attempt_list"][0]["state"] == "evicted" for wid in lows)
        with server.http() as client:
            for wid in [*highs, *lows]:
                client.post(f"/api/v1/workloads/{wid}/cancel")
    finally:
        server.stop()
        kill_attempts_under(tmp_path)


def test_why_names_the_work_reclaim_may_not_take_yet_and_when_it_may(server: ServerProcess) -> None:
    """b is owed its quota, but a's work is within a's minimum runtime for reclaim: `why` names that work
    and the time it becomes reclaimable, not only "reclaim found nothing"."""
    _queue(server, {"name": "a", "resources": {"gpu": {"quota": 0}}, "min_runtime_reclaim": "10m"})
    _queue(server, {"name": "b", "resources": {"gpu": {"quota": 2}}})
    holders = [server.submit({"queue": "a", "name": f"hold{i}", "resources": {"gpu": 2},
                              "commands": ["sleep 120"]})["id"] for i in range(4)]  # fmt: skip
    for wid in holders:
        server.wait_for(wid, states=("running",))
    owed = server.submit({"queue": "b", "resources": {"gpu": 2}, "commands": ["true"]})
    server.wait_until(owed["id"], lambda w: "reclaim found nothing" in (w["reason"] or ""))
    out = server.cli("why", str(owed["id"]), check=True).stdout
    assert "what reclaim may not take (other queues' work above their quotas):" in out, out
    named = [line.strip() for line in out.splitlines() if line.startswith("    workload ")]
    assert len(named) == 4, out
    assert all(
        re.fullmatch(
            r"workload \d+ \(hold\d, queue a, 2 GPUs\): within queue a's minimum runtime for reclaim "
            r"\(10m\), reclaimable from \d\d:\d\d:\d\d UTC",
            line,
        )
        for line in named
    ), named
    with server.http() as client:
        for wid in [*holders, owed["id"]]:
            client.post(f"/api/v1/workloads/{wid}/cancel")
