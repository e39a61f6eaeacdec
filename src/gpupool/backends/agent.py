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
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import secrets
import signal as signals
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.backends.base import (
    Handle,
    Inventory,
    InventoryGpu,
    InventoryNode,
    Launch,
    LaunchError,
    Phase,
    Status,
)

log = logging.getLogger("gpupool.agents")

HEARTBEAT_INTERVAL = 1.0  # seconds between an agent's heartbeats (the agent's long-poll hold)
# The store's `last_heartbeat` of each node is refreshed this often (in one bulk update); leases are
# decided in memory from every heartbeat.
HEARTBEAT_STORE_INTERVAL = 5.0
LISTEN_TICK = 0.25  # seconds between the API event loop's ticks of `listening()`
# A gap in those ticks longer than this is time the head did not listen: the lease does not count it.
DEAF_GAP = 1.0
LOG_CHUNK_MAX = 256 * 1024  # bytes of one rank's log per heartbeat
# Variables that always travel with a launch (the job contract), even when the head's own value is equal.
CONTRACT_PREFIXES = ("GPUPOOL_", "MASTER_", "NNODES", "NODE_RANK", "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED")
# Ports a node keeps free for the rendezvous of the attempts whose rank 0 it runs (MASTER_PORT), unless its
# agent registers its own range (`gpupool agent --rendezvous-ports`); below Linux's ephemeral ports.
DEFAULT_RENDEZVOUS_PORTS = (29500, 29999)


class BadRegistration(ValueError):
    """An agent's registration describes its node in a way the head cannot use."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def parse_devices(raw: Any) -> tuple[InventoryGpu, ...]:
    """The node's GPUs device by device, as the agent registers them (`GpuDevice.to_dict()` plus `kind`)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise BadRegistration("info.devices", "must be a list of GPUs, each {index, uuid, kind, ...}")
    devices = []
    for i, item in enumerate(raw):
        try:
            devices.append(
                InventoryGpu(
                    index=int(item["index"]),
                    uuid=str(item["uuid"])[:64],
                    kind=str(item.get("kind") or item.get("model") or ""),
                    product_name=str(item.get("name") or "")[:128],
                    memory_bytes=int(item.get("memory_bytes") or 0),
                    nvlink_island=int(item.get("nvlink_island") or 0),
                    simulated=bool(item.get("simulated")),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadRegistration(
                f"info.devices[{i}]", f"{exc!r}; each GPU needs an integer index and a uuid"
            ) from exc
    if len({d.index for d in devices}) != len(devices):
        raise BadRegistration("info.devices", "two GPUs with the same index")
    return tuple(sorted(devices, key=lambda d: d.index))


def parse_ports(raw: Any) -> tuple[int, int]:
    """The node's rendezvous port range `[low, high]`; the default for an agent that sends none."""
    if raw is None:
        return DEFAULT_RENDEZVOUS_PORTS
    try:
        low, high = (int(p) for p in raw)
    except (TypeError, ValueError) as exc:
        raise BadRegistration(
            "info.rendezvous_ports",
            f"{raw!r} is not [low, high]; e.g. gpupool agent --rendezvous-ports 29500-29999",
        ) from exc
    if not 1 <= low <= high <= 65535:
        raise BadRegistration(
            "info.rendezvous_ports", f"{low}-{high} is not a range of ports (1-65535, low <= high)"
        )
    return low, high


def rank_log_path(log_path: Path, rank: int) -> Path:
    """Where rank `rank`'s output is kept on the head: the attempt's log for rank 0, a sibling otherwise."""
    if rank == 0:
        return log_path
    return log_path.with_name(f"{log_path.stem}.rank-{rank}{log_path.suffix}")


@dataclass
class AgentNode:
    """A node as its agent registered it, and when it was last heard from (monotonic seconds)."""

    name: str
    address: str
    cpus: float
    memory_bytes: int
    gpus: tuple[tuple[str, int], ...]
    labels: tuple[tuple[str, str], ...]
    last_seen: float
    session: str = ""
    version: int = 0  # bumped whenever the node's desired state changes (wakes its long-poll)
    devices: tuple[InventoryGpu, ...] = ()  # each GPU's UUID and NVLink island (stored, seen by placement)
    ports: tuple[int, int] = DEFAULT_RENDEZVOUS_PORTS  # rendezvous ports for gangs whose rank 0 runs here


@dataclass
class Rank:
    node: str
    gpu_indices: tuple[int, ...]
    gpu_fraction: float
    exit_code: int | None = None
    detail: str = ""  # why it ended, in the agent's words (vanished, could not start)
    vanished: bool = False
    seen: bool = False  # the agent has reported it at least once


@dataclass
class AgentAttempt:
    attempt_id: int
    token: str
    run_dir: Path
    log_path: Path
    launches: list[dict[str, Any]]  # per rank: what the agent needs to start it
    ranks: list[Rank]
    signal: int = 0  # 0, SIGTERM or SIGKILL: the strongest signal asked for so far
    master_port: int = 0  # from rank 0's node's rendezvous range
    dropped: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Reply:
    """Where the reply to one instruction goes (`AgentBackend.ask` waits on `done`)."""

    done: threading.Event
    reply: dict[str, Any] = field(default_factory=dict)


class UnknownNode(LookupError):
    """A heartbeat from a node this head has no registration of (it restarted): the agent registers again."""


class AgentBackend:
    name = "agent"

    def __init__(
        self,
        *,
        lease: float = 10.0,
        interval: float = HEARTBEAT_INTERVAL,
        on_change: Callable[[], None] | None = None,
        on_telemetry: Callable[[str, list[dict[str, Any]]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        known_nodes: tuple[str, ...] = (),
        on_heartbeats: Callable[[dict[str, float]], None] | None = None,
    ) -> None:
        self.lease = lease
        self.interval = interval
        self._on_change = on_change
        self._on_telemetry = on_telemetry
        self._on_heartbeats = on_heartbeats  # {node: epoch seconds} into the store, every so often
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._nodes: dict[str, AgentNode] = {}
        self._attempts: dict[int, AgentAttempt] = {}
        self._by_node: dict[str, set[int]] = {}
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._inventory: Inventory | None = None
        self._stored_at = 0.0
        self._known = set(known_nodes)  # agent nodes of the store at start (a head restart): awaited
        self._next_port: dict[str, int] = {}  # node -> where its next rendezvous port is looked for
        self._registrations = 0  # registrations so far (a node's description may have changed)
        self._inventory_key: tuple[int, frozenset[str]] | None = None
        self._asked: dict[str, dict[str, dict[str, Any]]] = {}  # node -> instruction id -> instruction
        self._listened: float | None = None  # the event loop's last tick (None: no loop ticks, never deaf)
        # The last verdict of _lost_nodes, kept while the head is deaf (replaced, never changed in place)
        self._held: dict[str, float] = {}
        self._replies: dict[str, _Reply] = {}  # instruction id -> where its reply goes

    # -- registration and heartbeats (called by the API) ------------------------------------------------

    def register(self, name: str, info: dict[str, Any], address: str) -> dict[str, Any]:
        """Record (or refresh) a node's description; the answer tells the agent how often to call.
        Raises BadRegistration (naming the field) for a description the head cannot use."""
        gpus = tuple((str(kind), int(count)) for kind, count in info.get("gpus") or [])
        labels = tuple(sorted((str(k), str(v)) for k, v in (info.get("labels") or {}).items()))
        devices, ports = parse_devices(info.get("devices")), parse_ports(info.get("rendezvous_ports"))
        with self._lock:
            previous = self._nodes.get(name)
            node = AgentNode(
                name=name,
                address=str(info.get("address") or address),
                cpus=float(info.get("cpus") or 0.0),
                memory_bytes=int(info.get("memory_bytes") or 0),
                gpus=gpus,
                labels=labels,
                last_seen=self._clock(),
                session=secrets.token_hex(8),
                version=(previous.version + 1) if previous else 0,
                devices=devices,
                ports=ports,
            )
            self._nodes[name] = node
            self._registrations += 1
        log.info(
            "event=agent_registered node=%s address=%s gpus=%s rendezvous_ports=%d-%d",
            name, node.address, gpus, *ports,
        )  # fmt: skip
        self._changed()
        return {"node": name, "session": node.session, "interval": self.interval, "lease": self.lease}

    def knows(self, name: str) -> bool:
        with self._lock:
            return name in self._nodes

    def heartbeat(self, name: str, report: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """Take in an agent's report; answer its desired state and the version to long-poll on."""
        now = self._clock()
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                raise UnknownNode(name)
            was_lost = now - node.last_seen > self.lease
            node.last_seen = now
        if was_lost:
            log.info("event=agent_back node=%s", name)
            self._changed()
        acked = {}  # logs first: a rank's last output lands before its end is reported
        for chunk in report.get("logs") or []:
            ack = self._take_log(name, chunk)
            if ack is not None:
                acked[f"{chunk['attempt_id']}:{chunk['rank']}"] = ack
        settled = False
        known: set[tuple[int, int]] = set()
        for item in report.get("attempts") or []:
            key = (int(item["attempt_id"]), int(item["rank"]))
            known.add(key)
            settled = self._take_report(name, item) or settled
        samples = report.get("telemetry")
        if samples and self._on_telemetry is not None:
            self._on_telemetry(name, list(samples))
        for reply in report.get("instruction_results") or []:  # after the samples: a reply sees them
            self._take_reply(name, reply)
        if settled and self._on_change is not None:
            self._on_change()
        answer, version = self.desired(name, known)
        answer["logs"] = acked
        return answer, version

    def desired(self, name: str, known: set[tuple[int, int]]) -> tuple[dict[str, Any], int]:
        with self._lock:
            node = self._nodes.get(name)
            version = node.version if node else 0
            listed = []
            for attempt_id in sorted(self._by_node.get(name, ())):
                attempt = self._attempts[attempt_id]
                for rank, pod in enumerate(attempt.ranks):
                    if pod.node != name:
                        continue
                    entry: dict[str, Any] = {
                        "attempt_id": attempt_id,
                        "rank": rank,
                        "token": attempt.token,
                        "signal": attempt.signal,
                    }
                    if (attempt_id, rank) not in known and pod.exit_code is None and not pod.vanished:
                        entry["launch"] = attempt.launches[rank]
                    listed.append(entry)
            answer: dict[str, Any] = {"attempts": listed, "interval": self.interval, "lease": self.lease}
            asked = self._asked.get(name)
            if asked:
                answer["instructions"] = list(asked.values())
        return answer, version

    async def wait_for_change(self, name: str, version: int, timeout: float) -> None:
        """Hold a long-poll until the node's desired state changes past `version`, or `timeout`."""
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            node = self._nodes.get(name)
            if node is None or node.version != version:
                return
            self._waiters.setdefault(name, []).append(entry)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                waiting = self._waiters.get(name, [])
                if entry in waiting:
                    waiting.remove(entry)

    def _bump(self, names: set[str]) -> None:
        """The desired state of these nodes changed: wake their long-polls (lock held by the caller)."""
        for name in names:
            node = self._nodes.get(name)
            if node is not None:
                node.version += 1
            for loop, event in self._waiters.pop(name, []):
                loop.call_soon_threadsafe(event.set)

    def _take_report(self, name: str, item: dict[str, Any]) -> bool:
        """Record one rank's report; True when it ended (the loop should look). Stale reports (an attempt
        moved away, a wrong fencing token) are ignored: the answer no longer lists them, so the agent
        kills them."""
        attempt_id, rank = int(item["attempt_id"]), int(item["rank"])
        with self._lock:
            attempt = self._fenced(name, item, attempt_id, rank)
            if attempt is None:
                return False
            pod = attempt.ranks[rank]
            pod.seen = True
            state = item.get("state")
            if pod.exit_code is not None or pod.vanished:
                return False
            if state == "exited" and item.get("exit_code") is not None:
                pod.exit_code = int(item["exit_code"])
                pod.detail = str(item.get("detail") or "")
                path = attempt.run_dir / f"rank-{rank}.exit_code"
            elif state == "vanished":
                pod.vanished, pod.detail = True, str(item.get("detail") or "the process ended unrecorded")
                path = attempt.run_dir / f"rank-{rank}.vanished"
            else:
                return False
        text = str(pod.exit_code) if pod.exit_code is not None else pod.detail
        _write_atomic(path, text + "\n")
        log.info(
            "event=agent_rank_ended node=%s attempt=%d rank=%d exit_code=%s detail=%r",
            name, attempt_id, rank, pod.exit_code, pod.detail,
        )  # fmt: skip
        return True

    def _fenced(self, name: str, item: dict[str, Any], attempt_id: int, rank: int) -> AgentAttempt | None:
        """The attempt a report or log chunk from node `name` speaks for, or None when it is stale: the
        attempt moved away, the fencing token is not the attempt's, or that rank runs elsewhere. Under
        the lock."""
        attempt = self._attempts.get(attempt_id)
        if (
            attempt is None
            or attempt.token != item.get("token")
            or rank >= len(attempt.ranks)
            or attempt.ranks[rank].node != name
        ):
            return None
        return attempt

    def _take_log(self, name: str, chunk: dict[str, Any]) -> int | None:
        """Append a shipped log chunk at its offset (idempotent); the answer is the head's size of it."""
        attempt_id, rank = int(chunk["attempt_id"]), int(chunk["rank"])
        with self._lock:
            attempt = self._fenced(name, chunk, attempt_id, rank)
            if attempt is None:
                return None
            path = rank_log_path(attempt.log_path, rank)
        data = base64.b64decode(chunk.get("data") or "")
        offset = int(chunk.get("offset") or 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as fh:
            size = fh.tell()
            if offset <= size < offset + len(data):
                fh.write(data[size - offset :])
                size = offset + len(data)
        return size

    # -- instructions: the head asks a node's agent to do something once (health/node_tasks.py) --------

    def ask(self, name: str, instruction: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Have node `name`'s agent carry out `instruction` (run its active health checks, inject a fault)
        and return its reply: `{"result": ...}` or `{"error": ...}`. The instruction is listed in the node's
        heartbeat answers (its long-poll is woken) until the reply comes back on a heartbeat. Raises
        UnknownNode for a node with no agent registered here, TimeoutError when no reply came in time."""
        ident = secrets.token_hex(8)
        waiter = _Reply(threading.Event())
        with self._lock:
            if name not in self._nodes:
                raise UnknownNode(name)
            self._asked.setdefault(name, {})[ident] = {"id": ident, **instruction}
            self._replies[ident] = waiter
            self._bump({name})
        try:
            if not waiter.done.wait(timeout):
                raise TimeoutError(
                    f"no reply from its agent within {timeout:g}s (an agent older than the head ignores "
                    "instructions; a lost node answers nothing)"
                )
            return waiter.reply
        finally:
            with self._lock:
                self._asked.get(name, {}).pop(ident, None)
                self._replies.pop(ident, None)

    def _take_reply(self, name: str, reply: dict[str, Any]) -> None:
        ident = str(reply.get("id"))
        with self._lock:
            if ident not in self._asked.get(name, {}):
                return  # answered already, or the asker stopped waiting
            self._asked[name].pop(ident)
            waiter = self._replies.get(ident)
        if waiter is not None:
            waiter.reply = dict(reply)
            waiter.done.set()

    # -- the Backend interface (called by the reconcile loop) --------------------------------------------

    def start(self, launch: Launch) -> Handle:
        pods = launch.pods
        if not pods:
            raise LaunchError("the agent backend needs the scheduler's placement (Launch.pods)")
        with self._lock:
            addresses = [self._nodes[p.node].address if p.node in self._nodes else p.node for p in pods]
            port = self._rendezvous_port(pods[0].node)
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
            "pods": [
                {"node": p.node, "gpu_indices": list(p.gpu_indices), "gpu_fraction": p.gpu_fraction}
                for p in pods
            ],
            "launches": launches,
        }
        launch.run_dir.mkdir(parents=True, exist_ok=True)
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(launch.run_dir / "launch.json", json.dumps(record))
        self._adopt(launch.run_dir, record)
        log.info(
            "event=agent_attempt_offered attempt=%d workload=%d nodes=%s",
            launch.attempt_id, launch.workload_id, ",".join(p.node for p in pods),
        )  # fmt: skip
        return Handle(launch.attempt_id, 0.0)

    def _adopt(self, run_dir: Path, record: dict[str, Any]) -> AgentAttempt:
        ranks = []
        for rank, pod in enumerate(record["pods"]):
            item = Rank(
                str(pod["node"]), tuple(int(i) for i in pod["gpu_indices"]), float(pod["gpu_fraction"])
            )
            code = _read(run_dir / f"rank-{rank}.exit_code")
            if code is not None and code.lstrip("-").isdigit():
                item.exit_code = int(code)
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
        )
        with self._lock:
            self._attempts[attempt.attempt_id] = attempt
            names = {r.node for r in ranks}
            for node in names:
                self._by_node.setdefault(node, set()).add(attempt.attempt_id)
            self._bump(names)
        return attempt

    def _rendezvous_port(self, name: str) -> int:
        """A port of node `name`'s rendezvous range that no attempt listed here holds, taken in turn (so a
        retried gang gets another one); lock held by the caller."""
        node = self._nodes.get(name)
        low, high = node.ports if node is not None else DEFAULT_RENDEZVOUS_PORTS
        held = {a.master_port for a in self._attempts.values() if a.ranks and a.ranks[0].node == name}
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
        ranks = attempt.ranks
        failed = [(r, p) for r, p in enumerate(ranks) if p.exit_code not in (None, 0)]
        if failed:
            rank, pod = failed[0]
            detail = f"rank {rank} on {pod.node} exited with code {pod.exit_code}" + (
                f": {pod.detail}" if pod.detail else ""
            )
            return Status(Phase.EXITED, pod.exit_code, detail=detail)
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
        _write_atomic(attempt.run_dir / "signal", f"{signum}\n")
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
            InventoryNode(
                name=n.name,
                address=n.address,
                state="lost" if n.name in lost else "ready",
                state_reason=f"agent: no heartbeat within the node lease ({self.lease:g}s)"
                if n.name in lost
                else "",
                cpus=n.cpus,
                memory_bytes=n.memory_bytes,
                gpus=n.gpus,
                labels=n.labels,
                devices=n.devices,
            )
            for n in sorted(self._nodes.values(), key=lambda n: n.name)
        )

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

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
