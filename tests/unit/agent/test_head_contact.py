"""What the agent says about its head: an outage in a few lines (not one a second), an orphan grace shorter
than the head's node lease, the clock its reports were sent at, and what runs on when it stops."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.agent.daemon import Agent, AgentSettings, Outage


def _lines(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"event={event}" in r.getMessage()]


def test_a_ten_minute_outage_of_the_head_takes_a_dozen_lines_not_six_hundred(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    outage = Outage("gpu-07", clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="gpupool.agent")
    for second in range(600):  # a failed heartbeat every second
        now[0] = float(second)
        outage.failed("heartbeat_failed", "http://head:8470", "[Errno 111] Connection refused")
    failed = _lines(caplog, "heartbeat_failed")
    assert 10 <= len(failed) <= 11, failed  # the first failure, then one a minute
    assert "node=gpu-07" in failed[0] and "Connection refused" in failed[0]
    assert "failing_for=60s failures=61" in failed[1], failed
    now[0] = 601.5
    outage.answered()
    outage.answered()  # later answers say nothing
    (back,) = _lines(caplog, "head_reachable_again")
    assert back == "event=head_reachable_again node=gpu-07 after=601.5s failures=600"
    outage.failed("heartbeat_failed", "http://head:8470", "timed out")  # a new outage is said at once
    assert len(_lines(caplog, "heartbeat_failed")) == len(failed) + 1


class Head:
    """A head as the agent sees it over HTTP (httpx.MockTransport): registration, and heartbeats answered
    with what should run here."""

    def __init__(self, lease: float = 10.0, attempts: list[dict[str, Any]] | None = None) -> None:
        self.lease, self.attempts = lease, attempts or []
        self.heartbeats: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/register"):
            return httpx.Response(200, json={"credential": "cred", "interval": 0.05, "lease": self.lease})
        self.heartbeats.append(json.loads(request.content))
        return httpx.Response(200, json={"attempts": self.attempts, "version": len(self.heartbeats)})


def _agent(tmp_path: Path, head: Head, orphan_grace: float = 60.0) -> Agent:
    settings = AgentSettings(
        servers=("http://head",), state_dir=tmp_path / "state", name="gpu-07", orphan_grace=orphan_grace
    )
    agent = Agent(settings, None)
    client = httpx.Client(base_url="http://head", transport=httpx.MockTransport(head))
    agent._http = agent._report_http = client
    return agent


def _until(check: Callable[[], bool], seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds  # a bound on a shell starting, not a timing assertion
    while time.monotonic() < deadline and not check():
        time.sleep(0.05)
    return check()


def test_an_orphan_grace_shorter_than_the_head_s_node_lease_is_said_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpupool.agent")
    short = _agent(tmp_path / "short", Head(lease=10.0), orphan_grace=5.0)
    short.register()
    short.register()  # a head restart: said once
    (said,) = _lines(caplog, "orphan_grace_below_lease")
    assert "--orphan-grace 5s is shorter than the head's node lease of 10s: " in said, said
    assert "e.g. --orphan-grace 60s" in said
    caplog.clear()
    _agent(tmp_path / "long", Head(lease=10.0), orphan_grace=60.0).register()
    assert not _lines(caplog, "orphan_grace_below_lease")


def test_a_heartbeat_says_when_the_agent_sent_it_by_its_own_clock(tmp_path: Path) -> None:
    """The head measures the node's clock against its own by it (it keeps GPU samples on its clock)."""
    head = Head()
    agent = _agent(tmp_path, head)
    agent.register()
    before = time.time()
    agent._heartbeat(agent._http, 0.0)
    (sent,) = head.heartbeats
    assert before <= sent["sent_at"] <= time.time(), sent


def test_a_stopped_agent_says_how_many_ranks_run_on_and_leaves_them_running(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpupool.agent")
    pid_file = tmp_path / "pid"
    launch = {
        "workload_id": 1,
        "attempt_number": 0,
        "script": f"echo $$ > {pid_file}; exec sleep 60\n",
        "env": {},
        "workdir": str(tmp_path),
    }
    head = Head(attempts=[{"attempt_id": 3, "rank": 0, "token": "tok", "signal": 0, "launch": launch}])
    agent = _agent(tmp_path, head)
    runner = threading.Thread(target=agent.run)
    runner.start()
    try:
        assert _until(lambda: pid_file.exists() and pid_file.read_text().strip() != ""), "no rank started"
        pid = int(pid_file.read_text())
        agent.stop("SIGTERM")
        runner.join(10)
        assert not runner.is_alive()
        (stopping,) = _lines(caplog, "agent_stopping")
        assert stopping.startswith("event=agent_stopping node=gpu-07 by=SIGTERM running_ranks=1: they run on")
        os.kill(pid, 0)  # still running: an agent restart must not stop work
    finally:
        agent.stop()
        runner.join(10)
        agent.attempts.stop_all("the test is over")
        agent.close()


def test_the_state_dir_and_the_fencing_tokens_in_it_are_the_agent_user_s_only(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)  # as made by hand, or by an agent before 2026-12
    agent = Agent(AgentSettings(servers=("http://127.0.0.1:9",), state_dir=state, name="gpu-07"), None)
    launch = {"workload_id": 1, "attempt_number": 0, "script": "true\n", "env": {}, "workdir": str(tmp_path)}
    try:
        assert state.stat().st_mode & 0o777 == 0o700
        agent.take_answer({"attempts": [{"attempt_id": 3, "rank": 0, "token": "tok", "launch": launch}]})
        rank = agent.attempts.root / "3.0" / "rank.json"
        assert json.loads(rank.read_text())["token"] == "tok"
        assert rank.stat().st_mode & 0o777 == 0o600
    finally:
        agent.attempts.stop_all("the test is over")
        agent.close()


def test_an_orphan_grace_of_zero_is_refused(tmp_path: Path) -> None:
    argv = ["agent", "--server", "http://127.0.0.1:9", "--gpus", "none", "--orphan-grace", "0s"]
    env = {"GPUPOOL_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.main", *argv], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1, out
    assert out.stderr.startswith("error: --orphan-grace 0s: must be longer than 0"), out.stderr
    assert not (tmp_path / "agent").exists()


def test_sigterm_is_said_in_the_log_by_the_agent_process(tmp_path: Path) -> None:
    """`gpupool agent` stops on SIGTERM through the agent (it died silently before), with no head reached."""
    log = tmp_path / "agent.log"
    argv = ["agent", "--server", "http://127.0.0.1:9", "--gpus", "none", "--state-dir", str(tmp_path / "s")]
    env = {"GPUPOOL_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpupool.main", *argv], env=env, stderr=out)
    try:
        assert _until(lambda: "event=head_unreachable" in log.read_text()), log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "event=agent_stopping node=" in text and "by=SIGTERM running_ranks=0" in text, text
    assert text.count("event=head_unreachable") == 1, text
