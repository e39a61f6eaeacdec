"""kill -9 the server while jobs run: nothing accepted is lost, running jobs are re-adopted."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from tests.support.process import alive
from tests.support.server import ServerProcess


def _pid(server: ServerProcess, workload_id: int) -> int:
    """The pid of the workload's first attempt, once the head has started it (it is `running` a moment
    before: the attempt is recorded before its process exists)."""
    deadline = time.time() + 30
    while (pid := server.workload(workload_id)["attempt_list"][0]["pid"]) is None:
        assert time.time() < deadline, f"workload {workload_id}'s attempt never got a pid"
        time.sleep(0.1)
    return int(pid)


def test_kill9_server_readopts_running_jobs_and_keeps_pending_ones(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home").start()
    gate = tmp_path / "gate"  # the job runs until the test opens it: no race with a slow restart
    try:
        running = server.submit(
            {
                "name": "long",
                "resources": {"gpu": 8},
                "commands": ["echo started", f"while [ ! -e {gate} ]; do sleep 0.1; done", "echo finished"],
            }
        )
        server.wait_for(running["id"], states=("running",))
        queued = server.submit({"name": "queued", "resources": {"gpu": 4}, "commands": ["echo queued ran"]})
        pid = _pid(server, running["id"])
        server.kill9()

        os.kill(pid, 0)  # the job outlives the server: it is in its own session
        server.start()
        after = server.workload(running["id"])
        assert after["state"] == "running" and after["attempts"] == 1
        assert server.workload(queued["id"])["state"] == "pending"

        gate.touch()
        done = server.wait_for(running["id"], timeout=30)
        assert done["state"] == "succeeded" and done["exit_code"] == 0
        assert done["attempts"] == 1, "a re-adopted job must not be started twice"
        assert server.wait_for(queued["id"], timeout=30)["state"] == "succeeded"
        with server.http() as client:
            log = client.get(f"/api/v1/workloads/{running['id']}/logs").json()["data"]
        assert log.count("started") == 1 and "finished" in log
    finally:
        server.stop()


def test_a_job_that_ends_while_the_server_is_down_keeps_its_exit_code(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        gate = tmp_path / "gate"  # not "sleep 1": a loaded machine could end it before it is seen running
        created = server.submit({"commands": [f"while [ ! -e {gate} ]; do sleep 0.1; done", "exit 5"]})
        server.wait_for(created["id"], states=("running",))
        pid = _pid(server, created["id"])
        server.kill9()
        gate.touch()  # the job ends while nobody watches
        deadline = time.time() + 30
        while alive(pid):
            assert time.time() < deadline, "the job did not end"
            time.sleep(0.1)
        ended = time.time()
        time.sleep(3)  # the head stays down a while: the attempt is not charged for that
        server.start()
        done = server.wait_for(created["id"])
        assert done["state"] == "failed" and done["exit_code"] == 5
        finished = datetime.fromisoformat(done["attempt_list"][0]["finished_at"]).timestamp()
        assert finished <= ended + 0.5, (finished, ended)  # its real end (the shim's record), not the restart
    finally:
        server.stop()


def test_a_job_killed_while_the_server_is_down_is_failed_with_the_reason(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        created = server.submit({"commands": ["sleep 30"]})
        server.wait_for(created["id"], states=("running",))
        pid = _pid(server, created["id"])
        server.kill9()
        os.killpg(pid, signal.SIGKILL)  # the whole attempt dies without a word (shim included)
        time.sleep(0.5)
        server.start()
        done = server.wait_for(created["id"])
        assert done["state"] == "failed"
        assert "without recording an exit status" in done["reason"]
    finally:
        server.stop()


def test_a_job_that_vanished_while_the_server_was_down_is_charged_until_last_seen(tmp_path: Path) -> None:
    """No end of its own (the whole attempt was SIGKILLed): it is charged until the head last wrote that it
    ran or the job last wrote output, whichever is later, not for the head's whole outage."""
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        created = server.submit({"commands": ["while true; do echo tick; sleep 0.2; done"]})
        server.wait_for(created["id"], states=("running",))
        pid = _pid(server, created["id"])
        time.sleep(1)
        server.kill9()
        os.killpg(pid, signal.SIGKILL)
        vanished = time.time()
        time.sleep(4)  # the head stays down a while
        server.start()
        done = server.wait_for(created["id"])
        attempt = done["attempt_list"][0]
        assert "while the head was down (last seen running" in attempt["reason"], attempt
        finished = datetime.fromisoformat(attempt["finished_at"]).timestamp()
        assert vanished - 1.0 <= finished <= vanished + 0.5, (finished, vanished)  # its last output
    finally:
        server.stop()


def test_accepted_workloads_survive_kill9_immediately_after_201(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        blocker = server.submit({"resources": {"gpu": 8}, "commands": ["sleep 3"]})
        ids = [server.submit({"resources": {"gpu": 8}, "commands": ["true"]})["id"] for _ in range(20)]
        server.kill9()
        server.start()
        with server.http() as client:
            known = {w["id"] for w in client.get("/api/v1/workloads", params={"all": True}).json()}
        assert set(ids) | {blocker["id"]} <= known
    finally:
        server.stop()


def test_a_job_the_server_died_while_starting_is_requeued_and_runs(tmp_path: Path) -> None:
    """kill -9 between recording an attempt and launching its process leaves an attempt with no pid and
    no process: the restarted head requeues the work (no restart used) instead of failing it."""
    server = ServerProcess(home=tmp_path / "home").start()
    marker = tmp_path / "ran-once"
    try:
        created = server.submit(
            {
                "commands": [
                    f"if [ -e {marker} ]; then echo second run; exit 0; fi",
                    f"touch {marker}",
                    "sleep 60",
                ]
            }
        )
        wid = created["id"]
        server.wait_for(wid, states=("running",))
        pid = _pid(server, wid)
        deadline = time.time() + 30
        while not marker.exists():  # its first run is under way (so a second run says so)
            assert time.time() < deadline, "the job's first run never began"
            time.sleep(0.1)
        server.kill9()
        # What such a crash leaves: the store says running with no pid, and nothing was launched.
        os.killpg(pid, signal.SIGKILL)
        runs = tmp_path / "home" / "runs" / str(wid) / "0"
        for name in ("pid", "shim_pid", "exit_code"):
            (runs / name).unlink(missing_ok=True)
        with sqlite3.connect(tmp_path / "home" / "gpupool.db") as db:
            forget = "UPDATE attempts SET pid = NULL, pid_start_time = NULL, pid_boot_id = NULL"
            db.execute(forget + " WHERE workload_id = ?", (wid,))
        server.start()
        done = server.wait_for(wid, timeout=60)
        assert done["state"] == "succeeded", done
        assert done["attempts"] == 2 and done["restarts"] == 0
        first = done["attempt_list"][0]
        assert first["state"] == "evicted" and first["reason"].startswith("never started")
        with server.http() as client:
            log = client.get(f"/api/v1/workloads/{wid}/logs").json()["data"]
        assert "second run" in log
    finally:
        server.stop()


def test_a_second_server_on_one_home_is_refused_and_the_first_keeps_its_credentials(tmp_path: Path) -> None:
    """A second head on the same GPUPOOL_HOME rewrote the first one's credentials (its CLI token stopped
    working), read its run dirs and placed work on GPUs its jobs held: it is refused, naming the first."""
    first = ServerProcess(home=tmp_path / "home").start()
    try:
        credentials = (first.home / "credentials").read_text()
        env = {**first.env, "GPUPOOL_SERVER": ""}
        with socket.socket() as probe:  # a port free now: the refusal must be for the home, not the port
            probe.bind(("127.0.0.1", 0))
            port = str(probe.getsockname()[1])
        gpupool = str(Path(sys.executable).with_name("gpupool"))
        argv = [gpupool, "server", "--port", port, "--gpus", "sim:1xH100"]
        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1, second
        assert second.stderr.startswith(
            f"error: another gpupool server (pid {first.proc.pid}) runs on the home {first.home}"
        ), second.stderr
        # on the first one's port too: the home is named, not only the port
        same = [*argv[:3], str(first.port), *argv[4:]]
        second = subprocess.run(same, env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1 and second.stderr.startswith(
            f"error: another gpupool server (pid {first.proc.pid}) runs on the home {first.home}"
        ), second.stderr
        assert (first.home / "credentials").read_text() == credentials
        assert first.cli("ps", check=True).returncode == 0
    finally:
        first.stop()
    again = ServerProcess(home=tmp_path / "home").start()  # the lock goes with the process
    again.stop()
