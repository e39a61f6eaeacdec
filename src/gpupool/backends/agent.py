"""Run attempts on remote nodes through their agents, which dial in to the head (docs/agents.md).

The head never connects to a node. Each agent long-polls the head (`POST /api/v1/agents/heartbeat`),
reporting what it runs (per attempt and rank: running, exited with a code, vanished), shipping its logs
and GPU samples; the answer is the node's desired state: every attempt rank the head wants running there,
with its fencing token, a signal level, and the launch itself when the agent does not know it yet. The
agent starts what is listed and kills at once whatever is not (fencing). The answer also lists the head's
instructions for the node (run the active health checks, inject a fault) until the agent's reply comes back
on a heartbeat (`ask`; the agent's side is health/node_tasks.py). Everything is level-triggered:
a lost answer, an agent restart or a head restart is repaired by the next heartbeat.

This backend keeps that desired state. It is durable where it must be: each attempt's launch is written
to RUN_DIR/launch.json before it is offered to any agent, each rank's exit status to RUN_DIR/rank-R.exit_code
as it is reported, the signal level to RUN_DIR/signal, and logs straight into the attempt's log files; so
a restarted head rebuilds it from the run dirs of the attempts its store says are running.

A node whose agent sent no heartbeat for the node lease is `lost` (the inventory says so, and its
attempts end as `node-lost` node failures, which the retry policy may restart elsewhere). The lease counts
only while the head listens: the API's event loop ticks `listening()`, and time the head itself stood
still (a stopped process, a long pause) is not held against the agents, whose heartbeats wait unread.

`AgentBackend` (this file: the Backend interface, the inventory and the node lease) is built on
`AgentHeartbeats` (backends/agent_heartbeats.py: the backend's state; registrations, heartbeats, long-polls,
instructions); the records it keeps and their files on disk are in backends/agent_records.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal as signals
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpupool.backends.agent_heartbeats import AgentHeartbeats
from gpupool.backends.agent_records import (
    DEFAULT_RENDEZVOUS_PORTS,
    AgentAttempt,
    AgentNode,
    Rank,
    write_atomic,
)
from gpupool.backends.base import (
    Handle,
    Inventory,
    InventoryNode,
    Launch,
    LaunchError,
    Phase,
    Status,
)

log = logging.getLogger("gpupool.agents")

# The store's `last_heartbeat` of each node is refreshed this often (in one bulk update); leases are
# decided in memory from every heartbeat.
HEARTBEAT_STORE_INTERVAL = 5.0
LISTEN_TICK = 0.25  # seconds between the API event loop's ticks of `listening()`
# A gap in those ticks longer than this is time the head did not listen: the lease does not count it.
DEAF_GAP = 1.0
LOG_CHUNK_MAX = 256 * 1024  # bytes of one rank's log per heartbeat
# Variables that always travel with a launch (the job contract), even when the head's own value is equal.
CONTRACT_PREFIXES = ("GPUPOOL_", "MASTER_", "NNODES", "NODE_RANK", "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED")


class AgentBackend(AgentHeartbeats):
    """The agent backend: see the module's docstring."""

    name = "agent"

    # -- the Backend interface (called by the reconcile loop) --------------------------------------------

    def start(self, launch: Launch) -> Handle:
        pods = launch.pods
        if not pods:
            raise LaunchError("the agent backend needs the scheduler's placement (Launch.pods)")
        with self._lock:
            addresses = [self._nodes[p.node].address if p.node in self._nodes else p.node for p in pods]
            port = self._rendezvous_port(pods[0].node)
            # a service listens on a port of its own (MASTER_PORT stays free for its ranks' rendezvous)
            service_port = self._rendezvous_port(pods[0].node, also_held={port}) if launch.service_port else 0
        head_env = os.environ
        overlay = {
            k: v for k, v in launch.env.items() if head_env.get(k) != v or k.startswith(CONTRACT_PREFIXES)
        }
        launches = []
        for rank, pod in enumerate(pods):
            env = dict(overlay)
            env.update(
                {
                    "GPUPOOL_NUM_NODES": str(len(pods)),
                    "NNODES": str(len(pods)),
                    "GPUPOOL_NODE_RANK": str(rank),
                    "NODE_RANK": str(rank),
                    "GPUPOOL_GPUS_PER_NODE": str(len(pod.gpu_indices)),
                    "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in pod.gpu_indices),
                    "GPUPOOL_MASTER_ADDR": addresses[0],
                    "MASTER_ADDR": addresses[0],
                    "GPUPOOL_MASTER_PORT": str(port),
                    "MASTER_PORT": str(port),
                    "GPUPOOL_NODE_IPS": ",".join(addresses),
                }
            )
            if service_port:
                env["GPUPOOL_PORT"] = str(service_port)
            launches.append(
                {
                    "workload_id": launch.workload_id,
                    "attempt_number": launch.attempt_number,
                    "script": launch.script,
                    "env": env,
                    "workdir": str(launch.workdir),
                }
            )
        record = {
            "attempt_id": launch.attempt_id,
            "token": launch.fencing_token or secrets.token_hex(16),
            "log_path": str(launch.log_path),
            "master_port": port,
            "service_port": service_port,
            "grace_period": launch.grace_period,
            "pods": [
                {"node": p.node, "gpu_indices": list(p.gpu_indices), "gpu_fraction": p.gpu_fraction}
                for p in pods
            ],
            "launches": launches,
        }
        launch.run_dir.mkdir(parents=True, exist_ok=True)
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(launch.run_dir / "launch.json", json.dumps(record))
        self._adopt(launch.run_dir, record)
        log.info(
            "event=agent_attempt_offered attempt=%d workload=%d nodes=%s",
            launch.attempt_id, launch.workload_id, ",".join(p.node for p in pods),
        )  # fmt: skip
        return Handle(launch.attempt_id, 0.0, f"{addresses[0]}:{service_port}" if service_port else "")

    def _adopt(self, run_dir: Path, record: dict[str, Any]) -> AgentAttempt:
        ranks = []
        for rank, pod in enumerate(record["pods"]):
            item = Rank(
                str(pod["node"]), tuple(int(i) for i in pod["gpu_indices"]), float(pod["gpu_fraction"])
            )
            code = _read(run_dir / f"rank-{rank}.exit_code")
            if code is not None and code.lstrip("-").isdigit():
                item.exit_code = int(code)
                why = _read(run_dir / f"rank-{rank}.why")
                if why is not None:
                    with contextlib.suppress(ValueError, TypeError, AttributeError):
                        said = json.loads(why)
                        item.detail, item.cause = str(said["detail"]), str(said["cause"])
                        item.ended_at = float(said["ended_at"]) if said.get("ended_at") else None
            vanished = _read(run_dir / f"rank-{rank}.vanished")
            if vanished is not None:
                item.vanished, item.detail = True, vanished
            ranks.append(item)
        level = _read(run_dir / "signal")
        attempt = AgentAttempt(
            attempt_id=int(record["attempt_id"]),
            token=str(record["token"]),
            run_dir=run_dir,
            log_path=Path(record["log_path"]),
            launches=list(record["launches"]),
            ranks=ranks,
            signal=int(level) if level and level.isdigit() else 0,
            master_port=int(record.get("master_port") or 0),
            service_port=int(record.get("service_port") or 0),
            grace_period=float(record.get("grace_period", 30.0)),
        )
        ended = _read(run_dir / "gang_end.json")
        if ended is not None:  # its other ranks were being stopped when the head stopped: go on with that
            attempt.gang_end = json.loads(ended)
        with self._lock:
            self._attempts[attempt.attempt_id] = attempt
            names = {r.node for r in ranks}
            for node in names:
                self._by_node.setdefault(node, set()).add(attempt.attempt_id)
            self._bump(names)
        return attempt

    def _rendezvous_port(self, name: str, also_held: frozenset[int] | set[int] = frozenset()) -> int:
        """A port of node `name`'s rendezvous range that no attempt listed here holds (as its MASTER_PORT or
        a service's GPUPOOL_PORT) and that is not in `also_held`, taken in turn (so a retried gang gets
        another one); lock held by the caller."""
        node = self._nodes.get(name)
        low, high = node.ports if node is not None else DEFAULT_RENDEZVOUS_PORTS
        held = set(also_held)
        for a in self._attempts.values():
            if a.ranks and a.ranks[0].node == name:
                held.add(a.master_port)
                held.add(a.service_port)
        span = high - low + 1
        first = self._next_port.get(name, low)
        for step in range(span):
            port = low + (first - low + step) % span
            if port not in held:
                self._next_port[name] = port + 1
                return port
        raise LaunchError(
            f"no free rendezvous port on node {name}: all {span} ports of its range {low}-{high} are held "
            "by running attempts; start its agent with a wider --rendezvous-ports"
        )

    def _get(self, handle: Handle, run_dir: Path) -> AgentAttempt | None:
        with self._lock:
            attempt = self._attempts.get(handle.pid)
        if attempt is not None:
            return attempt
        text = _read(run_dir / "launch.json")
        if text is None:
            return None
        return self._adopt(run_dir, json.loads(text))

    def status(self, handle: Handle, run_dir: Path) -> Status:
        attempt = self._get(handle, run_dir)
        if attempt is None:
            return Status(Phase.VANISHED, detail=f"no launch record in {run_dir}")
        ended = self._ended(attempt)
        if ended.phase is Phase.RUNNING:
            return ended
        if ended.phase is Phase.EXITED and ended.exit_code == 0:
            return _when(ended, attempt)
        lost = self._lost_nodes()
        running = [
            r
            for r, p in enumerate(attempt.ranks)
            if p.exit_code is None and not p.vanished and p.node not in lost
        ]
        if not running:
            first = attempt.gang_end
            if first is None:
                return _when(ended, attempt)
            gang = Status(Phase(first["phase"]), first["code"], detail=first["detail"], cause=first["cause"])
            return _when(gang, attempt)
        return self._stop_the_rest(attempt, ended, running)

    def _stop_the_rest(self, attempt: AgentAttempt, ended: Status, running: list[int]) -> Status:
        """One rank of a gang ended early (failed, vanished, its node lost) while others run: they get
        SIGTERM and the grace period to checkpoint, then SIGKILL, as `cancel` stops work, and the attempt
        ends with that first end once they have (dropping it at once SIGKILLed them with no warning, and a
        job that saves on SIGTERM lost its work). While a stop asked by control is under way (cancel, hold,
        an eviction), control's own grace and SIGKILL apply; the attempt ends when the last rank has."""
        if attempt.gang_end is None:
            attempt.gang_end = {"phase": ended.phase.value, "code": ended.exit_code, "detail": ended.detail,
                                "cause": ended.cause}  # fmt: skip
            write_atomic(attempt.run_dir / "gang_end.json", json.dumps(attempt.gang_end))
        handle = Handle(attempt.attempt_id, 0.0)
        now = self._clock()
        if attempt.signal == 0:
            attempt.stopping_since = now
            self.signal(handle, signals.SIGTERM)
            log.info("event=gang_stopping attempt=%d ranks=%s cause=%r", attempt.attempt_id, running,
                     ended.detail)  # fmt: skip
        elif attempt.stopping_since and now - attempt.stopping_since >= attempt.grace_period:
            self.signal(handle, signals.SIGKILL)
        if not attempt.stopping_since and attempt.signal == signals.SIGTERM:
            attempt.stopping_since = now  # a stop this did not start (control's, one before a restart)
        which = ", ".join(str(r) for r in running)
        said = (
            f"{attempt.gang_end['detail']}; stopping rank(s) {which} (SIGTERM, SIGKILL after "
            f"{attempt.grace_period:g}s)"
        )
        return Status(Phase.RUNNING, detail=said, ending=said)

    def _ended(self, attempt: AgentAttempt) -> Status:
        """The attempt's state from its ranks alone: its first failure or vanishing, a lost node, success
        once every rank exited 0, else running."""
        ranks = attempt.ranks
        failed = [(r, p) for r, p in enumerate(ranks) if p.exit_code not in (None, 0)]
        if failed:
            rank, pod = failed[0]
            detail = f"rank {rank} on {pod.node} exited with code {pod.exit_code}" + (
                f": {pod.detail}" if pod.detail else ""
            )
            return Status(Phase.EXITED, pod.exit_code, detail=detail, cause=pod.cause)
        if all(p.exit_code == 0 for p in ranks):
            return Status(Phase.EXITED, 0, detail=f"{len(ranks)} rank(s) exited with code 0")
        gone = [(r, p) for r, p in enumerate(ranks) if p.vanished]
        if gone:
            rank, pod = gone[0]
            return Status(Phase.VANISHED, detail=f"rank {rank} on {pod.node}: {pod.detail}")
        lost = self._lost_nodes()
        for rank, pod in enumerate(ranks):
            if pod.node in lost:
                return Status(
                    Phase.VANISHED,
                    detail=f"node-lost: rank {rank}'s node {pod.node} sent no heartbeat for "
                    f"{lost[pod.node]:.1f}s (node lease {self.lease:g}s)",
                    cause="node-failure",
                )
        where = ",".join(p.node for p in ranks)
        waiting = "" if all(p.seen for p in ranks) else " (not yet picked up by every agent)"
        return Status(Phase.RUNNING, detail=f"on agents {where}{waiting}")

    def signal(self, handle: Handle, signum: int) -> None:
        with self._lock:
            attempt = self._attempts.get(handle.pid)
            if attempt is None or attempt.signal == signals.SIGKILL or attempt.signal == signum:
                return
            attempt.signal = signum
            self._bump({r.node for r in attempt.ranks})
        write_atomic(attempt.run_dir / "signal", f"{signum}\n")
        log.info("event=agent_signal attempt=%d signal=%d", handle.pid, signum)

    def find(self, run_dir: Path) -> Handle | None:
        text = _read(run_dir / "launch.json")
        if text is None:
            return None
        return Handle(int(json.loads(text)["attempt_id"]), 0.0)

    def cleanup(self, handle: Handle) -> None:
        """The attempt is settled: no agent may run it any more (they kill what is left of it)."""
        with self._lock:
            attempt = self._attempts.pop(handle.pid, None)
            if attempt is None:
                return
            names = {r.node for r in attempt.ranks}
            for name in names:
                self._by_node.get(name, set()).discard(handle.pid)
            self._bump(names)

    def inventory(self) -> Inventory | None:
        """The agents' nodes; None during the first lease after a start, until every agent node the store
        knew has registered again (until then the store's view of them stands)."""
        now = self._clock()
        if now - self._started < self.lease:
            with self._lock:
                if not self._known <= set(self._nodes):
                    return None
        lost = self._lost_nodes()
        with self._lock:
            # Rebuilt only when a node registered, or was lost or came back (each reconcile pass asks).
            key = (self._registrations, frozenset(name for name in lost if name in self._nodes))
            if self._inventory is not None and key == self._inventory_key:
                nodes = self._inventory.nodes
            else:
                nodes = self._inventory_nodes(lost)
            self._inventory_key = key
        previous = self._inventory
        if previous is None or previous.nodes != nodes:
            self._inventory = Inventory(nodes, (), (previous.generation + 1) if previous else 1)
        if self._on_heartbeats is not None and now - self._stored_at >= HEARTBEAT_STORE_INTERVAL:
            self._stored_at = now
            wall = time.time()
            with self._lock:
                seen = {n.name: wall - (now - n.last_seen) for n in self._nodes.values()}
            self._on_heartbeats(seen)
        return self._inventory

    def _inventory_nodes(self, lost: dict[str, float]) -> tuple[InventoryNode, ...]:
        """Every registered node, the lost ones marked so (lock held by the caller)."""
        return tuple(
            self._inventory_node(n, n.name in lost)
            for n in sorted(self._nodes.values(), key=lambda n: n.name)
        )

    def _inventory_node(self, node: AgentNode, lost: bool) -> InventoryNode:
        return InventoryNode(
            name=node.name,
            address=node.address,
            state="lost" if lost else "ready",
            state_reason=f"agent: no heartbeat within the node lease ({self.lease:g}s)" if lost else "",
            cpus=node.cpus,
            memory_bytes=node.memory_bytes,
            gpus=node.gpus,
            labels=node.labels,
            devices=node.devices,
        )

    def still_held(self, name: str) -> str | None:
        """Why the agent that registered `name` still holds it (a join token may not take it over), or
        None once it is lost (silent past the lease; after a head restart, counted from the start) and no
        attempt is listed on it any more (an attempt listed there would be offered to the newcomer)."""
        now = self._clock()
        with self._lock:
            node = self._nodes.get(name)
            silent = now - (node.last_seen if node is not None else self._started)
            listed = len(self._by_node.get(name) or ())
        if silent <= self.lease:
            heard = "its last heartbeat" if node is not None else "the head's start"
            return f"{heard} was {silent:.1f}s ago, within the node lease of {self.lease:g}s"
        if listed:
            return f"{listed} attempt(s) are still listed on it, until the head has moved them"
        return None

    def registered(self, name: str) -> InventoryNode:
        """A node as its agent has just registered it (heard from now: not lost)."""
        with self._lock:
            return self._inventory_node(self._nodes[name], False)

    def listening(self) -> None:
        """A tick of the API's event loop (every LISTEN_TICK): the head reads heartbeats. After a gap in
        the ticks (the head stood still), every node gets the gap back: its heartbeats were waiting."""
        now = self._clock()
        with self._lock:
            last, self._listened = self._listened, now
            gap = now - last if last is not None else 0.0
            if gap <= DEAF_GAP:
                return
            for node in self._nodes.values():  # one heard since the loop ran again is not put ahead of now
                node.last_seen = min(node.last_seen + gap, now)
            self._started = min(self._started + gap, now)
        log.warning("event=head_not_listening seconds=%.1f nodes=%d", gap, len(self._nodes))

    def _lost_nodes(self) -> dict[str, float]:
        """Nodes past their lease, with how long they have been silent. Nodes registered before a head
        restart and not heard from since count from the head's start. While the head itself is not
        listening (no tick of its event loop for DEAF_GAP), the last verdict stands."""
        now = self._clock()
        with self._lock:
            if self._listened is not None and now - self._listened > DEAF_GAP:
                return self._held
            silent = {n.name: now - n.last_seen for n in self._nodes.values()}
            for name in self._by_node:
                if name not in silent and self._by_node[name]:
                    silent[name] = now - self._started
            self._held = {name: age for name, age in silent.items() if age > self.lease}
            return self._held

    def drain_node(self, name: str, reason: str) -> None:
        """gpupool's own node state is the whole truth for agent nodes."""

    def resume_node(self, name: str) -> None:
        """Nothing to undo; see drain_node."""


def _when(ended: Status, attempt: AgentAttempt) -> Status:
    """`ended` with when its last rank ended, where every rank's agent said (work that ended while the head
    was down is charged until then, not until the head heard of it)."""
    times = [p.ended_at for p in attempt.ranks]
    if not times or any(t is None for t in times):
        return ended
    return replace(ended, ended_at=max(t for t in times if t is not None))


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
