"""The head asks an agent's rank to stop with SIGTERM, then SIGKILL once its grace period is over; the
agent must send each, in that order, though SIGKILL's number (9) is lower than SIGTERM's (15)."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Any

from gpupool.agent.daemon import Agent, AgentSettings

IGNORES_SIGTERM = """
import signal, sys, time
marks = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: open(marks, "a").write("ignored\\n"))
open(marks, "a").write("started\\n")
while True:
    time.sleep(0.1)
"""


def _answer(version: int, signal: int, launch: dict[str, Any] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"attempt_id": 3, "rank": 0, "token": "tok", "signal": signal}
    if launch is not None:
        entry["launch"] = launch
    return {"attempts": [entry], "version": version}


def _until(check: Any, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds  # a bound on a shell starting or dying, not a timing assertion
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return bool(check())


def test_sigkill_after_sigterm_reaches_a_rank_that_ignores_sigterm(tmp_path: Path) -> None:
    agent = Agent(
        AgentSettings(servers=("http://127.0.0.1:9",), state_dir=tmp_path / "state", name="n0"), None
    )
    marks = tmp_path / "marks"
    launch = {
        "workload_id": 1,
        "attempt_number": 0,
        "script": f"exec {sys.executable} -c {shlex.quote(IGNORES_SIGTERM)} {marks}\n",
        "env": {"GPUPOOL_ATTEMPT": "0"},
        "workdir": str(tmp_path),
    }

    def lines() -> list[str]:
        return marks.read_text().split() if marks.exists() else []

    def running() -> int:
        agent.attempts.report()  # what the agent tells the head: it sees the exits first
        return agent.attempts.running_count()

    try:
        assert agent.take_answer(_answer(1, 0, launch))
        assert _until(lambda: lines() == ["started"])
        assert agent.take_answer(_answer(2, 15))
        assert _until(lambda: "ignored" in lines())
        assert running() == 1  # it ignored SIGTERM
        assert agent.take_answer(_answer(3, 9))  # the grace period is over
        assert _until(lambda: running() == 0), "SIGKILL did not reach the rank"
        assert agent.take_answer(_answer(4, 15))  # nothing after SIGKILL, and no error
        assert lines().count("ignored") == 1
    finally:
        agent.attempts.stop_all("the test is over")
        agent.close()
