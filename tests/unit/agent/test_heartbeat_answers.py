"""The agent sends two heartbeats at once (its long-poll, and a report when a process ends); their answers
can come back in either order, and only the newer one the head wrote decides what runs on the node."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpupool.agent.daemon import Agent, AgentSettings


def _head_answer(agent: Agent, version: int, launch: dict[str, Any] | None) -> dict[str, Any]:
    """What the head answers when it lists attempt 7's rank 0 on this node: the launch goes only with a
    rank the agent does not report yet (backends/agent.py, AgentBackend.desired)."""
    reported, _ = agent.attempts.report()
    entry: dict[str, Any] = {"attempt_id": 7, "rank": 0, "token": "tok", "signal": 0}
    if launch is not None and not any((a["attempt_id"], a["rank"]) == (7, 0) for a in reported):
        entry["launch"] = launch
    return {"attempts": [entry], "version": version}


def _starts(marks: Path, at_least: int) -> list[str]:
    deadline = time.monotonic() + 20  # a bound on a shell starting, not a timing assertion
    while time.monotonic() < deadline:
        lines = marks.read_text().split() if marks.exists() else []
        if len(lines) >= at_least:
            return lines
        time.sleep(0.05)
    return marks.read_text().split() if marks.exists() else []


def test_an_answer_older_than_one_applied_neither_stops_nor_restarts_a_rank(tmp_path: Path) -> None:
    agent = Agent(
        AgentSettings(servers=("http://127.0.0.1:9",), state_dir=tmp_path / "state", name="n0"), None
    )
    marks = tmp_path / "marks"
    launch = {
        "workload_id": 1,
        "attempt_number": 1,
        "script": f"echo started >> {marks}\nsleep 60\n",
        "env": {"GPUPOOL_ATTEMPT": "1"},
        "workdir": str(tmp_path),
    }
    try:
        # The exit report's answer was written at version 4, before the attempt was offered; the long-poll's
        # at version 5, with the attempt. The long-poll's is applied first.
        written_first = {"attempts": [], "version": 4}
        assert agent.take_answer(_head_answer(agent, 5, launch))
        assert _starts(marks, 1) == ["started"]
        taken = agent.take_answer(written_first)
        assert agent.attempts.running_count() == 1, "the rank the older answer predates still runs"
        assert not taken, "an answer older than one applied is ignored"
        assert agent.take_answer(_head_answer(agent, 5, launch))  # the next heartbeat: no launch
        assert agent.attempts.running_count() == 1
        assert marks.read_text().split() == ["started"], "rank 0 of the attempt ran once"

        assert agent.take_answer({"attempts": [], "version": 6})  # the head settled the attempt
        assert agent.attempts.running_count() == 0
        assert agent.take_answer({"attempts": []}), "a head that sends no version is always followed"
    finally:
        agent.attempts.stop_all("the test is over")
        agent.close()


def test_the_agent_makes_the_checkpoint_dir_on_its_node_before_the_rank_starts(tmp_path: Path) -> None:
    """The head makes GPUPOOL_CHECKPOINT_DIR on its own filesystem; a node that does not share it (the
    default is under the head's home) ran the job without it, which failed writing its first checkpoint."""
    agent = Agent(
        AgentSettings(servers=("http://127.0.0.1:9",), state_dir=tmp_path / "state", name="n0"), None
    )
    checkpoints = tmp_path / "node-only" / "checkpoints" / "1"
    marks = tmp_path / "marks"
    launch = {
        "workload_id": 1,
        "attempt_number": 0,
        "script": f'test -d "$GPUPOOL_CHECKPOINT_DIR" && echo there >> {marks}\nsleep 60\n',
        "env": {"GPUPOOL_ATTEMPT": "0", "GPUPOOL_CHECKPOINT_DIR": str(checkpoints)},
        "workdir": str(tmp_path),
    }
    try:
        assert agent.take_answer(_head_answer(agent, 1, launch))
        assert _starts(marks, 1) == ["there"]
    finally:
        agent.attempts.stop_all("the test is over")


def test_a_rank_gets_the_agents_environment_without_its_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's own tokens and passwords (and gpupool's settings) stay the agent's; what the launch
    gives (the spec's env, the user's own HF_TOKEN) arrives."""
    monkeypatch.setenv("VAULT_TOKEN", "the agent's")
    monkeypatch.setenv("PGPASSWORD", "the agent's")
    monkeypatch.setenv("GPUPOOL_JOIN_TOKEN", "the agent's")
    monkeypatch.setenv("AGENT_SITE", "kept")
    agent = Agent(
        AgentSettings(servers=("http://127.0.0.1:9",), state_dir=tmp_path / "state", name="n0"), None
    )
    seen = tmp_path / "seen"
    launch = {
        "workload_id": 1,
        "attempt_number": 0,
        "script": f"env > {seen}.tmp && mv {seen}.tmp {seen}\n",
        "env": {"GPUPOOL_ATTEMPT": "0", "HF_TOKEN": "the user's"},
        "workdir": str(tmp_path),
    }
    try:
        assert agent.take_answer(_head_answer(agent, 1, launch))
        deadline = time.monotonic() + 20  # a bound on a shell starting, not a timing assertion
        while not seen.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    finally:
        agent.attempts.stop_all("the test is over")
    assert env["AGENT_SITE"] == "kept" and env["HF_TOKEN"] == "the user's" and env["GPUPOOL_ATTEMPT"] == "0"
    assert not {"VAULT_TOKEN", "PGPASSWORD", "GPUPOOL_JOIN_TOKEN"} & set(env), sorted(env)
