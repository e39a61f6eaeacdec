"""The health loop's state (control/health.py): what it knows of each node, and the node states it reads
and sets.

The base of the health loop's chain of classes, a phase per module: `HealthState` (this file: the per-node
verdicts and bookkeeping, nodes held out; reading the nodes, setting their state, draining them) ->
`Judging` (control/health_judge.py: the passive and active checks, and recording their verdicts) ->
`HealthMonitor` (control/health.py: the loop's pass, checks on demand, expected GPUs, fault injection,
what the API shows).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from sqlalchemy import func, select

from gpupool.control.bench import BenchBook
from gpupool.control.errors import NotFound
from gpupool.control.health_jobs import CheckJobs
from gpupool.control.inventory import BACK_FROM_LOST
from gpupool.control.telemetry import TelemetryCache
from gpupool.gpu import GpuProvider, SimulatedProvider
from gpupool.health import simulated_state
from gpupool.health.checks import Baseline, Verdict
from gpupool.health.thresholds import HealthConfig
from gpupool.spec.queue import SYSTEM_QUEUE
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Gpu, Node, Workload

log = logging.getLogger("gpupool.health")

ACTOR = "health"
STOP_DRAIN = "drain"  # the reconcile loop's stop reason for work leaving a node (control.observe.STOP_DRAIN)
CHECKING = "health: active checks running"  # state_reason of a node cordoned for its checks (older heads)
# state_reason of an unhealthy node that older heads cordoned while its check job ran (their scheduler
# restarted any work on an unhealthy node), then "; " and its reason as unhealthy: such a node goes back to
# unhealthy. An unhealthy node now stays so while its check job runs (the scheduler leaves single-pod work).
RECHECKING = "health: unhealthy, active checks running"
PARALLEL_CHECKS = 64  # scheduled checks running at once (each a thread, mostly waiting on a node)


class AgentNodes(Protocol):
    """The agent nodes this head hears from, and a way to ask their agents (backends.agent.AgentBackend)."""

    def knows(self, name: str) -> bool: ...

    def ask(self, name: str, instruction: dict[str, Any], timeout: float) -> dict[str, Any]: ...


@dataclass
class NodeHealth:
    verdict: Verdict
    checked_at: float  # unix time of the verdict
    active: dict[str, Any] | None = None  # the last active run: result and verdict
    active_at: float | None = None
    # The last active run's verdict: while it failed, the passive checks judge the node with it (what the
    # active checks found stands until they run again), so that a recheck that fails as the one before did
    # changes no verdict (it counted twice in gpupool_health_verdicts_total, each recheck).
    active_verdict: Verdict | None = None


class HealthState:
    """The health loop's state: see the module's docstring for the phases built on it."""

    def __init__(
        self,
        store: Store,
        telemetry: TelemetryCache,
        config: HealthConfig,
        *,
        local_node: str,
        local_gpus: GpuProvider | None,
        agents: AgentNodes | None = None,
        wake: Callable[[], None] = lambda: None,
        interval: float = 1.0,
        jobs: CheckJobs | None = None,
    ) -> None:
        self.store, self.telemetry, self.config = store, telemetry, config
        self.local_node, self.local_gpus, self.agents = local_node, local_gpus, agents
        self.wake, self.interval = wake, interval
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeHealth] = {}
        self._baselines: dict[str, Baseline] = {}
        self._running: dict[str, threading.Lock] = {}
        self._unhealthy_since: dict[str, float] = {}
        self._failed_rechecks: dict[str, int] = {}  # node -> rechecks failed in a row (see _recheck_interval)
        self._checks_done: Counter[str] = Counter()  # node -> active checks ended (see _left_to_its_checks)
        # Nodes taken out and not yet back through passing checks, with the evidence: one that left state
        # `unhealthy` another way (lost, then its agent came back) is taken out again. Read back from the
        # node events at the first pass (`_restore_held_out`), so a restart of the head lets none back.
        self._held_out: dict[str, str] = {}
        self._restored = False
        # As the last pass read them: node -> GPU index -> model, node -> GPU index -> UUID, and node -> how
        # many GPUs it is expected to have (None: not remembered yet; `Node.expected_gpus` read only when
        # the GPUs that answer differ, to name them: decoding it for every node each second costs).
        self._gpus_now: dict[str, dict[int, str]] = {}
        self._uuids_now: dict[str, dict[int, str]] = {}
        self._expected_now: dict[str, int | None] = {}
        self._declared_now: dict[str, int] = {}  # node -> GPUs its join token declares (Node.declared_gpus)
        # Counts `accept_gpus` calls: a pass that read the nodes before one must not write back, or judge by,
        # the expected GPUs it read (a node just accepted would fall again for the GPU accepted as gone).
        self._accepted = 0
        self._back_since: dict[str, float] = {}  # node back from lost -> when this head first saw it so
        # node that declares GPUs but has registered none -> when this head first saw it so (`_no_gpus`)
        self._bare_since: dict[str, float] = {}
        self._parallel = threading.BoundedSemaphore(PARALLEL_CHECKS)
        self._started = time.time()
        self.verdicts_total: Counter[tuple[str, str]] = Counter()  # (node, health) -> verdicts that changed
        self.failed_checks_total: Counter[str] = Counter()  # check -> findings that set a verdict
        self.bench = BenchBook(store)  # stored bench results, judged with the other checks (docs/bench.md)
        # The active checks as jobs; the reconcile loop starts them (Reconciler.direct_binds = jobs.binds).
        self.jobs = jobs or CheckJobs(store, wake=wake)
        self._publish()

    def _busy(self, name: str) -> bool:
        lock = self._running.get(name)
        return lock is not None and lock.locked()

    # -- simulated GPUs, as the check jobs read them --------------------------------------------------

    def _publish(self) -> None:
        """Where this head's check jobs find its simulated GPUs as faults left them (simulated_state.py)."""
        if isinstance(self.local_gpus, SimulatedProvider):
            try:
                simulated_state.publish(self.local_gpus, self.local_node)
            except OSError as exc:  # its check jobs then fail and say why; the head goes on
                log.warning("event=simulated_state_unwritable node=%s error=%r", self.local_node, str(exc))

    # -- acting on verdicts ---------------------------------------------------------------------------

    def _mark_unhealthy(self, name: str, verdict: Verdict) -> None:
        reason = f"health: {verdict.evidence}"
        changed = self._set_state(name, "unhealthy", reason, only_from=None)
        with self._lock:
            self._unhealthy_since.setdefault(name, time.time())
            self._held_out.setdefault(name, verdict.evidence)
        if changed:
            log.warning("event=node_unhealthy node=%s evidence=%r", name, verdict.evidence)
        self._drain(name)

    def _drain(self, name: str) -> None:
        """Ask the reconcile loop to stop every attempt with a pod on the node (it requeues them); each
        attempt's history names the evidence that made the node unhealthy."""
        with self._lock:
            evidence = self._held_out.get(name)
        why = f"node {name} unhealthy" + (f" (health: {evidence})" if evidence else "")
        marked = 0
        with self.store.session() as s:
            for attempt in s.scalars(
                select(Attempt)
                .join(Workload, Attempt.workload_id == Workload.id)
                .where(
                    Attempt.state == "running",
                    Attempt.stop_requested_at.is_(None),
                    Workload.queue != SYSTEM_QUEUE,  # a check job is what lets the node back
                )
            ):
                pods = attempt.pods or [{"node": attempt.node_name}]
                if attempt.stop_reason != STOP_DRAIN and any(p["node"] == name for p in pods):
                    attempt.stop_reason, attempt.reason = STOP_DRAIN, why
                    marked += 1
        if marked:
            log.info("event=node_drain_requested node=%s attempts=%d", name, marked)
            self.wake()

    def _set_state(self, name: str, state: str, reason: str, *, only_from: str | None = None) -> bool:
        with self.store.session() as s:
            node = s.scalar(select(Node).where(Node.name == name))
            if node is None or node.state == state or (only_from is not None and node.state != only_from):
                return False
            if node.state == "lost":  # the backend's to lift; a node taken out stays held out when back
                return False
            if state == "unhealthy" and _operators(node):
                # An operator's cordon or drain stands (Slurm's DRAIN survives health changes): the node is
                # out of service either way, its work is stopped (`_drain`), and `health status` says why;
                # an uncordon while it is unhealthy makes it unhealthy, a pass leaves it cordoned.
                return False
            if state == "ready" and node.state not in ("unhealthy", "cordoned"):
                return False
            if state == "ready" and node.state == "cordoned" and not _health_cordon(node.state_reason):
                return False  # an operator's cordon is the operator's to lift
            return node.change_state(state, reason, ACTOR)

    def _node_state(self, name: str) -> str:
        return self._node_state_and_reason(name)[0]

    def _node_state_and_reason(self, name: str) -> tuple[str, str]:
        with self.store.read() as s:
            node = s.scalar(select(Node).where(Node.name == name))
            if node is None:
                names = ", ".join(s.scalars(select(Node.name).order_by(Node.name))) or "none"
                raise NotFound(f"no node named {name!r} (nodes: {names})")
            return node.state, node.state_reason

    def _nodes_now(self, accepted: int) -> list[tuple[str, str, str, bool]]:
        """Every node: (name, state, state reason, whether work runs on it); its GPUs go to `_gpus_now`, and
        the GPUs each is expected to have to `_expected_now` unless GPUs were accepted since `accepted` (the
        count of `accept_gpus` calls when the pass began): those the accept wrote stay."""
        return self._keep_nodes(self._read_nodes(), accepted)

    def _read_nodes(self) -> NodesRead:
        with self.store.read() as s:
            busy: set[str] = set()  # nodes with running work; a check job counts too (one at a time)
            for node_name, pods in s.execute(
                select(Attempt.node_name, Attempt.pods).where(Attempt.state == "running")
            ):
                busy.update(str(p["node"]) for p in pods or [{"node": node_name}])
            # Plain rows, not ORM objects (this runs every second over every node and GPU).
            gpus: dict[str, dict[int, str]] = {}
            uuids: dict[str, dict[int, str]] = {}
            for node_name, index, model, uuid in s.execute(
                select(Node.name, Gpu.index, Gpu.model, Gpu.uuid).join(Gpu, Gpu.node_id == Node.id)
            ):
                gpus.setdefault(node_name, {})[index] = model
                uuids.setdefault(node_name, {})[index] = uuid
            # How many GPUs each node is expected to have, counted by the database (SQLite and PostgreSQL
            # both have json_array_length): the list itself is read only where it is needed (_judge).
            expected = func.json_array_length(Node.expected_gpus)
            rows = s.execute(
                select(Node.name, Node.state, Node.state_reason, expected, Node.declared_gpus).order_by(
                    Node.name
                )
            ).all()
        return NodesRead(busy, gpus, uuids, [tuple(row) for row in rows])

    def _keep_nodes(self, read: NodesRead, accepted: int) -> list[tuple[str, str, str, bool]]:
        busy, gpus, uuids, rows = read
        with self._lock:
            self._gpus_now, self._uuids_now = gpus, uuids
            if self._accepted == accepted:
                self._expected_now = {name: count for name, _, _, count, _ in rows}
                self._declared_now = {n: declared for n, _, _, _, declared in rows if declared is not None}
        return [(name, state, reason, name in busy) for name, state, reason, _, _ in rows]


class NodesRead(NamedTuple):
    """What `_read_nodes` read: nodes with running work, each node's GPU models and UUIDs by index, and
    (name, state, state reason, expected GPU count, declared GPUs) per node."""

    busy: set[str]
    gpus: dict[str, dict[int, str]]
    uuids: dict[str, dict[int, str]]
    rows: list[tuple[Any, ...]]


def _operators(node: Node) -> bool:
    """Whether an operator holds the node out (a drain, or a cordon that is not health's own)."""
    return node.state == "draining" or (node.state == "cordoned" and not _health_cordon(node.state_reason))


def _health_cordon(reason: str) -> bool:
    return reason in (CHECKING, BACK_FROM_LOST) or reason.startswith(RECHECKING)
