"""A real server process running real job processes: the lifecycle a user sees."""

from __future__ import annotations

import itertools
import time
from datetime import datetime
from pathlib import Path

from tests.support.server import ServerProcess


def test_job_runs_to_success_with_the_job_contract_environment(server: ServerProcess, job_dir: Path) -> None:
    created = server.submit(
        {
            "name": "contract",
            "resources": {"gpu": 2},
            "commands": ["env | grep -E '^(GPUPOOL_|CUDA_VISIBLE|MASTER_|NNODES|NODE_RANK)' | sort", "pwd"],
            "workdir": str(job_dir),
            "checkpoint": {"dir": "ckpt"},
        }
    )
    assert created["state"] == "pending"
    done = server.wait_for(created["id"])
    assert done["state"] == "succeeded", done
    with server.http() as client:
        log = client.get(f"/api/v1/workloads/{created['id']}/logs").json()["data"]
    env = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
    assert env["GPUPOOL_JOB_ID"] == str(created["id"])
    assert env["GPUPOOL_ATTEMPT"] == "0"
    assert env["GPUPOOL_CHECKPOINT_DIR"] == str(job_dir / "ckpt")
    assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 2
    assert env["GPUPOOL_NUM_NODES"] == env["NNODES"] == "1"
    assert env["GPUPOOL_NODE_RANK"] == env["NODE_RANK"] == "0"
    assert env["GPUPOOL_GPUS_PER_NODE"] == "2"
    assert env["MASTER_ADDR"] == env["GPUPOOL_MASTER_ADDR"] == "127.0.0.1"
    assert int(env["MASTER_PORT"]) > 0
    assert "GPUPOOL_TOKEN" not in env
    assert str(job_dir) in log.splitlines()[-1]
    assert (job_dir / "ckpt").is_dir()


def test_nonzero_exit_fails_the_job_and_records_the_code(server: ServerProcess) -> None:
    created = server.submit({"commands": ["echo about to fail", "exit 7", "echo never printed"]})
    done = server.wait_for(created["id"])
    assert done["state"] == "failed"
    assert done["exit_code"] == 7
    assert "exit code 7" in done["reason"]
    with server.http() as client:
        log = client.get(f"/api/v1/workloads/{created['id']}/logs").json()["data"]
    assert "about to fail" in log and "never printed" not in log


def test_failure_is_retried_per_the_retry_policy_after_a_doubling_backoff(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=["--restart-backoff", "1s"]).start()
    try:
        created = server.submit(
            {
                "commands": ['test "$GPUPOOL_ATTEMPT" -ge 2 || exit 1', "echo made it"],
                "retry": {"max_restarts": 3, "on": ["failure"]},
            }
        )
        codes = set()
        deadline = time.time() + 30
        while (w := server.workload(created["id"]))["state"] not in ("succeeded", "failed"):
            codes.add(w["reason_code"])
            assert time.time() < deadline, w
            time.sleep(0.05)
        assert "restart-backoff" in codes, codes
        done = server.workload(created["id"])
        assert done["state"] == "succeeded"
        assert done["attempts"] == 3 and done["restarts"] == 2
        attempts = done["attempt_list"]
        assert [a["exit_code"] for a in attempts] == [1, 1, 0]
        waits = [
            datetime.fromisoformat(later["started_at"]) - datetime.fromisoformat(earlier["finished_at"])
            for earlier, later in itertools.pairwise(attempts)
        ]
        assert 1.0 <= waits[0].total_seconds() < 4.0 and 2.0 <= waits[1].total_seconds() < 5.0, waits
    finally:
        server.stop()


def test_retries_stop_when_the_budget_is_spent(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=["--restart-backoff", "0"]).start()
    try:
        created = server.submit({"commands": ["exit 2"], "retry": {"max_restarts": 1, "on": ["failure"]}})
        done = server.wait_for(created["id"])
        assert done["state"] == "failed" and done["attempts"] == 2
    finally:
        server.stop()


def test_cancel_sends_sigterm_and_waits_for_a_graceful_exit(server: ServerProcess, job_dir: Path) -> None:
    script = job_dir / "graceful.py"
    script.write_text(
        "import signal, sys, time, pathlib\n"
        "def stop(*_):\n"
        "    time.sleep(1)\n"
        "    pathlib.Path('saved').write_text('checkpoint')\n"
        "    print('saved on SIGTERM', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.1)\n"
    )
    created = server.submit(
        {"commands": ["python3 graceful.py"], "workdir": str(job_dir), "grace_period": "20s"}
    )
    _wait_for_log(server, created["id"], "ready")
    with server.http() as client:
        response = client.post(f"/api/v1/workloads/{created['id']}/cancel")
    assert response.status_code == 202
    done = server.wait_for(created["id"])
    assert done["state"] == "cancelled"
    assert (job_dir / "saved").read_text() == "checkpoint"
    assert done["attempt_list"][0]["finished_at"] is not None
    assert "killed" not in done["reason"]


def test_cancel_kills_a_job_that_ignores_sigterm_after_the_grace_period(server: ServerProcess) -> None:
    created = server.submit(
        {"commands": ["trap '' TERM; echo ready; while true; do sleep 0.1; done"], "grace_period": "2s"}
    )
    _wait_for_log(server, created["id"], "ready")
    started = time.monotonic()
    with server.http() as client:
        client.post(f"/api/v1/workloads/{created['id']}/cancel")
        # while it outlasts SIGTERM it is running still, and says it is stopping, why, and until when
        stopping = client.get(f"/api/v1/workloads/{created['id']}").json()
    if stopping["state"] == "running":
        assert stopping["reason_code"] == "stopping", stopping
        assert stopping["reason"].startswith("stopping (cancelled by admin): SIGTERM"), stopping["reason"]
    done = server.wait_for(created["id"], timeout=20)
    elapsed = time.monotonic() - started
    assert done["state"] == "cancelled"
    assert "killed after the grace period" in done["reason"] and "None" not in done["reason"], done["reason"]
    assert 1.5 <= elapsed < 10, elapsed


def test_cancel_of_a_pending_job_is_immediate(server: ServerProcess) -> None:
    blocker = server.submit({"resources": {"gpu": 8}, "commands": ["sleep 30"]})
    server.wait_for(blocker["id"], states=("running",))
    waiting = server.submit({"resources": {"gpu": 1}, "commands": ["echo never"]})
    time.sleep(0.5)
    assert server.workload(waiting["id"])["state"] == "pending"
    with server.http() as client:
        assert client.post(f"/api/v1/workloads/{waiting['id']}/cancel").json()["state"] == "cancelled"
        assert client.post(f"/api/v1/workloads/{waiting['id']}/cancel").status_code == 409
        client.post(f"/api/v1/workloads/{blocker['id']}/cancel")
    assert server.workload(waiting["id"])["attempts"] == 0


def test_max_duration_stops_the_job_and_fails_it(server: ServerProcess) -> None:
    created = server.submit({"commands": ["sleep 60"], "max_duration": "1s", "grace_period": "1s"})
    done = server.wait_for(created["id"], timeout=20)
    assert done["state"] == "failed"
    assert "max_duration" in done["reason"]
    assert done["reason_code"] == "timeout"  # Slurm's TIMEOUT: told from a failure of its own by a script
    failed = server.wait_for(server.submit({"commands": ["exit 143"]})["id"], timeout=20)
    assert (failed["state"], failed["reason_code"]) == ("failed", "")


def test_a_pending_job_says_why_and_starts_when_gpus_free_up(server: ServerProcess, tmp_path: Path) -> None:
    # The first job runs until the test opens the gate (a "sleep 2" could end before a loaded machine got
    # to the second job's reason, or before the test saw it running).
    gate = tmp_path / "gate"
    first = server.submit(
        {"resources": {"gpu": 6}, "commands": [f"while [ ! -e {gate} ]; do sleep 0.1; done"]}
    )
    server.wait_for(first["id"], states=("running",))
    second = server.submit({"resources": {"gpu": "H100:4"}, "commands": ["true"]})
    pending = server.wait_for_reason(second["id"])
    assert pending["state"] == "pending"
    assert pending["reason_code"] == "no-capacity"
    assert pending["reason"] == "needs 4 H100 GPUs; 2 GPUs free in the pool"
    gate.touch()
    assert server.wait_for(first["id"])["state"] == "succeeded"
    assert server.wait_for(second["id"])["state"] == "succeeded"


def test_gpus_are_never_given_to_two_jobs(server: ServerProcess) -> None:
    ids = [server.submit({"resources": {"gpu": 3}, "commands": ["sleep 1.5"]})["id"] for _ in range(4)]
    attempts = []
    for workload_id in ids:
        done = server.wait_for(workload_id)
        assert done["state"] == "succeeded", done
        attempts += done["attempt_list"]
    # From the attempts' own record (bound at `started_at`, GPUs held until `finished_at`), not from one
    # look at a fixed time, which a loaded machine could make before the second start or after the first
    # end: 8 GPUs ran two 3-GPU jobs at once, never three, and jobs at once never shared a GPU.
    spans = [(at(a["started_at"]), at(a["finished_at"]), a["gpu_indices"]) for a in attempts]
    assert all(len(gpus) == 3 for _, _, gpus in spans), spans
    at_once = [[s for s in spans if s[0] <= start < s[1]] for start, _, _ in spans]
    assert max(len(group) for group in at_once) == 2, spans
    for group in at_once:
        taken = [i for _, _, gpus in group for i in gpus]
        assert len(taken) == len(set(taken)), group


def test_fractional_jobs_share_one_gpu(server: ServerProcess) -> None:
    ids = [server.submit({"resources": {"gpu": 0.5}, "commands": ["sleep 1.5"]})["id"] for _ in range(2)]
    # Read from the finished attempts (a loaded machine may end a 1.5 s job before a look sees it running).
    first, second = (server.wait_for(i)["attempt_list"][0] for i in ids)
    assert first["gpu_indices"] == second["gpu_indices"] and len(first["gpu_indices"]) == 1, (first, second)
    assert at(first["started_at"]) < at(second["finished_at"]) and at(second["started_at"]) < at(
        first["finished_at"]
    ), (first, second)  # at the same time


def test_a_missing_workdir_is_a_node_failure_that_says_why(server: ServerProcess, tmp_path: Path) -> None:
    """A node that cannot start the work (its working directory is not there: a share not mounted yet) is a
    node failure: the job waits out a backoff, pending with the reason; with no node failures to spend
    (`retry.max_node_failures: 0`) it fails with it."""
    missing = str(tmp_path / "nope")
    waiting = server.submit({"commands": ["true"], "workdir": missing})
    created = server.submit({"commands": ["true"], "workdir": missing, "retry": {"max_node_failures": 0}})
    done = server.wait_for(created["id"])
    assert done["state"] == "failed"
    assert "does not exist" in done["reason"]
    backing_off = server.wait_until(waiting["id"], lambda w: w["reason_code"] == "restart-backoff")
    assert backing_off["state"] == "pending" and backing_off["node_failures"] == 1, backing_off
    assert (
        f"its node could not start it: workdir {missing} does not exist on this node" in backing_off["reason"]
    )
    server.cli("cancel", str(waiting["id"]), check=True)
    said = server.cli("logs", str(created["id"]), check=True)  # not silence: why it has no output
    assert said.stdout == "" and "attempt 0 of workload" in said.stderr and "does not exist" in said.stderr


def test_a_launch_error_is_retried_as_a_node_failure_and_a_service_starts_again(tmp_path: Path) -> None:
    """Work its node could not start follows its retry policy (`node-failure`), and a service, which never
    ends by itself, waits out its restart backoff and tries again: neither fails for good."""
    server = ServerProcess(home=tmp_path / "home", extra_args=["--restart-backoff", "1s"]).start()
    try:
        later = tmp_path / "later"
        retried = server.submit(
            {
                "commands": ["true"],
                "workdir": str(later),
                "retry": {"max_restarts": 5, "on": ["node-failure"]},
            }
        )
        service = server.submit({"kind": "service", "commands": ["sleep 60"], "workdir": str(later)})
        deadline = time.time() + 30
        while (
            server.workload(retried["id"])["attempts"] < 1 or server.workload(service["id"])["attempts"] < 1
        ):
            assert time.time() < deadline
            time.sleep(0.1)
        waiting = [server.workload(retried["id"]), server.workload(service["id"])]
        assert [w["state"] for w in waiting] == ["pending", "pending"], waiting
        assert "does not exist on this node" in waiting[0]["attempt_list"][0]["reason"], waiting[0]
        later.mkdir()  # the node can start them now
        assert server.wait_for(retried["id"])["state"] == "succeeded"
        deadline = time.time() + 30
        while (running := server.workload(service["id"]))["state"] != "running":
            assert time.time() < deadline, running
            time.sleep(0.1)
        assert running["restarts"] >= 1
    finally:
        server.stop()


def test_cordoned_node_takes_no_new_work(server: ServerProcess) -> None:
    with server.http() as client:
        assert client.post("/api/v1/nodes/node-1/cordon").json()["state"] == "cordoned"
        created = server.submit({"commands": ["true"]})
        waiting = server.wait_for_reason(created["id"])
        assert waiting["state"] == "pending" and waiting["reason_code"] == "no-capacity"
        assert "node-1 cordoned" in waiting["reason"]
        assert client.post("/api/v1/nodes/node-1/uncordon").json()["state"] == "ready"
        assert client.post("/api/v1/nodes/nope/cordon").status_code == 404
    shown = server.cli("node", "show", "node-1", check=True).stdout  # ready: what last changed, no problem
    assert "  last change: " in shown and "state reason" not in shown, shown  # "uncordoned by admin"
    assert server.wait_for(created["id"])["state"] == "succeeded"


def at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _wait_for_log(server: ServerProcess, workload_id: int, text: str, timeout: float = 20) -> str:
    deadline = time.time() + timeout
    with server.http() as client:
        while time.time() < deadline:
            log = client.get(f"/api/v1/workloads/{workload_id}/logs").json()["data"]
            if text in log:
                return str(log)
            time.sleep(0.1)
    raise AssertionError(f"{text!r} never appeared in the log of {workload_id}")


def test_files_an_attempt_of_another_store_left_are_set_aside_not_read(tmp_path: Path) -> None:
    """A store restored from a backup numbers new work as the lost work was numbered: the new workload 1's
    first attempt must not read the exit code and log that the old one left (it "succeeded" at once while
    its real process ran on untracked)."""
    home = tmp_path / "home"
    stale = home / "runs" / "1" / "0"
    stale.mkdir(parents=True)
    (stale / "exit_code").write_text("0\n")
    (home / "logs" / "1").mkdir(parents=True)
    (home / "logs" / "1" / "attempt-0.log").write_text("the old store's output\n")
    server = ServerProcess(home=home).start()
    try:
        marker = tmp_path / "ran"
        created = server.submit({"commands": ["sleep 1", f"touch {marker}"]})
        assert created["id"] == 1
        done = server.wait_for(created["id"])
        assert done["state"] == "succeeded" and marker.exists(), done
        log = server.cli("logs", "1", check=True).stdout
        assert "the old store's output" not in log
        aside = sorted(p.name for p in (home / "runs" / "1").iterdir())
        assert aside[0] == "0" and aside[1].startswith("0.stale-"), aside
        assert (home / "runs" / "1" / aside[1] / "exit_code").read_text() == "0\n"  # kept, for whoever looks
    finally:
        server.stop()
