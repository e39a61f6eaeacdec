"""A scheduling cycle's inputs made ready, and the questions every action asks of them.

A cycle is one chain of classes, a phase per module, each calling only what lies below it:
`Prepared` (this file: queues, the tentative state with the running work loaded, fair shares, each queue's
pending order) -> `Victims` (victims.py: what may be evicted, in what order) -> `EvictionSearch`
(evict_search.py: making room for one pending workload) -> `Allocation` (allocate.py) -> `Cycle` (cycle.py:
the pipeline of actions).
"""

from __future__ import annotations

from typing import Final

from gpupool.scheduler import explain
from gpupool.scheduler.fairshare import fair_shares
from gpupool.scheduler.ordering import in_order, order_key
from gpupool.scheduler.placement import Placer
from gpupool.scheduler.snapshot import (
    Bind,
    Decisions,
    Eviction,
    Explanation,
    NodeView,
    PodPlacement,
    QueueView,
    Snapshot,
    WorkloadView,
)
from gpupool.scheduler.state import (
    EPSILON,
    ClusterState,
    Held,
    Loaded,
    NodeState,
    QueueSums,
    Reservation,
    Sums,
)

ACTIONS: Final = ("stale_gang", "allocate", "consolidate", "reclaim", "preempt")
PLACEMENTS: Final = ("binpack", "spread", "fragmentation")
BLOCKING: Final = ("skip", "strict", "backfill")
# A node where victims might make room: the node, an upper bound on the GPUs they could free, the victims.
AbleNode = tuple[NodeState, float, list[WorkloadView]]
GLOBAL: Final = "*"


class _NodeAnswers:
    """Whether work of a shape can never fit (see Allocation._never_keyed), by shape: answers that depend on
    the snapshot's nodes alone, kept while callers pass the very same tuple of node views (the simulator
    does, cycle after cycle; the control loop builds new views, and starts afresh each cycle). Bounded."""

    __slots__ = ("never", "nodes")

    def __init__(self) -> None:
        self.nodes: tuple[NodeView, ...] | None = None
        self.never: dict[tuple[object, ...], Explanation | None] = {}


_NODE_ANSWERS: Final = _NodeAnswers()
MAX_NODE_ANSWERS: Final = 10_000


class _LastPending:
    """The last pending work `by_key` was given, and its answer (only read since: a call that changes it
    changes a copy)."""

    __slots__ = ("by_key", "views")

    def __init__(self) -> None:
        self.views: tuple[WorkloadView, ...] = ()
        self.by_key: dict[int, WorkloadView] = {}


_LAST_PENDING: Final = _LastPending()
MAX_GONE: Final = 16  # views gone since the last call beyond which `by_key` builds its answer afresh


def _row(sums: dict[str, QueueSums], queue: str) -> QueueSums:
    """`queue`'s row of `sums`, made when missing."""
    found = sums.get(queue)
    if found is None:
        found = sums[queue] = QueueSums()
    return found


def by_key(pending: tuple[WorkloadView, ...]) -> dict[int, WorkloadView]:
    """`{w.key: w for w in pending}`: the same keys, values and order, made from the last call's answer
    when it can be (a pure cache: it changes no result).

    Callers pass mostly the same views cycle after cycle, in the same order, with a few gone, a few
    replaced (a new view of the same workload, in its place) and a few new ones at the end: then the last
    answer is copied (a copy costs a fraction of building a dict key by key), the gone views' keys
    deleted, the replaced ones' values set in place and the new ones added at the end, which gives the
    dict the walk would. Matched by identity, in order; with more than MAX_GONE views gone it is built
    afresh, and an answer with an id repeated is no base for the next. The answer is kept for the next
    call: read it, and copy it to change it."""
    last = _LAST_PENDING
    found = _from_last(last, pending) if last.views else None
    if found is None:
        found = {w.key: w for w in pending}
    if len(found) == len(pending):  # only an answer without repeated ids is a base for the next
        last.views, last.by_key = pending, found
    else:
        last.views, last.by_key = (), {}
    return found


def _from_last(last: _LastPending, pending: tuple[WorkloadView, ...]) -> dict[int, WorkloadView] | None:
    """`by_key(pending)` from the last answer (see there), or None where it cannot be told."""
    gone: list[WorkloadView] = []
    replaced: list[WorkloadView] = []
    j, n = 0, len(pending)
    for w in last.views:
        if j < n and pending[j] is w:
            j += 1
        elif j < n and pending[j].id == w.id:
            replaced.append(pending[j])
            j += 1
        else:
            gone.append(w)
            if len(gone) > MAX_GONE:
                return None
    found = last.by_key.copy()
    for w in gone:
        del found[w.key]
    for w in replaced:
        found[w.key] = w  # the key is there: it keeps its place
    for i in range(j, n):
        w = pending[i]
        found[w.key] = w  # an id repeated keeps its first place with its last view, as the walk gives
    return found


class ConfigError(ValueError):
    """A scheduler configuration names an unknown action, placement, ordering or blocking mode."""


def validate(snapshot: Snapshot) -> None:
    config = snapshot.config
    for action in config.actions:
        if action not in ACTIONS:
            raise ConfigError(f"unknown scheduler action {action!r}; known: {', '.join(ACTIONS)}")
    if config.placement not in PLACEMENTS:
        raise ConfigError(f"unknown placement {config.placement!r}; one of {', '.join(PLACEMENTS)}")
    if config.blocking not in BLOCKING:
        raise ConfigError(f"unknown blocking mode {config.blocking!r}; one of {', '.join(BLOCKING)}")
    order_key(config.ordering)
    for queue in snapshot.queues:
        if queue.ordering is not None:
            order_key(queue.ordering)


class Prepared:
    """The cycle's state before any action: see the module's docstring for the phases built on it."""

    def __init__(self, snapshot: Snapshot, now: float) -> None:
        validate(snapshot)
        self.snapshot = snapshot
        self.config = snapshot.config
        self.now = now
        self.decisions = Decisions()
        queues = {q.name: q for q in snapshot.queues}
        # One pass over the work: each queue's sums (see QueueSums) and each node's running work. Work of
        # one queue mostly comes in runs (the simulator lists it so, and a store lists it by queue): the row
        # of the work before is taken again, without a lookup, while the queue is the same object.
        sums: dict[str, QueueSums] = {}
        last: str | None = None
        row = QueueSums()
        for w in snapshot.pending:
            queue = w.queue
            if queue is not last:
                row, last = _row(sums, queue), queue
            row.demand.add(w)
            row.pending.append(w)
        loaded: Loaded = []
        short: list[WorkloadView] = []  # running work with fewer pods placed than it has (see stale_gang)
        # running single-pod work that may be evicted, by node, the nodes in the order it first reaches them
        # (see Victims._victim_groups)
        singles: dict[str, list[WorkloadView]] = {}
        self.by_node: dict[str, list[WorkloadView]] = {}
        by_node = self.by_node
        for w in snapshot.running:
            queue = w.queue
            if queue is not last:
                row, last = _row(sums, queue), queue
            pods = w.nodes
            gpu = w.gpus.count * pods  # as Sums.add sums them
            cpu = w.cpus * pods
            memory = w.memory_bytes * pods
            demand = row.demand
            demand.gpu += gpu
            demand.cpu += cpu
            demand.memory += memory
            if not w.stopping:
                if w.preemptible:
                    part = row.preemptible
                    if part is None:
                        part = row.preemptible = Sums()
                        loaded.append((queue, True, part))
                else:
                    part = row.other
                    if part is None:
                        part = row.other = Sums()
                        loaded.append((queue, False, part))
                part.gpu += gpu
                part.cpu += cpu
                part.memory += memory
            placement = w.placement
            if len(placement) < pods:
                short.append(w)
            if len(placement) == 1 and w.preemptible and not w.stopping:
                name = placement[0].node
                group = singles.get(name)
                if group is None:
                    group = singles[name] = []
                group.append(w)
                lowest = row.lowest
                if lowest is None or w.priority < lowest:
                    row.lowest = w.priority
            for pod in placement:
                on_node = by_node.get(pod.node)
                if on_node is None:
                    on_node = by_node[pod.node] = []
                on_node.append(w)
        self._sums = sums
        self._short = short
        self._singles = singles
        # whether the victims (see Victims._victim_groups) are all of `singles` and this cycle's binds
        # (`_bind_victims`), once taken
        self._singles_whole = False
        self._bind_victims: list[WorkloadView] = []
        for name in sorted(name for name in sums if name not in queues):
            queues[name] = QueueView(name)  # work in an unknown queue: a queue with no quota
        self.queues = queues
        # whether any queue sets a minimum runtime above zero (else work is old enough once it started)
        self._floors = any(
            (q.min_runtime_preempt or 0.0) > 0 or (q.min_runtime_reclaim or 0.0) > 0 for q in queues.values()
        )
        self.state = ClusterState(snapshot.nodes, queues.values(), snapshot.running, by_node, loaded)
        state = self.state
        # the nodes' own, before running work
        self._capacity = (state.capacity_gpu, state.capacity_cpu, state.capacity_memory)
        self.placer = Placer(self.state, self.config.placement, now, (snapshot.pending, snapshot.running))
        self._pending_by_id = by_key(snapshot.pending)  # only read: see by_key
        self.unplaced: dict[int, WorkloadView] = dict(self._pending_by_id)
        self._least: dict[str, float] = {}  # each group's fewest GPUs asked for, see _least_gpus
        # the last standing _capacity_explanation read: the queue, len(state.accounted), (the queue, its
        # allocation, its fair share) as the over-fair-share sentence takes them, and whether it is over
        self._standing_queue: str | None = None
        self._standing_changes = -1
        self._standing: explain.Standing = ("", 0.0, 0.0)
        self._standing_over = False
        # the last `Cycle._within_quota` answer: its queue, GPUs and len(state.accounted), and the answer
        self._quota_queue: str | None = None
        self._quota_units = -1.0
        self._quota_changes = -1
        self._quota_answer = False
        self.order = self._pending_order()
        # each pending workload's place in its group's order (built when first asked, see `ahead_of`);
        # with ids repeated in the snapshot, a place is the last the id holds, as the dict would give
        self._rank: dict[int, int] | None = None
        self._ids_unique = len(self.unplaced) == len(snapshot.pending)
        # Pending work that can never fit the pool (too large, no GPU of its model), and per group, how many
        # of it come before each place of the group's order: no one waits behind it (`_waiting_ahead`).
        self._never_ids: set[int] = set()
        self._never_before: dict[str, list[int]] = {}
        # shape -> why placing failed, in the state's generation, under the reservation then in force
        self.failed: dict[tuple[object, ...], tuple[int, Explanation, Reservation | None]] = {}
        answers = _NODE_ANSWERS
        if answers.nodes is not snapshot.nodes or len(answers.never) >= MAX_NODE_ANSWERS:
            answers.nodes, answers.never = snapshot.nodes, {}
        self._never = answers.never
        # the last workload _never_fits answered for, and its answer
        self._never_last_asked: WorkloadView | None = None
        self._never_last: Explanation | None = None
        self._no_release_fit: dict[tuple[object, ...], tuple[int, int]] = {}
        self._no_victims: dict[tuple[object, ...], tuple[int, int]] = {}
        self._smallest_miss: dict[tuple[object, ...], tuple[tuple[int, int], float]] = {}
        self._runtime_floor: dict[tuple[str, str], float] = {}
        self._queue_limits: dict[str, list[tuple[str, int, float]]] = {}
        self._limits_queue: str | None = None  # the queue `_limits` last answered for, and its answer
        self._limits_found: list[tuple[str, int, float]] = []
        self._groups: dict[str, list[WorkloadView]] | None = None  # see _victim_groups
        self._index: dict[str, list[WorkloadView]] | None = None
        self._gang_victims: list[WorkloadView] | None = None  # see _gangs
        self._tentative: dict[int, WorkloadView] = {}  # this cycle's binds, as pending views
        self._stopping_for: dict[int, list[int]] = {}  # pending id -> stopping work evicted for it (ids)
        # whether the snapshot has stopping work (its GPUs held), and that work by node (see _promise)
        self._snapshot_stopping = bool(state.holding_nodes)
        self._owed = [w for w in snapshot.pending if w.victims_stopped]  # see Allocation._serve_gainers
        self._stopping_on: dict[str, list[tuple[WorkloadView, PodPlacement]]] | None = None
        self._ownerless = 0  # this cycle's evictions for no pending workload (stale gangs)
        self._stopping_seen = 0  # how many of those `_stopping_on` has seen
        # `max_stopping_gpus`, and the GPUs held by work stopped for others: that the snapshot has (counted
        # when first asked, see EvictionSearch._stopping_gpus) and that this cycle stopped
        self._stop_limit = snapshot.config.max_stopping_gpus
        self._stopping_before = -1.0
        self._stopped_now = 0.0
        # Work held back by another (see Cycle._let_go): under strict blocking, each group's workload that
        # did not fit and holds back the rest; under backfill, the reservation that held back a workload.
        self._blockers: dict[str, WorkloadView] = {}
        self._reserved_by: dict[int, Reservation | None] = {}
        self._let_go_count = 0  # how many held workloads were tried again (each may change the state)
        self._taken_back = 0  # how many of this cycle's binds were taken back for other work (`_retract`)
        self._old: dict[str, dict[int, bool]] = {"preempt": {}, "reclaim": {}}  # kind -> workload id -> old
        # (ids of a candidates and a units dict, GPUs needed) -> (able nodes, how much of state.freed they
        # have seen, the dicts: they keep their ids alive)
        self._able_cache: dict[tuple[int, int, float], tuple[dict[str, AbleNode], int, object]] = {}
        # (ids of a candidates and a units dict) -> (see _able_base, the dicts: they keep their ids alive)
        self._able_bases: dict[tuple[int, int], tuple[dict[str, AbleNode], list[AbleNode], object]] = {}
        self._victim_queue_names: list[str] | None = None
        self._reclaim_gpus: dict[str, dict[str, float]] | None = None  # see _gpus_by_queue
        self._by_queue: dict[str, dict[str, list[WorkloadView]]] = {}  # see _queue_victims
        # the victims that `_by_queue` is taken from, split by queue in one walk (see _queue_victims), and
        # how many queues' were filtered from them one by one before
        self._victims_split: tuple[object, dict[str, dict[str, list[WorkloadView]]]] | None = None
        self._filtered: tuple[object, int] = (None, 0)
        self._lowest: dict[str, int] | None = None
        self._surplus: dict[str, float] = {}  # victim queue -> GPUs above its fair share
        self._surplus_total = 0.0
        self._surplus_seen = -1  # how much of state.accounted `_surplus` has seen (-1: not built yet)
        self._node_kinds: list[list[NodeState]] | None = None
        # node -> its running work's declared ends, for backfill reservations (see Allocation._ends_on)
        self._ends: dict[str, tuple[list[Held], list[int]]] = {}
        self.schedulable_nodes = sum(1 for n in snapshot.nodes if n.schedulable)
        # Fair shares last: work that can never fit the pool is no demand (a 16-GPU job on 8 GPUs raised its
        # queue's share, which its other work then reclaimed from queues that could use it)
        for row in sums.values():
            demand = row.demand
            for w in row.pending:
                if self._never_fitting(w):
                    self._never_ids.add(w.id)
                    demand.gpu -= w.gpus.count * w.nodes  # as Sums.add added it
                    demand.cpu -= w.cpus * w.nodes
                    demand.memory -= w.memory_bytes * w.nodes
        self.shares = self._fair_shares()
        self.decisions.fair_shares = self.shares

    # -- setup ----------------------------------------------------------------------------------------

    def _never_fitting(self, w: WorkloadView) -> bool:
        """Whether `w` can never fit the pool as it is (too large, no GPU of its model): the allocation
        phase knows (Allocation._never_fitting); this phase alone counts all work."""
        return False

    def _fair_shares(self) -> dict[str, dict[str, float]]:
        gpu, cpu, memory = self._capacity
        capacity = {"gpu": gpu, "cpu": cpu, "memory": memory}  # RESOURCES, in order
        demand = {
            queue: {"gpu": row.demand.gpu, "cpu": row.demand.cpu, "memory": row.demand.memory}
            for queue, row in self._sums.items()
        }
        # a new dict each call (the decisions hold it); a resource's shares come from memory when asked
        # with the same queues and demand as last time (see fairshare._LAST)
        return fair_shares(list(self.queues.values()), demand, capacity, self.config.usage_weight)

    def _ordering_of(self, queue: str) -> str:
        q = self.queues.get(queue)
        return q.ordering if q is not None and q.ordering is not None else self.config.ordering

    def _pending_order(self) -> dict[str, list[WorkloadView]]:
        # The groups in the order their first workload comes: with fair share, each queue's pending work
        # (the first pass made the queues with pending work first, in that order), else all of it.
        by_queue: dict[str, list[WorkloadView]]
        if self.config.fair_share:
            by_queue = {name: row.pending for name, row in self._sums.items() if row.pending}
        else:
            by_queue = {GLOBAL: list(self.snapshot.pending)} if self.snapshot.pending else {}
        thresholds = self.config.las_thresholds
        least = self._least
        for name, items in by_queue.items():
            fewest = items[0].gpu_units
            for w in items:
                if w.gpu_units < fewest:
                    fewest = w.gpu_units
            least[name] = fewest
            ordering = self._ordering_of(name) if name != GLOBAL else self.config.ordering
            by_queue[name] = in_order(name, ordering, thresholds, items)
        return by_queue

    def fair(self, queue: str, resource: str = "gpu") -> float:
        shares = self.shares.get(queue)
        return 0.0 if shares is None else shares.get(resource, 0.0)

    def reclaim_floor(self, queue: str, floor: str) -> float:
        """What reclaim leaves a victim queue (or level) at least: its fair share, or its GPU quota."""
        if floor == "quota":
            q = self.queues.get(queue)
            return q.gpu.quota if q is not None else 0.0
        return self.fair(queue)

    def pending_groups(self) -> list[str]:
        """Allocation order of the pending work's groups: queues, most under-served first (GLOBAL alone when
        fair share is off). A phase walks them in this order and each group's work in its own order,
        reading whether a workload is still unplaced when its turn comes (`still_unplaced`): one placed
        since is skipped, and one whose bind was taken back earlier in the phase takes its turn, as the
        next cycle would give it one."""
        # The keys are unique (each ends with its queue's name): sorting them sorts the queues. Keyed in
        # compiled code, not by `sorted(..., key=)` calling back through the interpreter for each queue.
        keys = [self._queue_key(queue) for queue in self.order]
        keys.sort()
        return [key[3] for key in keys]

    def still_unplaced(self, w: WorkloadView) -> bool:
        return w.key in self.unplaced

    def _least_gpus(self, queue: str) -> float:
        """The fewest GPUs any pending workload of `queue` asks for."""
        return self._least.get(queue, 0.0)

    def _queue_key(self, queue: str) -> tuple[bool, int, float, str]:
        """Allocation order of queues: those below their fair share first, then by queue priority, then
        by allocated / fair share. A high-priority queue borrowing above its share never goes before a
        queue still owed its share: what it took, reclaim would take back next cycle."""
        ratio = self._ratio(queue)
        return (ratio >= 1.0 - EPSILON, -self._priority(queue), ratio, queue)

    def _priority(self, queue: str) -> int:
        q = self.queues.get(queue)
        return q.priority if q is not None else 0

    def _ratio(self, queue: str) -> float:
        if queue == GLOBAL:
            return 0.0
        share = self.fair(queue)
        allocated = self.state.allocated(queue)
        return allocated / share if share > EPSILON else (float("inf") if allocated > 0 else 1e9)

    def _evict(self, w: WorkloadView, code: str, reason: str, for_workload: int | None = None) -> None:
        if w.id in self.state.evicted:
            return
        self.state.evict(w, code)
        self.decisions.evictions.append(Eviction(w.id, code, reason, for_workload))
        if for_workload is None:
            self._ownerless += 1

    def _bind(self, w: WorkloadView, placed: tuple[PodPlacement, ...]) -> None:
        self.decisions.binds.append(Bind(w.id, placed))
        del self.unplaced[w.key]
        self.decisions.explanations.pop(w.key, None)
        ends = self._ends
        for pod in placed:
            self.by_node.setdefault(pod.node, []).append(w)
            if ends:
                ends.pop(pod.node, None)  # built again with `w` when a reservation next asks

    def _shape(self, w: WorkloadView) -> tuple[object, ...]:
        reservation = self.state.reservation
        ends_in_time = (
            reservation is not None
            and w.max_duration is not None
            and self.now + w.max_duration <= reservation.start
        )
        if ends_in_time and reservation is not None and not reservation.relative:
            self.state.expires(reservation.start - (w.max_duration or 0.0))
        demand = w.gpus
        return (
            demand.count, demand.models, demand.min_memory_bytes, w.cpus, w.memory_bytes, w.nodes,
            w.topology, w.topology_preferred, ends_in_time, w.node_names,
        )  # fmt: skip

    def explained_all(self) -> bool:
        """Whether every workload left unplaced has its explanation.

        Each explanation is of a pending workload that is not bound: one still unplaced, or one waiting for
        GPUs being released (explained as it left `unplaced`, and nominated). So, with the ids unique, the
        counts tell, without walking the keys (a walk was 2% of a cycle with a hundred and more pending);
        with ids repeated, or counts that differ, the keys are compared (in C: no id made a Python int)."""
        explanations = self.decisions.explanations
        if self._ids_unique and len(explanations) == len(self.unplaced) + len(self.decisions.nominated):
            return True
        return explanations.keys() >= self.unplaced.keys()

    def ahead_of(self, w: WorkloadView, place: int = -1) -> int:
        """How many workloads come before `w` in its group's pending order (`place`: its index there, when
        the caller walking that order knows it)."""
        if place >= 0 and self._ids_unique:
            return place
        if self._rank is None:
            self._rank = {v.id: i for vs in self.order.values() for i, v in enumerate(vs)}
        return self._rank.get(w.id, 0)

    def _waiting_ahead(self, w: WorkloadView, place: int = -1) -> int:
        """How many workloads come before `w` in its group's pending order that may start (`ahead_of`), less
        those that can never fit the pool: they hold no one back, and "3 workloads ahead" of a queue whose
        only other work is a 16-GPU job on 8 GPUs misled."""
        ahead = self.ahead_of(w, place)
        if ahead == 0 or not self._never_ids:
            return ahead
        group = w.queue if self.config.fair_share else GLOBAL
        before = self._never_before.get(group)
        if before is None:
            before = []
            count = 0
            for v in self.order.get(group, ()):
                before.append(count)
                if v.id in self._never_ids:
                    count += 1
            self._never_before[group] = before
        return ahead - before[ahead] if ahead < len(before) else ahead

    def _freeing_for(self, queue: str) -> float:
        """GPUs allocated to `queue` (and the queues below it) that stopping work is still releasing: those
        of its work left waiting for them (`Decisions.nominated`), counted in `state.allocated` though not
        yet running (`gpupool queues` counts running work only)."""
        total = 0.0
        for wid in self.decisions.nominated:
            w = self._pending_by_id.get(wid)
            if w is not None and queue in self.state.chain(w.queue):
                total += w.gpu_units
        return total

    def _capacity_explanation(self, w: WorkloadView, why: Explanation, place: int = -1) -> Explanation:
        """Personalise a (possibly cached) capacity explanation for this workload and its queue (`place`:
        see `ahead_of`)."""
        if why.code == explain.NO_CAPACITY:
            ahead = self._waiting_ahead(w, place)
            queue = w.queue
            changes = len(self.state.accounted)
            # Asked for each workload left pending, one queue after another: the queue's standing is the
            # last one's while the queue and the allocations (`state.accounted` grows with each) are.
            if queue != self._standing_queue or changes != self._standing_changes:
                self._standing_queue, self._standing_changes = queue, changes
                allocated, fair = self.state.allocated(queue), self.fair(queue)
                # one tuple for all the queue's sentences
                self._standing = (queue, allocated, fair, self._freeing_for(queue))
                self._standing_over = self.config.fair_share and allocated + EPSILON >= fair
            if self._standing_over:
                return explain.over_fair_share(self._standing, ahead)
            return explain.no_capacity(w, self.state.free_gpus(), ahead)
        return why


def same_shape(a: WorkloadView, b: WorkloadView) -> bool:
    """Whether `a` and `b` are of one queue and `Prepared._shape` gives them equal shapes while no
    reservation is in force: asked field by field, by identity first, without building either shape."""
    x, y = a.gpus, b.gpus
    return (
        a.queue == b.queue
        and (
            x is y
            or (
                x.count == y.count
                and same(x.models, y.models)
                and same(x.min_memory_bytes, y.min_memory_bytes)
            )
        )
        and a.cpus == b.cpus
        and a.memory_bytes == b.memory_bytes
        and a.nodes == b.nodes
        and same(a.topology, b.topology)
        and same(a.topology_preferred, b.topology_preferred)
        and same(a.node_names, b.node_names)
    )


def same(a: object, b: object) -> bool:
    """Equal, asked by identity first: the usual values (`()`, `None`, `frozenset()`) are shared objects,
    and compiled code compares two tuples or optional values only through the interpreter."""
    return a is b or a == b
