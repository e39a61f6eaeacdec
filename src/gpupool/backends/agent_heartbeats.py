"""The agents' side of the agent backend (backends/agent.py): registrations, heartbeats and instructions.

The base of the agent backend's chain of classes: `AgentHeartbeats` (this file: the backend's state;
an agent's registration, its heartbeat's reports and log chunks taken in, the node's desired state as the
answer, long-polls held until it changes; instructions the head asks a node's agent to carry out) ->
`AgentBackend` (backends/agent.py: the Backend interface the reconcile loop calls, the inventory, leases).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpupool.backends.agent_records import (
    AgentAttempt,
    AgentNode,
    parse_devices,
    parse_ports,
    rank_log_path,
    write_atomic,
)
from gpupool.backends.base import Inventory

log = logging.getLogger("gpupool.agents")
LOG_LOCKS = 64  # locks the rank logs' appends are striped over

HEARTBEAT_INTERVAL = 1.0  # seconds between an agent's heartbeats (the agent's long-poll hold)
# An agent's clock is measured from its heartbeats' `sent_at` (the head's time on receipt minus the agent's
# at sending): the clocks' offset plus the report's time in transit, so the smallest of the last few is kept
# (a head that stood still reads reports late: that is no clock error).
CLOCK_SAMPLES = 10
CLOCK_SHIFT_ABOVE = 1.0  # seconds off beyond which an agent's samples are put on the head's clock
CLOCK_WARN_ABOVE = 5.0  # seconds off beyond which the log says so
CLOCK_WARN_EVERY = 3600.0  # seconds between two such lines for one node


class TelemetrySink(Protocol):
    """Where an agent's GPU samples go (`TelemetryCache.put`); `offset`: seconds to add to their times."""

    def __call__(self, node: str, samples: list[dict[str, Any]], offset: float = 0.0) -> None: ...


@dataclass
class _Reply:
    """Where the reply to one instruction goes (`AgentBackend.ask` waits on `done`)."""

    done: threading.Event
    reply: dict[str, Any] = field(default_factory=dict)


class UnknownNode(LookupError):
    """A heartbeat from a node this head has no registration of (it restarted): the agent registers again."""


class AgentHeartbeats:
    """The agent backend's state, and what the agents send: see the module's docstring."""

    def __init__(
        self,
        *,
        lease: float = 10.0,
        interval: float = HEARTBEAT_INTERVAL,
        on_change: Callable[[], None] | None = None,
        on_telemetry: TelemetrySink | None = None,
        clock: Callable[[], float] = time.monotonic,
        known_nodes: tuple[str, ...] = (),
        on_heartbeats: Callable[[dict[str, float]], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.lease = lease
        self.interval = interval
        self._on_change = on_change
        self._on_telemetry = on_telemetry
        self._on_heartbeats = on_heartbeats  # {node: epoch seconds} into the store, every so often
        self._clock = clock
        self._wall_clock = wall_clock  # epoch seconds: what an agent's clock is measured against
        self._started = clock()
        self._lock = threading.Lock()
        # A rank's log is appended by one heartbeat at a time: an agent that timed out a slow heartbeat
        # sends its chunk again while the first is still being written, and two appends at one offset wrote
        # it twice, then cut as much from the next chunk (striped by path: heartbeats of other ranks go on).
        self._log_locks = tuple(threading.Lock() for _ in range(LOG_LOCKS))
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
        self._clock_offsets: dict[str, deque[float]] = {}  # node -> its last heartbeats' clock differences
        self._clock_warned: dict[str, float] = {}  # node -> when the log last said its clock is off

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
        sent = report.get("sent_at")  # the agent's clock when it sent the report (absent before 2026-12)
        apart = self._wall_clock() - sent if isinstance(sent, int | float) and math.isfinite(sent) else None
        offset, warn = 0.0, False
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                raise UnknownNode(name)
            was_lost = now - node.last_seen > self.lease
            node.last_seen = now
            if apart is not None:
                offset, warn = self._clock_offset(name, apart, now)
        if warn:
            log.warning(
                "event=agent_clock_off node=%s offset=%.1f: its agent's clock is %.1fs %s the head's; its "
                "GPU samples are kept on the head's clock, but the node's own times (its log, its jobs') are "
                "off: synchronise its clock (chrony, systemd-timesyncd)",
                name, offset, abs(offset), "behind" if offset > 0 else "ahead of",
            )  # fmt: skip
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
            self._on_telemetry(name, list(samples), offset=offset)
        for reply in report.get("instruction_results") or []:  # after the samples: a reply sees them
            self._take_reply(name, reply)
        if settled and self._on_change is not None:
            self._on_change()
        answer, version = self.desired(name, known)
        answer["logs"] = acked
        return answer, version

    def _clock_offset(self, name: str, apart: float, now: float) -> tuple[float, bool]:
        """(seconds to add to the times node `name` sends to put them on the head's clock, 0.0 while its
        clock is within CLOCK_SHIFT_ABOVE of the head's; whether to say in the log that it is off).
        `apart`: this report's head time on receipt minus its agent's time at sending. Under the lock."""
        seen = self._clock_offsets.get(name)
        if seen is None:
            seen = self._clock_offsets[name] = deque(maxlen=CLOCK_SAMPLES)
        seen.append(apart)
        offset = min(seen)
        if abs(offset) <= CLOCK_SHIFT_ABOVE:
            return 0.0, False
        warned = self._clock_warned.get(name)
        if abs(offset) <= CLOCK_WARN_ABOVE or (warned is not None and now - warned < CLOCK_WARN_EVERY):
            return offset, False
        self._clock_warned[name] = now
        return offset, True

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
                pod.cause = "node-failure" if item.get("cause") == "node-failure" else "failure"
                ago = item.get("ended_ago")
                if isinstance(ago, int | float) and 0 <= ago < 30 * 86400:
                    pod.ended_at = self._wall_clock() - ago  # on the head's clock
                path = attempt.run_dir / f"rank-{rank}.exit_code"
            elif state == "vanished":
                pod.vanished, pod.detail = True, str(item.get("detail") or "the process ended unrecorded")
                path = attempt.run_dir / f"rank-{rank}.vanished"
            else:
                return False
        text = str(pod.exit_code) if pod.exit_code is not None else pod.detail
        if pod.exit_code is not None and (pod.detail or pod.cause != "failure" or pod.ended_at):
            ended = {"detail": pod.detail, "cause": pod.cause, "ended_at": pod.ended_at}  # kept for a restart
            write_atomic(path.with_name(f"rank-{rank}.why"), json.dumps(ended))
        write_atomic(path, text + "\n")
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
        with self._log_locks[hash(path) % LOG_LOCKS], open(path, "ab") as fh:
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

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()
