"""One scheduling cycle: a fixed pipeline of actions over a tentative state, least disruptive first.

stale_gang -> allocate -> consolidate -> reclaim -> preempt. Each action tries scenarios on the state and
keeps only whole, feasible ones (see state.py's undo log). The cycle is pure: it reads the snapshot and
`now`, and returns Decisions.
"""

from __future__ import annotations

import bisect
import heapq
import operator
from collections.abc import Callable, Iterator

from gpupool.scheduler import explain
from gpupool.scheduler.fairshare import fair_shares
from gpupool.scheduler.ordering import order_key
from gpupool.scheduler.placement import Placer, families
from gpupool.scheduler.snapshot import (
    RESOURCES,
    Bind,
    Decisions,
    Eviction,
    Explanation,
    PodPlacement,
    QueueView,
    Snapshot,
    WorkloadView,
)
from gpupool.scheduler.state import EPSILON, MIXED, ClusterState, NodeState, Reservation, Sums

ACTIONS = ("stale_gang", "allocate", "consolidate", "reclaim", "preempt")
PLACEMENTS = ("binpack", "spread", "fragmentation")
BLOCKING = ("skip", "strict", "backfill")
# A pod on a lost node is gone. A pod on an unhealthy node still runs: the health loop drains such a node's
# work gracefully (checkpoint, then stop), and its own check jobs run there; only a gang, whose other pods
# cannot go on without it, is restarted whole at once.
LOST_STATES = frozenset({"lost"})
GANG_LOST_STATES = frozenset({"lost", "unhealthy"})
MAX_CONSOLIDATION_TRIES = 8
MAX_CONSOLIDATION_TARGETS = 8  # nodes per pod considered for emptying
MIN_MOVE_AGE = 60.0  # seconds a workload runs before consolidation may move it
# An eviction search examines nodes likeliest first; it gives up after SEARCH_LIMIT nodes with no choice,
# and settles SEARCH_LIMIT_AFTER_PICK nodes after its first choice.
SEARCH_LIMIT = 128
SEARCH_LIMIT_AFTER_PICK = 16
SMALL_SEARCH = 64  # a search ranks up to this many candidate nodes outright
# A node where victims might make room: the node, an upper bound on the GPUs they could free, the victims.
_AbleNode = tuple[NodeState, float, list[WorkloadView]]
GLOBAL = "*"
NO_ROOM = Explanation(explain.NO_CAPACITY, "")  # a capacity miss whose sentence is written per workload
_UNKNOWN = Explanation("", "")  # not yet in a cache whose values may be None (compared by identity)


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


class Cycle:
    def __init__(self, snapshot: Snapshot, now: float) -> None:
        validate(snapshot)
        self.snapshot = snapshot
        self.config = snapshot.config
        self.now = now
        self.decisions = Decisions()
        queues = {q.name: q for q in snapshot.queues}
        for name in sorted({w.queue for w in snapshot.pending} | {w.queue for w in snapshot.running}):
            if name not in queues:
                queues[name] = QueueView(name)  # work in an unknown queue: a queue with no quota
        self.queues = queues
        # whether any queue sets a minimum runtime above zero (else work is old enough once it started)
        self._floors = any(
            (q.min_runtime_preempt or 0.0) > 0 or (q.min_runtime_reclaim or 0.0) > 0 for q in queues.values()
        )
        self.state = ClusterState(snapshot.nodes, queues.values())
        self._capacity = tuple(self.state.capacity)  # before running work is loaded
        self.placer = Placer(self.state, self.config.placement, now, (snapshot.pending, snapshot.running))
        self.by_node: dict[str, list[WorkloadView]] = {}
        self.state.load_running(snapshot.running)
        by_node = self.by_node
        for w in snapshot.running:
            for pod in w.placement:
                on_node = by_node.get(pod.node)
                if on_node is None:
                    on_node = by_node[pod.node] = []
                on_node.append(w)
        self.shares = self._fair_shares()
        self.decisions.fair_shares = self.shares
        self.unplaced: dict[int, WorkloadView] = {w.id: w for w in snapshot.pending}
        self.order = self._pending_order()
        self.rank = {w.id: i for ws in self.order.values() for i, w in enumerate(ws)}
        self.failed: dict[tuple[object, ...], tuple[int, Explanation]] = {}
        self._never: dict[tuple[object, ...], Explanation | None] = {}
        self._no_release_fit: dict[tuple[object, ...], tuple[int, int]] = {}
        self._no_victims: dict[tuple[object, ...], tuple[int, int]] = {}
        self._smallest_miss: dict[tuple[object, ...], tuple[tuple[int, int], float]] = {}
        self._runtime_floor: dict[tuple[str, str], float] = {}
        self._queue_limits: dict[str, list[tuple[str, int, float]]] = {}
        self._groups: dict[str, list[WorkloadView]] | None = None  # see _victim_groups
        self._index: dict[str, list[WorkloadView]] | None = None
        self._pending_by_id = dict(self.unplaced)
        self._tentative: dict[int, WorkloadView] = {}  # this cycle's binds, as pending views
        self._retracted: set[int] = set()
        self._retracted_now: set[int] = set()  # since the last pending_groups()
        self._old: dict[str, dict[int, bool]] = {"preempt": {}, "reclaim": {}}  # kind -> workload id -> old
        # (ids of a candidates and a units dict, GPUs needed) -> (able nodes, how much of state.freed they
        # have seen, the dicts: they keep their ids alive)
        self._able_cache: dict[tuple[int, int, float], tuple[dict[str, _AbleNode], int, object]] = {}
        # (ids of a candidates and a units dict) -> (see _able_base, the dicts: they keep their ids alive)
        self._able_bases: dict[tuple[int, int], tuple[dict[str, _AbleNode], list[_AbleNode], object]] = {}
        self._victim_queue_names: list[str] | None = None
        self._least: dict[str, float] = {}
        self._reclaim_gpus: dict[str, dict[str, float]] | None = None  # see _gpus_by_queue
        self._by_queue: dict[str, dict[str, list[WorkloadView]]] | None = None
        self._lowest: dict[str, int] | None = None
        self._surplus: dict[str, float] = {}  # victim queue -> GPUs above its fair share
        self._surplus_total = 0.0
        self._surplus_seen = -1  # how much of state.accounted `_surplus` has seen (-1: not built yet)
        self._node_kinds: list[list[NodeState]] | None = None
        self.schedulable_nodes = sum(1 for n in snapshot.nodes if n.schedulable)

    # -- setup ----------------------------------------------------------------------------------------

    def _fair_shares(self) -> dict[str, dict[str, float]]:
        capacity = dict(zip(RESOURCES, self._capacity, strict=True))
        sums: dict[str, Sums] = {}
        for workloads in (self.snapshot.pending, self.snapshot.running):
            for w in workloads:
                row = sums.get(w.queue)
                if row is None:
                    row = sums[w.queue] = Sums()
                row.add(w)
        demand = {
            queue: {"gpu": row.gpu, "cpu": row.cpu, "memory": row.memory} for queue, row in sums.items()
        }
        return fair_shares(list(self.queues.values()), demand, capacity, self.config.usage_weight)

    def _ordering_of(self, queue: str) -> str:
        q = self.queues.get(queue)
        return q.ordering if q is not None and q.ordering is not None else self.config.ordering

    def _pending_order(self) -> dict[str, list[WorkloadView]]:
        by_queue: dict[str, list[WorkloadView]] = {}
        fair_share = self.config.fair_share
        for w in self.snapshot.pending:
            key = w.queue if fair_share else GLOBAL
            items = by_queue.get(key)
            if items is None:
                items = by_queue[key] = []
            items.append(w)
        thresholds = self.config.las_thresholds
        for name, items in by_queue.items():
            key_of = order_key(self._ordering_of(name) if name != GLOBAL else self.config.ordering)
            items.sort(key=lambda w: key_of(w, thresholds))
        return by_queue

    def fair(self, queue: str, resource: str = "gpu") -> float:
        shares = self.shares.get(queue)
        return 0.0 if shares is None else shares.get(resource, 0.0)

    def pending_groups(self) -> list[str]:
        """Allocation order of the pending work's groups: queues, most under-served first (GLOBAL alone when
        fair share is off). A phase walks them in this order and each group's work in its own order,
        reading whether a workload is still unplaced when its turn comes (`still_unplaced`): one placed
        since is skipped, and one whose bind was taken back during the phase was not unplaced in it."""
        self._retracted_now.clear()
        return sorted(self.order, key=self._queue_key)

    def still_unplaced(self, w: WorkloadView) -> bool:
        return w.id in self.unplaced and w.id not in self._retracted_now

    def _least_gpus(self, queue: str) -> float:
        """The fewest GPUs any pending workload of `queue` asks for."""
        found = self._least.get(queue)
        if found is None:
            found = self._least[queue] = min((w.gpu_units for w in self.order.get(queue, ())), default=0.0)
        return found

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

    # -- the pipeline ---------------------------------------------------------------------------------

    def run(self) -> Decisions:
        for action in self.config.actions:
            getattr(self, action)()
        if self._retracted:
            binds = self.decisions.binds
            self.decisions.binds = [b for b in binds if b.workload_id not in self._retracted]
        return self.decisions

    # -- stale gangs ----------------------------------------------------------------------------------

    def stale_gang(self) -> None:
        nodes = {n.name: n for n in self.snapshot.nodes}
        for w in self.snapshot.running:
            if w.stopping:
                continue
            gone = GANG_LOST_STATES if len(w.placement) > 1 else LOST_STATES
            lost: list[str] = []
            for pod in w.placement:
                node = nodes.get(pod.node)
                if node is None or node.state in gone:
                    lost.append(pod.node)
            if lost or len(w.placement) < w.nodes:
                where = ", ".join(sorted(set(lost))) or "a missing pod"
                self._evict(
                    w, "stale-gang", f"gang lost part of its placement ({where}); restarting it whole"
                )

    def _evict(self, w: WorkloadView, code: str, reason: str, for_workload: int | None = None) -> None:
        if w.id in self.state.evicted:
            return
        self.state.evict(w, code)
        self.decisions.evictions.append(Eviction(w.id, code, reason, for_workload))

    # -- allocate -------------------------------------------------------------------------------------

    def allocate(self) -> None:
        heap = [self._queue_key(q) for q in self.order]
        heapq.heapify(heap)
        cursor = dict.fromkeys(self.order, 0)
        accounted = self.state.accounted
        while heap:
            key = heapq.heappop(heap)
            queue = key[-1]
            items = self.order[queue]
            i = cursor[queue]
            while i < len(items) and items[i].id not in self.unplaced:
                i += 1
            if i >= len(items):
                continue
            w = items[i]
            cursor[queue] = i + 1
            changes = len(accounted)
            placed = self._try_allocate(w)
            if (
                not placed
                and self.config.blocking == "strict"
                and self.decisions.explanations[w.id].code in (explain.CAPACITY_CODES | {explain.QUEUE_LIMIT})
            ):
                for rest in items[i + 1 :]:
                    if rest.id in self.unplaced:
                        self.decisions.explanations[rest.id] = explain.blocked(w.id)
                continue
            # Its key moves only with its allocation: with nothing allocated or taken back, it is the same.
            heapq.heappush(heap, key if len(accounted) == changes else self._queue_key(queue))

    def _try_allocate(self, w: WorkloadView) -> bool:
        refusal = self._admission(w)
        if refusal is not None:
            self.decisions.explanations[w.id] = refusal
            return False
        state = self.state
        if w.gpu_units > state.free_total + EPSILON:
            why = NO_ROOM  # what placing would conclude, sooner; the sentence is written below
        elif (cached := self.failed.get(shape := self._shape(w))) is not None and cached[
            0
        ] == state.generation:
            why = cached[1]
        else:
            placed = self.placer.place_gang(w)
            if placed is not None:
                self._bind(w, placed)
                return True
            why = self._why_not_placed(w)
            self.failed[shape] = (self.state.generation, why)
        # GPUs that stopping work releases go to waiting work in allocation order, like free ones: claimed
        # here, before later work could take the free GPUs such a claim also needs.
        if why.code in explain.CAPACITY_CODES and self._fits_after_release(w):
            return False
        self.decisions.explanations[w.id] = self._capacity_explanation(w, why)
        if (
            self.config.blocking == "backfill"
            and self.state.reservation is None
            and why.code != explain.TOO_LARGE
        ):
            self._reserve(w)
        return False

    def _bind(self, w: WorkloadView, placed: tuple[PodPlacement, ...]) -> None:
        self.decisions.binds.append(Bind(w.id, placed))
        del self.unplaced[w.id]
        self.decisions.explanations.pop(w.id, None)
        for pod in placed:
            self.by_node.setdefault(pod.node, []).append(w)

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

    def _admission(self, w: WorkloadView) -> Explanation | None:
        """Queue limits, the quota rule for non-preemptible work, and whether it could ever fit."""
        state = self.state
        limits = self._limits(w.queue)
        if limits:
            wants = (w.gpus.count * w.nodes, w.cpus * w.nodes, float(w.memory_bytes * w.nodes))
            for name, position, limit in limits:
                allocated = state.alloc[name][position]
                if allocated + wants[position] > limit + EPSILON:
                    return explain.queue_limit(name, RESOURCES[position], allocated, limit)
        if not w.preemptible and w.gpu_units > 0:
            for name in state.chain(w.queue):
                queue = self.queues.get(name)
                if queue is None:
                    continue
                quota = queue.gpu.quota
                would = state.allocated_np(name) + w.gpu_units
                if would > quota + EPSILON:
                    return explain.over_quota_nonpreemptible(name, would, quota)
        return self._never_fits(w)

    def _limits(self, queue: str) -> list[tuple[str, int, float]]:
        """(queue, resource position, limit) for every limit set on `queue` or above it."""
        found = self._queue_limits.get(queue)
        if found is None:
            found = []
            for name in self.state.chain(queue):
                q = self.queues.get(name)
                if q is None:
                    continue
                for position, resource in enumerate(RESOURCES):
                    limit = q.share(resource).limit
                    if limit is not None:
                        found.append((name, position, limit))
            self._queue_limits[queue] = found
        return found

    def _never_fits(self, w: WorkloadView) -> Explanation | None:
        demand = w.gpus
        key = (demand.count, demand.models, demand.min_memory_bytes, w.nodes, w.node_names)
        found = self._never.get(key, _UNKNOWN)
        if found is _UNKNOWN:
            found = self._never[key] = self._never_fits_shape(w)
        return found

    def _never_fits_shape(self, w: WorkloadView) -> Explanation | None:
        if w.node_names:
            return self._never_fits_named(w)
        if w.nodes > len(self.snapshot.nodes):
            return explain.too_large(w, f"needs {w.nodes} nodes; the pool has {len(self.snapshot.nodes)}")
        if w.nodes > self.schedulable_nodes:
            return explain.unschedulable_nodes(w, self.snapshot.nodes)
        if w.gpus.count <= 0:
            return None
        kinds = [(sum(self.placer.matches(group[0], w.gpus)), len(group)) for group in self._kinds()]
        matching = [(count, many) for count, many in kinds if count > 0]
        if not matching:
            return explain.no_matching_gpu(w)
        biggest = max(count for count, _ in matching)
        if w.gpus.count > biggest:
            return explain.too_large(w, f"needs {w.gpus.count:g} GPUs on one node; the largest has {biggest}")
        able = sum(many for count, many in matching if count >= w.gpus.count)
        if w.nodes > able:
            return explain.too_large(
                w, f"needs {w.nodes} nodes with {w.gpus.count:g} matching GPUs; {able} have them"
            )
        return None

    def _never_fits_named(self, w: WorkloadView) -> Explanation | None:
        """The same questions for a workload that may run only on the nodes it names."""
        names = sorted(w.node_names)
        listed = _listed(w.node_names)
        views = {n.name: n for n in self.snapshot.nodes if n.name in w.node_names}
        usable = [self.state.nodes[name] for name in names if name in views and views[name].schedulable]
        if len(usable) < w.nodes:
            why = [f"{name} is not in the pool" for name in names if name not in views]
            why += [f"{name} is {views[name].state}" for name in names if name in views and name not in
                    {n.name for n in usable}]  # fmt: skip
            return explain.named_nodes(w, listed, "; ".join(why[:5]))
        if w.gpus.count <= 0:
            return None
        able = sum(1 for node in usable if sum(self.placer.matches(node, w.gpus)) >= w.gpus.count)
        if able < w.nodes:
            return explain.too_large(
                w,
                f"needs {w.nodes} of its named nodes ({listed}) with {explain.gpu_text(w)}; {able} have them",
            )
        return None

    def _kinds(self) -> list[list[NodeState]]:
        """Schedulable nodes grouped by GPU make-up (nodes alike answer every GPU question alike)."""
        if self._node_kinds is None:
            groups: dict[tuple[tuple[str, int], ...], list[NodeState]] = {}
            for node in self.state.nodes.values():
                if node.schedulable:
                    groups.setdefault(node.signature, []).append(node)
            self._node_kinds = list(groups.values())
        return self._node_kinds

    def _why_not_placed(self, w: WorkloadView) -> Explanation:
        reservation = self.state.reservation
        if reservation is not None and reservation.workload_id != w.id:
            saved, self.state.reservation = reservation, None
            checkpoint, generation = self.state.checkpoint(), self.state.generation
            fits = self.placer.place_gang(w) is not None
            self.state.rollback(checkpoint)
            self.state.generation = generation
            self.state.reservation = saved
            if fits:
                if self.now < reservation.start < float("inf"):
                    self.state.expires(reservation.start)  # from then on the sentence says "from now"
                return explain.reserved(reservation.workload_id, reservation.start, self.now)
        if w.node_names:
            named = [self.state.nodes[n] for n in sorted(w.node_names) if n in self.state.nodes]
            free = sum((node.free_sum for node in named if node.schedulable), 0.0)
            return explain.named_nodes_full(w, _listed(w.node_names), free)
        free_matching = self.state.whole_free(families(w.gpus))
        if not w.gpus.is_fractional and w.gpu_units > 0 and free_matching + EPSILON >= w.gpu_units:
            block, node = self.state.largest_free_block()
            return explain.fragmented(w, block, node)
        return explain.no_capacity(w, self.state.free_gpus(), 0)

    def _capacity_explanation(self, w: WorkloadView, why: Explanation) -> Explanation:
        """Personalise a (possibly cached) capacity explanation for this workload and its queue."""
        if why.code == explain.NO_CAPACITY:
            ahead = self.rank.get(w.id, 0)
            allocated, fair = self.state.allocated(w.queue), self.fair(w.queue)
            if self.config.fair_share and allocated + EPSILON >= fair:
                return explain.over_fair_share(w.queue, allocated, fair, ahead)
            return explain.no_capacity(w, self.state.free_gpus(), ahead)
        return why

    # -- backfill reservation -------------------------------------------------------------------------

    def _reserve(self, w: WorkloadView) -> None:
        """Reserve the nodes where `w` could start soonest, judging by running work's declared ends."""
        if w.gpus.is_fractional or w.gpus.count <= 0:
            return
        need = int(w.gpus.count)
        ready: list[tuple[float, str]] = []
        for node in self.state.nodes.values():
            if not node.schedulable or (w.node_names and node.name not in w.node_names):
                continue
            suits = self.placer.matches(node, w.gpus)
            matching = [i for i, ok in enumerate(suits) if ok]
            if len(matching) < need:
                continue
            free_now = sum(1 for i in matching if node.free[i] >= 1 - EPSILON)
            when = self.now
            if free_now < need:
                ends = sorted(
                    (self._end(r), sum(1 for p in r.placement if p.node == node.name for _ in p.gpu_indices))
                    for r in self.by_node.get(node.name, [])
                    if r.id not in self.state.evicted
                )
                freed, when = free_now, float("inf")
                for end, gpus in ends:
                    freed += gpus
                    if freed >= need:
                        when = end
                        break
                if self.now < when < float("inf"):
                    self.state.expires(when)  # from then on this node ranks as free now
            ready.append((when, node.name))
        if len(ready) < w.nodes:
            return
        ready.sort()
        chosen = ready[: w.nodes]
        start = max(t for t, _ in chosen)
        self.state.reservation = Reservation(
            w.id, frozenset(n for _, n in chosen), start, relative=start == self.now
        )

    def _end(self, w: WorkloadView) -> float:
        if w.max_duration is None:
            return float("inf")
        if w.start_time is None:
            self.state.expires(self.now)  # an end counted from the clock itself: nothing to remember
            return self.now + w.max_duration
        return w.start_time + w.max_duration

    # -- evictions for a pending workload -------------------------------------------------------------

    def _fits_after_release(self, w: WorkloadView) -> bool:
        """If `w` fits once stopping work is gone, take that room for it (so no one else counts it)."""
        state = self.state
        if not state.holding_nodes or w.gpu_units > state.free_total + state.held_total + EPSILON:
            return False
        key = self._shape(w)
        stamp = (state.generation, state.held_generation)
        if self._no_release_fit.get(key) == stamp:
            return False
        placed = self.placer.place_gang(w, after_release=True)
        if placed is None:
            self._no_release_fit[key] = stamp
            return False
        self.decisions.explanations[w.id] = explain.waiting_for_release(w)
        del self.unplaced[w.id]
        return True

    def _evict_for(
        self,
        w: WorkloadView,
        candidates: dict[str, list[WorkloadView]],
        code: str,
        reason: Callable[[WorkloadView], str],
        allowed: Callable[[WorkloadView], bool],
        units: dict[str, float],
        budget: _Budget | None = None,
    ) -> bool:
        """Evict the fewest, cheapest victims that let `w` fit; all or nothing. `units`: an upper bound,
        per node, on the GPUs the taker's victims there hold.

        `candidates`: possible victims by node, each list in victim order (fewest GPUs, lowest priority,
        least work lost, newest); gangs are not among them."""
        state = self.state
        # Whose victims a search may take: for preempt the lower-priority work of w's own queue; for
        # reclaim, what queues outside w's line hold above their fair share. Every reclaimer is below its
        # own fair share, so reclaimers under the same parents may take the very same victims and share
        # their misses.
        who: object = (w.queue, w.priority) if code != "reclaim" else state.chain(w.queue)[1:]
        key = (code, who, self._shape(w))
        # A search that found nothing stays a miss for the rest of the cycle unless capacity is given
        # back: other evictions only take victims away (their gainers take the GPUs they free). What
        # this might miss, the next cycle finds.
        stamp = (state.generation, 0)
        if self._no_victims.get(key) == stamp:
            return False
        # Needing more of the same GPUs can only be harder: a single pod's miss covers any larger pod, and
        # any gang of them (one of its pods would need victims that a single pod could have had).
        family = (code, who, w.gpus.models, w.gpus.min_memory_bytes, w.node_names, self._shape(w)[-2])
        smallest = self._smallest_miss.get(family)
        if smallest is not None and smallest[0] == stamp and w.gpus.count >= smallest[1]:
            return False
        if self._evict_by_nodes(w, candidates, code, reason, allowed, key, stamp, budget, units):
            return True
        single = w.nodes == 1 and not (w.topology or w.topology_preferred)
        if single and (smallest is None or smallest[0] != stamp or w.gpus.count < smallest[1]):
            self._smallest_miss[family] = (stamp, w.gpus.count)
        return False

    def _evict_by_nodes(
        self,
        w: WorkloadView,
        candidates: dict[str, list[WorkloadView]],
        code: str,
        reason: Callable[[WorkloadView], str],
        allowed: Callable[[WorkloadView], bool],
        key: tuple[object, ...],
        stamp: tuple[int, int],
        budget: _Budget | None,
        units: dict[str, float],
    ) -> bool:
        """Per node, the cheapest victims there that make room for one pod, counted without touching the
        state; then the cheapest `w.nodes` nodes (inside one topology domain when required). `units`:
        an upper bound, per node, on the GPUs the candidates there hold.

        Nodes are examined in order of a lower bound on the GPUs that must be freed there (nodes with
        more room first), and the search stops once a choice is found and either no later node can be
        cheaper in GPUs or SEARCH_LIMIT_AFTER_PICK more nodes were examined."""
        state = self.state
        able: dict[str, _AbleNode] | None = None
        if not w.gpus.is_fractional and w.gpus.count >= 1:
            able = self._able(candidates, units, w.gpus.count)
        options: dict[str, tuple[tuple[float, ...], list[WorkloadView]]] = {}
        picked: list[str] | None = None
        worst = 0.0  # most GPUs disrupted on one node of the current pick
        since_pick = misses = 0
        whole_pod, need = not w.gpus.is_fractional, w.gpus.count
        for bound, node in self._search_order(w, candidates, able, units):
            if picked is not None:
                since_pick += 1  # counted from the first feasible pick: later ones only refine it
                if bound > worst + EPSILON or since_pick > SEARCH_LIMIT_AFTER_PICK:
                    break
            else:
                misses += 1
                if misses > SEARCH_LIMIT:
                    break  # bounded effort: the likeliest nodes came first
            if w.gpus.count > 0 and not any(self.placer.matches(node, w.gpus)):
                continue
            if not self.placer.node_admits(node, w):
                continue
            if whole_pod and node.released + units.get(node.name, 0.0) + EPSILON < need:
                continue  # even every victim there would not make room
            if able is None:
                pool = candidates.get(node.name, ())
            else:
                entry = able.get(node.name)
                pool = entry[2] if entry is not None else ()
            victims = [v for v in pool if v.id not in state.evicted and allowed(v)]
            if not victims and able is not None:
                # Later searches of the same taker skip the node: victims only go, minimum runtimes are
                # the cycle's, and headroom shrinks as reclaim evicts (a parent queue that the gainers'
                # binds lift above its share is the exception; what that misses, the next cycle finds).
                able.pop(node.name, None)
            if not victims and w.nodes == 1:
                continue  # a single pod fitting with no victims would have fitted after release already
            if whole_pod and node.released + sum((v.gpus.count for v in victims), 0.0) + EPSILON < need:
                continue
            chosen = self._cheapest_room(node, w, victims, budget)
            if chosen is None:
                continue
            cost = self._cost(chosen)
            options[node.name] = (cost, chosen)
            if w.nodes == 1 and not (w.topology or w.topology_preferred):
                if picked is None or (cost, node.name) < (options[picked[0]][0], picked[0]):
                    picked, worst = [node.name], cost[0]
            elif len(options) >= w.nodes:
                again = self._pick_nodes(w, options)
                if again is not None:
                    picked = again
                    worst = max(options[name][0][0] for name in picked)
        if picked is None or not any(options[name][1] for name in picked):
            self._no_victims[key] = stamp
            return False
        victims = [v for name in picked for v in options[name][1]]
        if budget is not None and not budget.admits(victims):
            self._no_victims[key] = stamp
            return False
        checkpoint, generation = state.checkpoint(), state.generation
        for victim in victims:
            state.evict(victim, code)
        trial = state.checkpoint()
        if self.placer.place_gang(w, after_release=True) is None:
            state.rollback(checkpoint)
            state.generation = generation
            self._no_victims[key] = stamp
            return False
        if not any(victim.id in self._tentative for victim in victims):
            # The trial is the outcome: the same evictions and the same room after release that doing it
            # again would give. Only a bind of this cycle among the victims is taken back differently.
            for victim in victims:
                self.decisions.evictions.append(Eviction(victim.id, code, reason(victim), w.id))
            if state.reservation is not None and state.reservation.workload_id == w.id:
                state.reservation = None
            self.decisions.explanations[w.id] = explain.waiting_for_release(w)
            del self.unplaced[w.id]
            return True
        state.rollback(trial)
        state.rollback(checkpoint)
        state.generation = generation
        stopping = False
        for victim in victims:
            if victim.id in self._tentative:
                self._retract(victim)
            else:
                self._evict(victim, code, reason(victim), w.id)
                stopping = True
        if state.reservation is not None and state.reservation.workload_id == w.id:
            state.reservation = None
        placed = None if stopping else self.placer.place_gang(w)
        if placed is not None:  # only binds of this cycle gave way: nothing to wait for
            self._bind(w, placed)
            return True
        placed = self.placer.place_gang(w, after_release=True)
        assert placed is not None
        self.decisions.explanations[w.id] = explain.waiting_for_release(w)
        del self.unplaced[w.id]
        return True

    def _retract(self, v: WorkloadView) -> None:
        """Take back this cycle's bind of `v` (it never started): its room goes to the gainer at once, and
        `v` stays pending, explained. Cheaper than starting it now and evicting it next cycle."""
        original = self._tentative[v.id]
        self.state.release(original, v.placement)
        self._retracted.add(v.id)
        self._retracted_now.add(v.id)
        self.unplaced[v.id] = original
        self.decisions.explanations[v.id] = self._capacity_explanation(
            original, explain.no_capacity(original, self.state.free_gpus(), 0)
        )

    def _able(
        self, candidates: dict[str, list[WorkloadView]], units: dict[str, float], need: float
    ) -> dict[str, _AbleNode]:
        """The candidate nodes with victims where `need` whole GPUs could be freed at all: GPUs free or
        released there plus the victims' GPUs (`units`, an upper bound). A node with room but no victims
        is left out: a single pod would have fitted there after release already, and a gang's search
        walks the nodes with room first anyway. Kept for the cycle: evictions only move victims' GPUs to
        released, so a node left out stays out until capacity is given back on it (state.freed), when
        it is looked at again; a node in it that no longer qualifies is skipped by the search."""
        key = (id(candidates), id(units), need)
        found = self._able_cache.get(key)
        freed = self.state.freed
        if found is None:
            base, fewest_first = self._able_base(candidates, units)
            # From `cut` on, the victims alone could free enough; before it, a node qualifies only with
            # GPUs free or released there already (few nodes have any by now).
            cut = bisect.bisect_left(fewest_first, need, key=_able_gpus)
            able: dict[str, _AbleNode]
            if cut * 2 <= len(fewest_first):
                able = dict(base)
                for entry in fewest_first[:cut]:
                    if entry[0].released + entry[1] + EPSILON < need:
                        del able[entry[0].name]
            else:
                able = {entry[0].name: entry for entry in fewest_first[cut:]}
                for name in self.state.releasing():
                    there = base.get(name)
                    if there is not None and there[0].released + there[1] + EPSILON >= need:
                        able[name] = there
            found = self._able_cache[key] = (able, len(freed), (candidates, units))
        elif found[1] < len(freed):
            able = found[0]
            base = self._able_base(candidates, units)[0]
            for name in freed[found[1] :]:
                again = base.get(name)
                if again is not None and name not in able and again[0].released + again[1] + EPSILON >= need:
                    able[name] = again
            found = self._able_cache[key] = (able, len(freed), found[2])
        return found[0]

    def _able_base(
        self, candidates: dict[str, list[WorkloadView]], units: dict[str, float]
    ) -> tuple[dict[str, _AbleNode], list[_AbleNode]]:
        """The nodes of `units` with victims and GPUs to free, with both, by name and fewest GPUs first:
        what `_able` filters by the GPUs needed and released there (built once per pair of dicts;
        neither changes in a cycle)."""
        key = (id(candidates), id(units))
        found = self._able_bases.get(key)
        if found is None:
            nodes = self.state.nodes
            base: dict[str, _AbleNode] = {}
            for name, gpus in units.items():
                node = nodes.get(name)
                victims = candidates.get(name)
                if node is not None and gpus > 0.0 and victims:
                    base[name] = (node, gpus, victims)
            fewest_first = sorted(base.values(), key=operator.itemgetter(1))
            found = self._able_bases[key] = (base, fewest_first, (candidates, units))
        return found[0], found[1]

    def _search_order(
        self,
        w: WorkloadView,
        candidates: dict[str, list[WorkloadView]],
        able: dict[str, _AbleNode] | None,
        units: dict[str, float],
    ) -> Iterator[tuple[float, NodeState]]:
        """Nodes where room for one pod of `w` might be made (those of `able` when given, else of
        `candidates`), each with a lower bound on the GPUs that must be freed there, bounds never
        decreasing: first, for a gang, nodes that already have room; then nodes with candidate victims
        (those holding released GPUs first)."""
        state = self.state
        need = w.gpus.count if not w.gpus.is_fractional else 0.0
        seen: set[str] = set()
        if w.nodes > 1:
            for node in self._nodes_with_room(w):
                seen.add(node.name)
                yield 0.0, node
        among: dict[str, _AbleNode] | dict[str, list[WorkloadView]] = candidates if able is None else able
        if len(among) <= SMALL_SEARCH or len(among) * 8 <= len(state.nodes):
            ranked: list[tuple[float, str, NodeState]] = []
            if able is not None:
                for found, gpus, _ in able.values():
                    if not found.schedulable or found.name in seen:
                        continue
                    bound = max(0.0, need - found.released)
                    if bound <= gpus + EPSILON:  # its victims could make the room
                        ranked.append((bound, found.name, found))
            else:
                for name in candidates:
                    there = state.nodes.get(name)
                    if there is None or not there.schedulable or name in seen:
                        continue
                    bound = max(0.0, need - there.released)
                    if bound <= units.get(name, 0.0) + EPSILON:
                        ranked.append((bound, name, there))
            # Taken in order as the search asks (it often stops early); names are unique, so nodes are
            # never compared.
            heapq.heapify(ranked)
            while ranked:
                bound, _, node = heapq.heappop(ranked)
                yield bound, node
            return
        # The state does not change while a search runs, so its buckets are walked as they are.
        for count, names, holding in self._levels(w):
            bound = max(0.0, need - count)
            for name in names:
                if name in among and name not in seen:
                    node = state.nodes[name]
                    if node.holding == holding:  # a holding node is ranked by its GPUs once released
                        yield bound, node

    def _nodes_with_room(self, w: WorkloadView) -> Iterator[NodeState]:
        """Nodes where one pod of `w` has enough whole GPUs now or once stopping work is gone."""
        state = self.state
        need = w.gpus.count if not w.gpus.is_fractional else 0.0
        for count, names, holding in self._levels(w):
            if count + EPSILON < need:
                break
            for name in names:
                node = state.nodes[name]
                if node.holding == holding:
                    yield node

    def _levels(self, w: WorkloadView) -> list[tuple[int, dict[str, None], bool]]:
        """Schedulable nodes whose GPU family suits `w` in groups of equal room, the most room first:
        (whole GPUs, names, holding). Holding nodes count the GPUs they will have once released (they
        are also in the free-GPU buckets; a walker takes each node from its own kind of group only)."""
        wanted = families(w.gpus)
        levels: list[tuple[int, dict[str, None], bool]] = []
        for model, by_count in self.state.buckets.items():
            if wanted and model not in wanted and model != MIXED:
                continue
            levels.extend((count, names, False) for count, names in by_count.items() if names)
        levels.extend((count, names, True) for count, names in self.state.holding_by_count.items() if names)
        levels.sort(key=lambda item: (-item[0], item[2]))
        return levels

    def _cost(self, victims: list[WorkloadView]) -> tuple[float, ...]:
        """Fewest GPUs disrupted, then lowest priority, then least work lost, then fewest workloads."""
        if not victims:
            return (0.0, float("-inf"), 0.0, 0.0)
        return (
            sum((v.gpu_units for v in victims), 0.0),
            float(max(v.priority for v in victims)),
            sum((self._victim_key(v)[2] for v in victims), 0.0),
            float(len(victims)),
        )

    def _pick_nodes(
        self, w: WorkloadView, options: dict[str, tuple[tuple[float, ...], list[WorkloadView]]]
    ) -> list[str] | None:
        def cheapest(names: list[str]) -> tuple[tuple[float, ...], list[str]] | None:
            if len(names) < w.nodes:
                return None
            ranked = sorted(names, key=lambda n: (options[n][0], n))[: w.nodes]
            costs = [options[n][0] for n in ranked]
            total = tuple(
                sum((c[i] for c in costs), 0.0) if i != 1 else max(c[1] for c in costs) for i in range(4)
            )
            return total, ranked

        label = w.topology or w.topology_preferred
        if label is not None:
            best: tuple[tuple[float, ...], list[str]] | None = None
            domains: dict[str, list[str]] = {}
            for name in options:
                value = self.state.nodes[name].labels.get(label)
                if value is not None:
                    domains.setdefault(value, []).append(name)
            for value in sorted(domains):
                found = cheapest(domains[value])
                if found is not None and (best is None or found[0] < best[0]):
                    best = found
            if best is not None or w.topology is not None:
                return None if best is None else best[1]
        found = cheapest(list(options))
        return None if found is None else found[1]

    def _cheapest_room(
        self,
        node: NodeState,
        w: WorkloadView,
        victims: list[WorkloadView],
        budget: _Budget | None = None,
    ) -> list[WorkloadView] | None:
        """The shortest prefix of `victims` (in victim order) whose GPUs make room for `w` on `node`,
        without the ones it turns out not to need."""
        suits = self.placer.matches(node, w.gpus)
        base = [node.free[i] + node.held[i] for i in range(len(node.free))]

        def fits(chosen: list[WorkloadView]) -> bool:
            avail = list(base)
            for v in chosen:
                pod = v.placement[0]
                for index in pod.gpu_indices:
                    pos = node.position.get(index)
                    if pos is not None:
                        avail[pos] += pod.gpu_fraction
            if w.gpus.count <= 0:
                return True
            if w.gpus.is_fractional:
                return any(ok and a + EPSILON >= w.gpus.count for ok, a in zip(suits, avail, strict=True))
            return (
                sum(1 for ok, a in zip(suits, avail, strict=True) if ok and a >= 1 - EPSILON) >= w.gpus.count
            )

        if fits([]):
            return []
        chosen: list[WorkloadView] = []
        taken: dict[str, float] = {}
        for v in victims:
            if budget is not None and not budget.take(taken, v):
                continue
            chosen.append(v)
            if fits(chosen):
                break
        else:
            return None
        for v in sorted(chosen, key=lambda v: (-v.gpu_units, v.id)):
            trial = [c for c in chosen if c.id != v.id]
            if trial and fits(trial):
                chosen = trial
        return chosen

    def _fits_tentatively(self, w: WorkloadView) -> bool:
        """Would `w` fit after release? The state is left exactly as it was."""
        checkpoint, generation = self.state.checkpoint(), self.state.generation
        fits = self.placer.place_gang(w, after_release=True) is not None
        self.state.rollback(checkpoint)
        self.state.generation = generation
        return fits

    def _victim_key(self, v: WorkloadView) -> tuple[float, ...]:
        since = v.last_checkpoint_time if v.last_checkpoint_time is not None else v.start_time
        lost = (self.now - since) * v.gpu_units if since is not None else 0.0
        started = v.start_time if v.start_time is not None else 0.0
        return (v.gpu_units, v.priority, lost, -started, v.id)

    def _min_runtime(self, queue: str, kind: str) -> float:
        key = (queue, kind)
        found = self._runtime_floor.get(key)
        if found is None:
            found = self._runtime_floor[key] = self._inherited_min_runtime(queue, kind)
        return found

    def _inherited_min_runtime(self, queue: str, kind: str) -> float:
        for name in self.state.chain(queue):
            q = self.queues.get(name)
            value = (
                None if q is None else (q.min_runtime_preempt if kind == "preempt" else q.min_runtime_reclaim)
            )
            if value is not None:
                return value
        return 0.0

    def _old_enough(self, v: WorkloadView, kind: str) -> bool:
        if not self._floors and (v.start_time is None or v.start_time <= self.now):
            return True  # what _past_min_runtime finds with every floor at zero or below
        known = self._old[kind]
        found = known.get(v.id)
        if found is None:
            found = known[v.id] = self._past_min_runtime(v, kind)
        return found

    def _past_min_runtime(self, v: WorkloadView, kind: str) -> bool:
        if v.id in self._tentative:
            return True  # a bind of this cycle has not started: no minimum runtime to protect
        started = v.start_time if v.start_time is not None else float("-inf")
        floor = self._min_runtime(v.queue, kind)
        if self.now - started >= floor:
            return True
        self.state.expires(started + floor)
        return False

    def _movable(self, v: WorkloadView) -> bool:
        """Consolidation moves only settled work: evictable, past its queue's minimum runtime for preempt,
        and older than MIN_MOVE_AGE (work just placed is never moved again at once)."""
        started = v.start_time if v.start_time is not None else float("-inf")
        if not (v.running and self._evictable(v) and self._old_enough(v, "preempt")):
            return False
        if self.now - started >= MIN_MOVE_AGE:
            return True
        self.state.expires(started + MIN_MOVE_AGE)
        return False

    def _evictable(self, v: WorkloadView) -> bool:
        return v.preemptible and not v.stopping and v.id not in self.state.evicted

    def _victim_groups(self) -> dict[str, list[WorkloadView]]:
        """Evictable running single-pod work on schedulable nodes, by node (gangs are never victims here),
        and this cycle's single-pod binds so far: the victims of this cycle, taken once, at the first
        question about them (callers skip what was evicted since). `_victim_index` orders them; the
        questions that need no order (which queues have victims, their lowest priority) ask this, and a
        cycle that never needs the order never sorts."""
        if self._groups is None:
            groups: dict[str, list[WorkloadView]] = {}
            nodes = self.state.nodes
            for v in self.snapshot.running:
                if len(v.placement) != 1 or not self._evictable(v):
                    continue
                name = v.placement[0].node
                node = nodes.get(name)
                if node is not None and node.schedulable:
                    group = groups.get(name)
                    if group is None:
                        group = groups[name] = []
                    group.append(v)
            # This cycle's own binds give way first: they lose no work and nothing needs stopping.
            for bind in self.decisions.binds:
                w = self._tentative.get(bind.workload_id) or self._pending_by_id[bind.workload_id]
                if len(bind.pods) == 1 and w.preemptible and bind.workload_id not in self.state.evicted:
                    self._tentative[w.id] = w
                    groups.setdefault(bind.pods[0].node, []).append(w.started(bind.pods, self.now))
            self._groups = groups
        return self._groups

    def _victim_index(self) -> dict[str, list[WorkloadView]]:
        """The victims (`_victim_groups`) by node, each list in victim order, the nodes by their first."""
        if self._index is None:
            groups = dict(self._victim_groups())
            # Sorted per node, and the nodes by their first victim: the same lists, in the same order, as
            # sorting every victim at once and grouping them by node (keys are unique: they end in the id).
            firsts: list[tuple[tuple[float, ...], str]] = []
            for name, victims in groups.items():
                keyed = [(self._victim_key(v), i, v) for i, v in enumerate(victims)]
                keyed.sort()  # i breaks ties, so views are never compared (keys are unique anyway)
                groups[name] = [v for _, _, v in keyed]
                firsts.append((keyed[0][0], name))
            firsts.sort()
            self._index = {name: groups[name] for _, name in firsts}
        return self._index

    def _wants_room(self, w: WorkloadView) -> bool:
        """Still unplaced in this phase (see pending_groups), for want of capacity."""
        if not self.still_unplaced(w):
            return False
        explanation = self.decisions.explanations.get(w.id)
        return explanation is not None and explanation.code in explain.CAPACITY_CODES

    # -- reclaim --------------------------------------------------------------------------------------

    def reclaim(self) -> None:
        lines: dict[tuple[str, ...], dict[str, float]] = {}  # reclaimer line -> GPUs it may free per node
        for group in self.pending_groups():
            if (
                group != GLOBAL
                and self.state.allocated(group) + self._least_gpus(group) > self.fair(group) + EPSILON
            ):
                # None of it may reclaim (see _reclaim_for); during its turn only its own gains change that.
                continue
            for w in self.order[group]:
                if self._wants_room(w) and not self._reclaim_for(w, lines):
                    return

    def _reclaim_for(self, w: WorkloadView, lines: dict[tuple[str, ...], dict[str, float]]) -> bool:
        """Reclaim room for `w` where it may and can; False when nothing at all could be reclaimed."""
        queue, state = w.queue, self.state
        if state.allocated(queue) + w.gpu_units > self.fair(queue) + EPSILON:
            return True  # the reclaimer may not end above its fair share
        if self._fits_after_release(w):
            return True
        if not self._victim_groups():  # taken only once someone could gain from them
            return False
        if self._surplus_elsewhere(queue) + state.held_gpus() + state.free_gpus() + EPSILON < w.gpu_units:
            return True
        index = self._victim_index()
        mine = frozenset(state.chain(queue))
        line = state.chain(queue)[1:]
        units = lines.get(line)
        if units is None:
            if self._reclaim_gpus is None:
                self._reclaim_gpus = self._gpus_by_queue(index)
            units = lines[line] = self._reclaimable(self._reclaim_gpus, mine)
        headroom: dict[str, float] = {}

        def allowed(v: WorkloadView) -> bool:
            if v.queue in mine or not self._old_enough(v, "reclaim"):
                return False
            room = headroom.get(v.queue)
            if room is None:
                room = headroom[v.queue] = self._headroom(v.queue, mine)
            return room >= v.gpu_units - EPSILON

        def reason(v: WorkloadView) -> str:
            return (
                f"reclaimed for queue {queue} (below its fair share of {self.fair(queue):.3g} GPUs) "
                f"by workload {w.id}; queue {v.queue} stays at or above its fair share"
            )

        self._evict_for(w, index, "reclaim", reason, allowed, units, _Budget(self, queue))
        return True

    def _gpus_by_queue(self, index: dict[str, list[WorkloadView]]) -> dict[str, dict[str, float]]:
        """The GPUs of the victims reclaim could take at all (past their queue's minimum runtime for
        reclaim), by queue, then by node."""
        out: dict[str, dict[str, float]] = {}
        for name, victims in index.items():
            for v in victims:
                if self._old_enough(v, "reclaim"):
                    nodes = out.setdefault(v.queue, {})
                    nodes[name] = nodes.get(name, 0.0) + v.gpus.count
        return out

    def _reclaimable(self, by_queue: dict[str, dict[str, float]], mine: frozenset[str]) -> dict[str, float]:
        """Per node, an upper bound on the GPUs reclaim may free there for a reclaimer whose line is
        `mine`: from each queue, the GPUs of its victims there, but no more than its headroom (the least
        that any level of it outside that line holds above its fair share: what the budget lets reclaim
        take from it). Reclaimers under the same parents get the same answer (each is below its own
        fair share, so none of their own work is ever a victim). It is kept while reclaim runs: evictions
        only lower the victims' queues, and a gainer never ends above its own share (its parent may: then
        this misses what the next cycle finds)."""
        units: dict[str, float] = {}
        for queue, nodes in by_queue.items():
            room = self._headroom(queue, mine)
            if room <= EPSILON:
                continue
            for name, gpus in nodes.items():
                units[name] = units.get(name, 0.0) + min(gpus, room)
        return units

    def _surplus_elsewhere(self, queue: str) -> float:
        """GPUs the queues outside `queue`'s line hold above their fair share: the most reclaim could
        free for it (an upper bound). Each victim queue's part is kept, and recomputed only when work of
        its line was allocated or taken back; the line's own part is taken off the sum."""
        state = self.state
        surplus = self._surplus
        if self._surplus_seen < 0:
            for name in self._victim_queues():
                surplus[name] = max(0.0, state.allocated(name) - self.fair(name))
            self._surplus_total = sum(surplus.values(), 0.0)
            self._surplus_seen = len(state.accounted)
        elif self._surplus_seen < len(state.accounted):
            # Only the lines of queues whose work was allocated or taken back since have changed.
            for changed in state.accounted[self._surplus_seen :]:
                for name in state.chain(changed):
                    if name in surplus:
                        surplus[name] = max(0.0, state.allocated(name) - self.fair(name))
            self._surplus_total = sum(surplus.values(), 0.0)
            self._surplus_seen = len(state.accounted)
        return self._surplus_total - sum((surplus.get(name, 0.0) for name in state.chain(queue)), 0.0)

    def _victim_queues(self) -> list[str]:
        if self._victim_queue_names is None:
            self._victim_queue_names = sorted({v.queue for vs in self._victim_groups().values() for v in vs})
        return self._victim_queue_names

    def _headroom(self, queue: str, mine: frozenset[str]) -> float:
        """GPUs reclaim may take from `queue` for a reclaimer whose line is `mine`: the least that any
        level of `queue` outside that line holds above its fair share (none if every level is shared)."""
        levels = [n for n in self.state.chain(queue) if n not in mine]
        if not levels:
            return float("-inf")
        return min(self.state.allocated(n) - self.fair(n) for n in levels)

    # -- preempt --------------------------------------------------------------------------------------

    def preempt(self) -> None:
        lower: dict[tuple[str, int], tuple[dict[str, list[WorkloadView]], dict[str, float]]] = {}
        for group in self.pending_groups():
            for w in self.order[group]:
                if not self._wants_room(w):
                    continue
                if self._lowest_victims().get(w.queue, w.priority) >= w.priority:
                    if group != GLOBAL:
                        break  # the rest of this queue is of no higher priority: none of it may preempt
                    continue
                if self._fits_after_release(w):
                    continue
                key = (w.queue, w.priority)
                found = lower.get(key)
                if found is None:
                    found = lower[key] = _below(self._victims_by_queue()[w.queue], w.priority)
                self._preempt_for(w, found[0], found[1])

    def _preempt_for(
        self, w: WorkloadView, candidates: dict[str, list[WorkloadView]], units: dict[str, float]
    ) -> None:
        def reason(v: WorkloadView) -> str:
            return f"preempted by workload {w.id} (priority {w.priority} > {v.priority}), queue {w.queue}"

        def allowed(v: WorkloadView) -> bool:
            return v.priority < w.priority and self._old_enough(v, "preempt")

        self._evict_for(w, candidates, "preempt", reason, allowed, units)

    def _lowest_victims(self) -> dict[str, int]:
        """Each queue's lowest victim priority (built once a cycle)."""
        if self._lowest is None:
            lowest: dict[str, int] = {}
            for victims in self._victim_groups().values():
                for v in victims:
                    low = lowest.get(v.queue)
                    if low is None or v.priority < low:
                        lowest[v.queue] = v.priority
            self._lowest = lowest
        return self._lowest

    def _victims_by_queue(self) -> dict[str, dict[str, list[WorkloadView]]]:
        """The victim index split by queue, each node's list in victim order (built once a cycle)."""
        if self._by_queue is None:
            by_queue: dict[str, dict[str, list[WorkloadView]]] = {}
            for name, victims in self._victim_index().items():
                for v in victims:
                    nodes = by_queue.get(v.queue)
                    if nodes is None:
                        nodes = by_queue[v.queue] = {}
                    listed = nodes.get(name)
                    if listed is None:
                        listed = nodes[name] = []
                    listed.append(v)
            self._by_queue = by_queue
        return self._by_queue

    # -- consolidate ----------------------------------------------------------------------------------

    def consolidate(self) -> None:
        tries = 0
        for group in self.pending_groups():
            for w in self.order[group]:
                if not self.still_unplaced(w):
                    continue
                explanation = self.decisions.explanations.get(w.id)
                if explanation is None or explanation.code != explain.FRAGMENTED:
                    continue
                tries += 1
                if tries > MAX_CONSOLIDATION_TRIES:
                    return
                self._consolidate_for(w)

    def _consolidate_for(self, w: WorkloadView) -> bool:
        state = self.state
        saved = state.reservation
        if saved is not None and saved.workload_id == w.id:
            state.reservation = None  # w's own reservation must not keep the moved work from its new homes
        if self._consolidate(w):
            return True
        state.reservation = saved
        return False

    def _consolidate(self, w: WorkloadView) -> bool:
        state = self.state
        checkpoint, generation = state.checkpoint(), state.generation
        need = int(w.gpus.count)
        moved: list[WorkloadView] = []
        targets = sorted(
            (n for n in state.nodes.values() if n.schedulable and 0 < n.whole < need and n.model != ""),
            key=lambda n: (-n.whole, n.name),
        )[: MAX_CONSOLIDATION_TARGETS * w.nodes]
        ready = 0
        for node in targets:
            if ready >= w.nodes and self._fits_tentatively(w):
                break
            movable = sorted(
                (v for v in self.by_node.get(node.name, []) if v.nodes == 1 and self._movable(v)),
                key=lambda v: (v.gpu_units, v.id),
            )
            for v in movable:
                if len(moved) >= self.config.max_consolidation_moves:
                    break
                state.evict(v, "consolidate")
                moved.append(v)
                if sum(node.free[i] + node.held[i] >= 1 - EPSILON for i in range(len(node.free))) >= need:
                    ready += 1
                    break
        trial = state.checkpoint()
        placed = self.placer.place_gang(w, after_release=True)
        if placed is not None:
            state.rollback(trial)
        if placed is None or not moved or len(moved) > self.config.max_consolidation_moves:
            state.rollback(checkpoint)
            state.generation = generation
            return False
        # Keep the gang's room, then every moved workload must find a new home this cycle, or nothing moves.
        placed = self.placer.place_gang(w, after_release=True)
        for v in moved:
            if self.placer.place_gang(v) is None:
                state.rollback(checkpoint)
                state.generation = generation
                return False
        for v in moved:
            why = f"moved to make room for workload {w.id} ({w.nodes} x {explain.gpu_text(w)})"
            self.decisions.evictions.append(Eviction(v.id, "consolidate", why, w.id))
        self.decisions.explanations[w.id] = explain.waiting_for_release(w)
        del self.unplaced[w.id]
        return True


def _listed(names: frozenset[str]) -> str:
    ordered = sorted(names)
    return ", ".join(ordered[:5]) + (f" and {len(ordered) - 5} more" if len(ordered) > 5 else "")


def _below(
    by_node: dict[str, list[WorkloadView]], priority: int
) -> tuple[dict[str, list[WorkloadView]], dict[str, float]]:
    """A queue's victims of lower priority than `priority`, by node (keeping their order), and their GPUs
    per node: all that preempt may take there for work of that priority."""
    victims: dict[str, list[WorkloadView]] = {}
    units: dict[str, float] = {}
    for name, candidates in by_node.items():
        low = [v for v in candidates if v.priority < priority]
        if low:
            victims[name] = low
            units[name] = sum((v.gpus.count for v in low), 0.0)
    return victims, units


def _able_gpus(entry: _AbleNode) -> float:
    """What a node's victims could free, plus the tolerance `_able` compares with."""
    return entry[1] + EPSILON


class _Budget:
    """What reclaim may take from the queues outside a reclaimer's line, in total: every level of them
    keeps at least its fair share."""

    def __init__(self, cycle: Cycle, queue: str) -> None:
        self.cycle = cycle
        self.mine = frozenset(cycle.state.chain(queue))

    def take(self, taken: dict[str, float], v: WorkloadView) -> bool:
        """Add `v` to `taken` (GPUs taken per level so far, all within budget) if that stays within budget;
        only `v`'s own levels change, so only they are checked."""
        state, cycle = self.cycle.state, self.cycle
        levels = [level for level in state.chain(v.queue) if level not in self.mine]
        units = v.gpu_units
        for level in levels:
            if state.allocated(level) - taken.get(level, 0.0) - units < cycle.fair(level) - EPSILON:
                return False
        for level in levels:
            taken[level] = taken.get(level, 0.0) + units
        return True

    def admits(self, victims: list[WorkloadView]) -> bool:
        taken: dict[str, float] = {}
        return all(self.take(taken, v) for v in victims)
