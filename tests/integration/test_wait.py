"""Waiting for work to end (`gpupool run|submit --wait`, `gpupool wait`): the output as it comes, the
job's own exit code, arrays and several workloads, retries followed, --timeout and Ctrl-C leaving the work
running. A real server, real jobs, the real CLI."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.server import ServerProcess


def until_connected(pid: int, port: int, timeout: float = 30.0) -> None:
    """Until process `pid` holds a TCP connection to 127.0.0.1:`port`."""
    deadline = time.monotonic() + timeout
    while not any(c.raddr and c.raddr.port == port for c in psutil.Process(pid).net_connections("tcp")):
        assert time.monotonic() < deadline, f"process {pid} never connected to port {port}"
        time.sleep(0.05)


def test_run_wait_prints_the_output_and_exits_with_the_jobs_code(server: ServerProcess) -> None:
    failed = server.cli("run", "--wait", "--", "sh", "-c", "echo hello; sleep 1; echo bye; exit 3")
    assert failed.returncode == 3, failed.stderr
    assert failed.stdout == "hello\nbye\n"  # the work's output alone on stdout
    assert "submitted 1" in failed.stderr and "workload 1 (" in failed.stderr
    assert "failed with exit code 3" in failed.stderr
    why = server.cli("why", "1", check=True).stdout  # "exit code 3" alone: where to read why
    assert why.splitlines()[:3] == ["1 (job-1) failed", "  exit code 3", "  its output: `gpupool logs 1`"], (
        why
    )

    done = server.cli("run", "--wait", "--gpus", "0", "--", "echo", "ok")
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr
    assert "succeeded" in done.stderr

    # stopped at its time limit: what SIGTERM made of it, as the user guide's table says (it said 1)
    limited = server.cli("run", "--wait", "--gpus", "0", "--max-duration", "1s", "--", "sleep", "30")
    assert limited.returncode == 143, limited.stderr
    assert "exceeded max_duration (1s)" in limited.stderr
    # ... and a program that chooses its code on SIGTERM has that one (it read 143 whatever it chose), and
    # nothing after it runs
    chose = server.cli("run", "--wait", "--gpus", "0", "--max-duration", "1s", "--", "sh", "-c",
                       "trap 'echo saved; exit 42' TERM; sleep 30 & wait; echo not-this")  # fmt: skip
    assert (chose.returncode, chose.stdout) == (42, "saved\n"), chose.stderr
    assert "exceeded max_duration (1s); exit code 42" in chose.stderr, chose.stderr


def test_an_array_and_several_workloads_exit_0_only_when_all_succeeded(server: ServerProcess) -> None:
    array = server.cli(
        "run", "--array", "0-2", "--wait", "--gpus", "0", "--", "sh", "-c", "exit $GPUPOOL_ARRAY_INDEX"
    )
    assert array.returncode == 2, array.stderr  # the highest exit code of its tasks, as sbatch --wait
    assert "1 of 3 succeeded" in array.stderr
    assert "([0]) succeeded" not in array.stderr and "[2]) failed with exit code 2" in array.stderr

    good = server.submit({"commands": ["true"]})
    slow = server.submit({"commands": ["sleep 30"]})
    server.wait_for(good["id"])
    waiter = subprocess.Popen(
        [sys.executable, "-m", "gpupool.main", "wait", str(good["id"]), str(slow["id"])],
        env=server.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(2)
    assert waiter.poll() is None  # the slow one runs on
    server.cli("cancel", str(slow["id"]), check=True)
    _, said = waiter.communicate(timeout=60)
    assert waiter.returncode == 1, said
    assert f"workload {slow['id']} (" in said and "cancelled" in said and "1 of 2 succeeded" in said

    first = int(array.stderr.split("as array ")[1].split()[0])
    assert server.cli("wait", str(first), "--quiet").returncode == 2  # an array's id: all its tasks
    assert server.cli("wait", str(good["id"])).returncode == 0


def test_a_retried_job_is_followed_to_its_last_attempt(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=["--restart-backoff", "0"]).start()
    try:
        spec = tmp_path / "flaky.yaml"
        spec.write_text(
            "commands:\n"
            "  - echo attempt $GPUPOOL_ATTEMPT\n"
            "  - test $GPUPOOL_ATTEMPT -ge 1\n"
            "retry: {max_restarts: 2, on: [failure]}\n"
        )
        done = server.cli("submit", str(spec), "--wait")
        assert done.returncode == 0, done.stderr
        assert done.stdout == "attempt 0\nattempt 1\n"

        # `logs -f` begun while the first attempt runs follows the retry too
        flaky = server.submit(
            {
                # attempt 0 outlasts the CLI's start on a loaded machine (2 s did not, in a CI run)
                "commands": [
                    "echo attempt $GPUPOOL_ATTEMPT",
                    "test $GPUPOOL_ATTEMPT -ge 1 || sleep 8",
                    "test $GPUPOOL_ATTEMPT -ge 1",
                ],
                "retry": {"max_restarts": 2, "on": ["failure"]},
            }
        )
        server.wait_for(flaky["id"], states=("running",))
        followed = server.cli("logs", "-f", str(flaky["id"]))
        assert followed.stdout == "attempt 0\nattempt 1\n", followed.stderr
        # how it ended, on stderr (it printed nothing: a failure read as the end of the output)
        assert followed.stderr.rstrip().endswith(f"workload {flaky['id']} (job-{flaky['id']}) succeeded")
    finally:
        server.stop()


def test_timeout_and_ctrl_c_stop_waiting_not_the_work(server: ServerProcess) -> None:
    timed = server.cli("run", "--wait", "--timeout", "2s", "--", "sleep", "60")
    assert timed.returncode == 124, timed.stderr
    assert "--timeout 2s passed before the end: workload 1 goes on" in timed.stderr
    assert server.workload(1)["state"] in ("pending", "running")

    # Started as a shell starts a command in the foreground, with Ctrl-C at its default: one started in the
    # background (`pytest ... &`) would inherit it ignored, and Python keeps ignoring it.
    waiter = subprocess.Popen(
        [sys.executable, "-m", "gpupool.main", "wait", "1"],
        env=server.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    # Ctrl-C once it waits: it has asked the server (its client keeps the connection open) and gone on to
    # its loop. A signal during the interpreter's start-up would test Python, not the command.
    until_connected(waiter.pid, server.port)
    time.sleep(1)
    waiter.send_signal(signal.SIGINT)
    _, said = waiter.communicate(timeout=30)
    assert waiter.returncode == 130, said
    assert "stopped waiting: workload 1 goes on" in said
    assert server.workload(1)["state"] == "running"
    server.cli("cancel", "1", check=True)


def test_a_wait_on_work_that_stays_pending_says_why_in_a_log(server: ServerProcess) -> None:
    """No terminal, no status line: `run --wait` says why after a few seconds pending, `gpupool wait` at its
    first look, so a CI log shows that the work can never fit rather than nothing at all."""
    ran = server.cli("run", "--wait", "--timeout", "8s", "--gpus", "100", "--", "true")
    assert ran.returncode == 124, ran.stderr
    why = "pending: can never fit this pool: needs 100 GPUs on one node; the largest has 8"
    assert f"workload 1 {why}" in ran.stderr, ran.stderr
    waited = server.cli("wait", "1", "--timeout", "2s")
    assert waited.returncode == 124 and waited.stderr.count(f"1 (job-1) {why}") == 1, waited.stderr
    server.cli("cancel", "1", check=True)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["run", "--service", "--wait", "--", "sleep", "1"], "a service runs until it is cancelled"),
        (["run", "--wait", "--timeout", "soon", "--", "true"], "--timeout: 'soon' is not a duration"),
        (["run", "--timeout", "2s", "--", "true"], "--timeout goes with --wait"),
        (["run", "--wait", "--hold", "--", "true"], "--wait with --hold: held work waits until `gpupool"),
        (["wait", "999"], "no workload with id 999"),
    ],
)
def test_bad_waits_are_refused_with_the_fix_and_submit_nothing(
    server: ServerProcess, args: list[str], said: str
) -> None:
    refused = server.cli(*args)
    assert refused.returncode == 1 and said in refused.stderr, refused.stderr
    with server.http() as client:
        assert client.get("/api/v1/workloads?all=true").json() == []


def test_the_listing_takes_ids(server: ServerProcess) -> None:
    ids = [server.submit({"commands": ["true"], "resources": {"gpu": 0}})["id"] for _ in range(3)]
    with server.http() as client:
        listed = client.get(f"/api/v1/workloads?all=true&id={ids[0]}&id={ids[2]}&id=999").json()
        assert [w["id"] for w in listed] == [ids[0], ids[2]]
        query = "&".join(f"id={i}" for i in range(1, 1002))
        refused = client.get(f"/api/v1/workloads?{query}")
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "id", refused.text


def test_waiting_and_following_ride_out_a_restart_of_the_head(tmp_path: Path) -> None:
    """`gpupool wait` and `gpupool logs -f` outlive a kill -9 and restart of the head, and a wait begun while
    it is down waits for it: the work goes on running meanwhile, so they try again (saying so once) and end
    as the work ends, with its exit code."""
    server = ServerProcess(home=tmp_path / "home").start()
    gate = tmp_path / "gate"
    try:
        wid = server.submit(
            {
                "commands": [
                    "echo before",
                    f"while [ ! -e {gate} ]; do sleep 0.1; done",
                    "echo after",
                    "exit 4",
                ]
            }
        )["id"]
        server.wait_until(wid, lambda w: w["state"] == "running")
        run = [sys.executable, "-m", "gpupool.main"]
        waiter = subprocess.Popen(
            [*run, "wait", str(wid)],
            env=server.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        follower = subprocess.Popen(
            [*run, "logs", "-f", str(wid)], env=server.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        until_connected(waiter.pid, server.port)
        until_connected(follower.pid, server.port)
        server.kill9()
        late = subprocess.Popen(  # begun while the head is down: its first look waits for the head too
            [*run, "wait", str(wid)], env=server.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        time.sleep(2.5)  # all three find the head gone, and try again
        server.start()
        gate.touch()
        _, waited = waiter.communicate(timeout=60)
        followed, said = follower.communicate(timeout=60)
        _, waited_late = late.communicate(timeout=60)
        assert late.returncode == 4, waited_late
        assert "cannot be reached (restarting?)" in waited_late and "failed with exit code 4" in waited_late
        assert waiter.returncode == 4, waited
        assert "cannot be reached (restarting?)" in waited and "the head answers again" in waited
        assert "failed with exit code 4" in waited
        assert follower.returncode == 0, said
        assert followed == "before\nafter\n"
        assert "cannot be reached (restarting?)" in said and "the head answers again" in said
    finally:
        server.stop()
