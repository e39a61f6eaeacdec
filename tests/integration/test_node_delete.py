"""Retiring a node with `gpupool node delete`, and what `gpupool nodes` says of nodes out of service: a real
head, real agents, the real CLI."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.agent import LOSS_LEASE, AgentProcess, join_token, start_pool
from tests.support.server import ServerProcess


def _until(what: str, found: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.time() + timeout
    while not (value := found()):
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)
    return value


def _latest_node_event(server: ServerProcess, name: str) -> dict[str, Any]:
    listed = server.cli("audit", "--kind", "node", "--object", name, "--json", check=True).stdout
    return dict(json.loads(listed)[0])  # newest first


def test_a_retired_node_is_deleted_its_agent_is_refused_and_the_work_that_ran_there_keeps_its_history(
    tmp_path: Path,
) -> None:
    pool = start_pool(tmp_path, 2)
    server = pool.server
    try:
        ran = server.submit(
            {"resources": {"gpu": 1}, "placement": {"nodes": ["agent-1"]}, "commands": ["echo done"]}
        )
        assert server.wait_for(ran["id"])["state"] == "succeeded"
        refused = server.cli("node", "delete", "agent-1")
        assert refused.returncode == 1 and "node agent-1 is ready: " in refused.stderr, refused.stderr
        assert "`gpupool node drain agent-1`" in refused.stderr
        alice = json.loads(server.cli("token", "create", "alice", "--json", check=True).stdout)["token"]
        with server.http(alice) as client:  # only an admin deletes a node
            assert client.delete("/api/v1/nodes/agent-1").status_code == 403

        pinned = server.submit(
            {"resources": {"gpu": 1}, "placement": {"nodes": ["agent-1"]}, "commands": ["sleep 300"]}
        )
        server.wait_for(pinned["id"], states=("running",))
        server.cli("node", "cordon", "agent-1", "--reason", "retired", check=True)
        busy = server.cli("node", "delete", "agent-1")
        assert busy.returncode == 1 and f"node agent-1 still runs workload(s) {pinned['id']}" in busy.stderr
        server.cli("node", "drain", "agent-1", check=True)
        _until("agent-1 drained", lambda: pool.nodes()["agent-1"].get("drained"))

        deleted = server.cli("node", "delete", "agent-1", check=True)

        assert deleted.stdout.strip() == "node agent-1 deleted; its agent must join again with a join token"
        assert f"warning: pending workload(s) {pinned['id']} may run only on agent-1" in deleted.stderr
        assert list(pool.nodes()) == ["agent-0"]
        assert "agent-1" not in server.cli("nodes", check=True).stdout
        event = _latest_node_event(server, "agent-1")
        assert (event["actor"], event["change"]) == (
            "admin",
            "deleted: it was draining (drained by admin); 1 GPU(s) H100; its node credential is void",
        )
        # Its agent, still running, is refused at its next heartbeat and exits.
        agent = pool.agent("agent-1")
        assert agent.proc is not None and agent.proc.wait(timeout=20) != 0
        assert "event=credential_refused" in agent.log() and "--join-token" in agent.log()

        # What ran there keeps the node's name; what waits for it says it is gone.
        shown = server.cli("show", str(ran["id"]), check=True).stdout
        assert "agent-1" in shown
        why = server.cli("why", str(pinned["id"]), check=True).stdout
        assert "agent-1 is not in the pool" in why, why
        assert "agent-1" in server.cli("usage", "--by", "node", check=True).stdout
        with server.http() as client:
            assert 'Hostname="agent-1"' not in client.get("/metrics").text
            assert client.get("/api/v1/health/agent-1").status_code == 404
            assert "agent-1" not in client.get("/api/v1/health").json()

        # Started again with its credential alone, it is refused and told how to join.
        again = AgentProcess(server, "agent-1", agent.state_dir, None).start()
        pool.agents.append(again)
        assert again.proc is not None and again.proc.wait(timeout=20) != 0
        assert "node 'agent-1' was deleted from the pool by admin at " in again.log()
        assert "start the agent with a new --join-token" in again.log()
        # With a join token it joins as a new node, and the work waiting for it runs there.
        back = AgentProcess(server, "agent-1", agent.state_dir, join_token(server)).start()
        pool.agents.append(back)
        pool.wait_for_nodes(["agent-1"])
        assert server.wait_for(pinned["id"], states=("running",))["node"] == "agent-1"
        server.cli("cancel", str(pinned["id"]), check=True)
    finally:
        pool.stop()


def _row(table: str, name: str) -> str:
    return next(line for line in table.splitlines() if line.split() and line.split()[0] == name)


def test_nodes_shows_why_a_node_takes_no_work_and_when_its_agent_was_last_heard_across_a_head_restart(
    tmp_path: Path,
) -> None:
    pool = start_pool(tmp_path, 3, lease=LOSS_LEASE)
    server = pool.server
    try:
        server.cli("node", "cordon", "agent-0", "--reason", "bad fan; replace on Monday", check=True)
        pool.agent("agent-2").kill9()
        pool.wait_for_nodes(["agent-2"], state="lost")

        table = server.cli("nodes", check=True).stdout
        header = table.splitlines()[0].split()
        assert header[-3:] == ["LAST", "SEEN", "REASON"], header
        assert re.search(r" agent-0 +cordoned +\S+ .* \d+s +bad fan +$", _row(table, "agent-0")), table
        assert re.search(r" agent-1 +ready +.* 0% +\d+s +- +$", _row(table, "agent-1")), table
        # lost: no utilization now, heard from more than a lease ago, and why
        lost = r" agent-2 +lost +unknown +1 +H100 +0/1 +\S+ +\S+ +- +(\d+)s +agent: no heartbeat within the"
        found = re.search(lost, _row(table, "agent-2"))
        assert found and int(found.group(1)) >= 6, table
        assert _latest_node_event(server, "agent-2")["actor"] == "control"  # the head decided it

        # agent-1 dies while the head is down: the restarted head waits a lease for it, then says so.
        pool.agent("agent-1").kill9()
        server.stop()
        server.start()
        pool.wait_for_nodes(["agent-1"], state="lost")
        node = pool.nodes()["agent-1"]
        assert re.fullmatch(
            r"agent: no heartbeat since the head started; last heartbeat "
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, before the restart",
            node["state_reason"],
        ), node
        event = _latest_node_event(server, "agent-1")
        assert (event["from"], event["to"], event["actor"]) == ("ready", "lost", "control")
        table = server.cli("nodes", check=True).stdout
        assert _row(table, "agent-1").rstrip().endswith("agent: no heartbeat since the head started"), table
        assert pool.nodes()["agent-0"]["state"] == "cordoned"  # back, and still the operator's cordon
    finally:
        pool.stop()
