"""The agent's state dir on a full or broken disk: the agent goes on, and what it cannot start is its
node's failure, not the work's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.agent.daemon import Agent, AgentSettings


def _answer(version: int, launch: dict[str, Any]) -> dict[str, Any]:
    return {
        "attempts": [{"attempt_id": 3, "rank": 0, "token": "tok", "signal": 0, "launch": launch}],
        "version": version,
    }


def test_a_rank_its_node_cannot_start_for_its_disk_is_reported_as_the_node_s_failure(tmp_path: Path) -> None:
    """A full or broken disk under the agent's state dir: the rank cannot start, which is its node's fault
    (the head requeues it as after a node failure), and the agent goes on answering."""
    agent = Agent(
        AgentSettings(servers=("http://127.0.0.1:9",), state_dir=tmp_path / "state", name="n0"), None
    )
    (agent.attempts.root / "3.0").write_text("in the way")  # the rank's run dir cannot be made
    launch = {"workload_id": 1, "attempt_number": 0, "script": "true\n", "env": {}, "workdir": str(tmp_path)}
    try:
        assert agent.take_answer(_answer(1, launch))
        (reported,), _ = agent.attempts.report()
        assert reported["state"] == "exited" and reported["exit_code"] == 127, reported
        assert reported["cause"] == "node-failure", reported
        assert "the agent cannot write its state dir" in reported["detail"], reported
    finally:
        agent.attempts.stop_all("the test is over")
        agent.close()


def test_a_rendezvous_port_another_program_holds_is_the_node_s_failure(tmp_path: Path) -> None:
    """Rank 0 of a gang cannot listen on MASTER_PORT: the node's fault, not the work's, so the default retry
    policy (node failures) tries it again with the next port; it failed the job outright (exit 127)."""
    import socket

    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        agent = Agent(
            AgentSettings(servers=("http://127.0.0.1:9",), state_dir=tmp_path / "state", name="n0"), None
        )
        env = {"GPUPOOL_NUM_NODES": "2", "MASTER_PORT": str(port)}
        launch = {
            "workload_id": 1,
            "attempt_number": 0,
            "script": "true\n",
            "env": env,
            "workdir": str(tmp_path),
        }
        try:
            assert agent.take_answer(_answer(1, launch))
            (reported,), _ = agent.attempts.report()
            assert reported["exit_code"] == 127 and reported["cause"] == "node-failure", reported
            assert f"rendezvous port {port} (MASTER_PORT) is in use on this node" in reported["detail"]
            assert (
                agent.attempts.root / "3.0" / "cause"
            ).read_text() == "node-failure"  # kept across a restart
        finally:
            agent.attempts.stop_all("the test is over")
            agent.close()
