"""The exact skip tests: whether a scheduler cycle would provably return no bind and no eviction.

`SkipTest.nothing_can_change` is the one question the engine asks before it calls `decide`; each test in
it is a necessary condition of an action doing anything, checked the way the cycle checks it, with float
slack on the permissive side (see docs/simulator.md). The engine tells a `SkipTest` of every change of its
jobs (`add_pending`, `arrive`, `start`, `release`, `finish`, `reband`), so that the tests read tallies by
queue and each node's free GPUs and never walk every job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol, TypeVar

from gpupool.scheduler import GpuDemand, PodPlacement, QueueView, SchedulerConfig
from gpupool.scheduler.fairshare import fair_shares
from gpupool.sim.cluster import Cluster

EPS = 1e-9
SLACK = 1e-6  # float slack of the tests, on the side of running the cycle
GPU_ONLY: Final = ("gpu",)  # the fair shares the tests read
_K = TypeVar("_K")


class _Ordered(Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


_O = TypeVar("_O", bound=_Ordered)


class Work(Protocol):
    """What the tests read of a job (the engine's own job records)."""

    idx: int  # the workload id the scheduler sees
    queue: str  # the queue the scheduler sees
    gpus: float
    nodes: int  # pods
    demand: GpuDemand  # per pod
    priority: int
    placement: tuple[PodPlacement, ...]


class QueueTally:
    """What the tests read of one queue, kept up to date as its jobs arrive, start, stop and finish."""

    __slots__ = ("active", "active_jobs", "gangs", "pending_shapes", "pending_sizes", "priorities",
                 "running", "victim_room", "victims")  # fmt: skip

    def __init__(self) -> None:
        self.active = 0.0  # GPUs of its pending and running jobs (its demand for fair share)
        self.active_jobs = 0  # its pending and running jobs
        self.running = 0.0  # GPUs of its running jobs
        self.pending_sizes: dict[float, int] = {}  # GPUs -> pending jobs of that size
        self.pending_shapes: dict[tuple[int, float, int], int] = {}  # (priority, GPUs per pod, pods) -> jobs
        self.priorities: dict[int, int] = {}  # priority -> running jobs at it
        self.gangs: dict[float, int] = {}  # GPUs -> its running multi-pod jobs of that size
        # its running single-pod jobs, in start order: their node and the GPUs of their pod
        self.victims: dict[int, tuple[str, float]] = {}
        # the same jobs by priority and node: [jobs, GPUs of their pods]
        self.victim_room: dict[int, dict[str, list[float]]] = {}

    def add_victim(self, pod: PodPlacement, priority: int, step: int) -> None:
        """Count a single-pod job on `pod` at `priority` (step 1) or no longer (step -1) in `victim_room`."""
        on = self.victim_room.get(priority)
        if on is None:
            on = self.victim_room[priority] = {}
        held = on.get(pod.node)
        if held is None:
            held = on[pod.node] = [0.0, 0.0]
        held[0] += step
        if held[0]:
            held[1] += step * len(pod.gpu_indices) * pod.gpu_fraction
        else:
            del on[pod.node]
            if not on:
                del self.victim_room[priority]


def _count(counter: dict[_K, int], key: _K, step: int) -> None:
    left = counter.get(key, 0) + step
    if left:
        counter[key] = left
    else:
        del counter[key]


def _nodes_with(room: dict[str, float], gpus: float) -> int:
    """How many nodes have `gpus` GPUs of room (with the tests' slack)."""
    return sum(1 for value in room.values() if value + SLACK >= gpus)


def _least(counter: dict[_O, int]) -> _O:
    """The smallest key of a counter (not empty), found as `min` finds it (the first key, replaced by each
    key below it) in a compiled loop: the builtin over a dict is a call through Python."""
    least: _O | None = None
    for key in counter:
        if least is None or key < least:
            least = key
    assert least is not None, "a counter with no keys"
    return least


def _able(room: dict[str, float], able: dict[float, int], gpus: float) -> int:
    """`_nodes_with(room, gpus)`, taken from `able` (GPUs -> nodes with that much room, for this room) and
    kept there."""
    nodes = able.get(gpus)
    if nodes is None:
        nodes = able[gpus] = _nodes_with(room, gpus)
    return nodes


def _fits_on(room: dict[str, float], shapes: Iterable[tuple[float, int]], able: dict[float, int]) -> bool:
    """Whether pods of one of these (GPUs per pod, pods) shapes could each find a node with that much
    `room` (GPUs by node); `able` as for `_able`."""
    return any(count <= 0 or _able(room, able, count) >= pods for count, pods in shapes)


class SkipTest:
    """The skip tests of one simulation, and the tallies they read."""

    def __init__(
        self,
        cluster: Cluster,
        config: SchedulerConfig,
        base: tuple[QueueView, ...],
        queues: Callable[[], tuple[QueueView, ...]],
        *,
        strict: bool,
        backfill: bool,
        nested: bool,
    ) -> None:
        """`queues` gives the queue views of the next cycle: `base`'s, in their order, differing only in GPU
        weight and usage (so with their names, parents and quotas); `strict`: one queue in submit order that
        nothing passes (only its head can start); `backfill`: one queue in submit order, blocking
        `backfill`, allocate only, no declared durations (a blocked head reserves nodes that nothing
        behind it may use); `nested`: the queues form a tree."""
        self.config = config
        self._usage_weight = config.usage_weight
        self._queues = queues
        self._known = frozenset(q.name for q in base)  # the queues' names
        self._quotas = {q.name: q.gpu.quota for q in base}  # their GPU quotas
        self._strict = strict
        self._nested = nested
        self._cluster_gpus = cluster.gpus
        # GPUs of schedulable nodes, as the scheduler counts them for fair share
        self._gpu_capacity = sum(g.free for n in cluster.nodes if n.schedulable for g in n.gpus)
        self._consolidates = "consolidate" in config.actions
        self._preempts = "preempt" in config.actions
        self._reclaims = "reclaim" in config.actions
        self._evicts = self._preempts or self._reclaims  # only their tests read the queues' tallies
        self.pending_sizes: dict[float, int] = {}  # GPUs -> pending jobs of that size
        self.pending_shapes: dict[tuple[float, int], int] = {}  # (GPUs per pod, pods) -> pending jobs
        self.tallies: dict[str, QueueTally] = {}  # by the queue the scheduler sees (kept where `_evicts`)
        # fair GPUs by queue as the last reclaim test computed them (None: not computed by the last test)
        self.fair: dict[str, float] | None = None
        # the reclaim test's last fair shares: (queues, demand by queue, fair GPUs by queue)
        self._fair_for: tuple[tuple[QueueView, ...], dict[str, float], dict[str, float]] | None = None
        # GPUs free on each node: the empty node's, less the pods placed on it (`_on_node`: node -> job ->
        # GPUs of its pods there, in start order), recomputed for the nodes in `_room_stale` only
        self._empty_room = {n.name: sum(g.free for g in n.gpus) for n in cluster.nodes}
        self._room = dict(self._empty_room)
        self._on_node: dict[str, dict[int, tuple[float, ...]]] = {}
        self._room_stale: set[str] = set()
        # GPUs -> nodes with that much room (see `_able`), kept while `_room` stays as it is: the allocate
        # and preempt tests both ask it, and again at the next instant when no job started or stopped
        self._able: dict[float, int] = {}
        # The backfill reservation is modelled only where `_room` counts whole free GPUs exactly: every
        # node schedulable with whole GPUs free when empty, and no fractional pod running.
        self._backfill = backfill and all(
            n.schedulable and all(g.free == 1.0 for g in n.gpus) for n in cluster.nodes
        )
        self._gpus_by_node = sorted((n.name, len(n.gpus)) for n in cluster.nodes)  # in reservation order
        self._fractional_pods = 0

    # -- what the engine reports ----------------------------------------------------------------------

    def tally(self, queue: str) -> QueueTally:
        tally = self.tallies.get(queue)
        if tally is None:
            tally = self.tallies[queue] = QueueTally()
        return tally

    def add_pending(self, job: Work) -> None:
        """`job` waits (it arrived, or was evicted)."""
        _count(self.pending_sizes, job.gpus, 1)
        _count(self.pending_shapes, (job.demand.count, job.nodes), 1)
        if self._evicts:
            tally = self.tally(job.queue)
            _count(tally.pending_sizes, job.gpus, 1)
            _count(tally.pending_shapes, (job.priority, job.demand.count, job.nodes), 1)

    def arrive(self, job: Work) -> None:
        """`job` arrived (after `add_pending`): its queue's demand grows."""
        if self._evicts:
            tally = self.tallies[job.queue]
            tally.active += job.gpus
            tally.active_jobs += 1

    def start(self, job: Work, pods: tuple[PodPlacement, ...]) -> None:
        """`job` starts on `pods` (its priority is the one it waited with)."""
        _count(self.pending_sizes, job.gpus, -1)
        _count(self.pending_shapes, (job.demand.count, job.nodes), -1)
        if self._evicts:
            tally = self.tallies[job.queue]
            _count(tally.pending_sizes, job.gpus, -1)
            _count(tally.pending_shapes, (job.priority, job.demand.count, job.nodes), -1)
            tally.running += job.gpus
            _count(tally.priorities, job.priority, 1)
            if len(pods) == 1:
                pod = pods[0]
                tally.victims[job.idx] = (pod.node, len(pod.gpu_indices) * pod.gpu_fraction)
                tally.add_victim(pod, job.priority, 1)
            else:
                _count(tally.gangs, job.gpus, 1)
        on_node = self._on_node
        for pod in pods:
            on = on_node.get(pod.node)
            if on is None:
                on = on_node[pod.node] = {}
            fraction = pod.gpu_fraction
            if fraction != 1.0:
                self._fractional_pods += 1
            on[job.idx] = (*on.get(job.idx, ()), len(pod.gpu_indices) * fraction)
            self._room_stale.add(pod.node)

    def release(self, job: Work) -> None:
        """`job` stops (finished or evicted; its placement is still set)."""
        if self._evicts:
            tally = self.tallies[job.queue]
            tally.running -= job.gpus
            _count(tally.priorities, job.priority, -1)
            if tally.victims.pop(job.idx, None) is not None:
                tally.add_victim(job.placement[0], job.priority, -1)
            elif len(job.placement) > 1:
                _count(tally.gangs, job.gpus, -1)
        for pod in job.placement:
            if pod.gpu_fraction != 1.0:
                self._fractional_pods -= 1
            self._on_node[pod.node].pop(job.idx, None)
            self._room_stale.add(pod.node)

    def finish(self, job: Work) -> None:
        """`job` finished (after `release`): its queue's demand shrinks."""
        if self._evicts:
            tally = self.tallies[job.queue]
            tally.active -= job.gpus
            tally.active_jobs -= 1

    def reband(self, job: Work, priority: int) -> None:
        """Running `job` moves to `priority` (before `job.priority` is set to it)."""
        if self._evicts:
            tally = self.tallies[job.queue]
            _count(tally.priorities, job.priority, -1)
            _count(tally.priorities, priority, 1)
            if job.idx in tally.victims:
                tally.add_victim(job.placement[0], job.priority, -1)
                tally.add_victim(job.placement[0], priority, 1)

    # -- the tests ------------------------------------------------------------------------------------

    def nothing_can_change(self, used: float, pending: Mapping[int, Work], running: bool) -> bool:
        """Whether `decide` is sure to return no binds and no evictions, with `used` GPUs in use, these
        `pending` jobs (in submit order where `strict` or `backfill`) and running work or none.

        Exact (each test is a necessary condition of an action doing anything, checked the way the cycle
        checks it, with float slack on the permissive side):
        - allocate and consolidate need a pending workload no larger than the free GPUs in total (for
          strict FIFO: the head of the line); allocate alone (no consolidate to move running work) needs
          one whose pods each find a node with as many GPUs free, and under backfill one whose pods do so
          outside the nodes the blocked head of the line reserves;
        - preempt needs pending work that outranks running work of its own queue;
        - reclaim needs a pending workload that stays within its queue's fair share when it starts,
          while the other queues hold at least its GPUs above their fair shares or quotas (the lower
          of the two; all they hold, for a queue above its quota and a reclaimer within its own), or
          free."""
        self.fair = None
        free = self._cluster_gpus - used + EPS
        if self._strict:
            head = next(iter(pending.values()))
            if head.gpus <= free and self._fits_nodes(((head.demand.count, head.nodes),)):
                return False
        elif self._allocate_could_bind(free, pending):
            return False
        if self._preempts and running and self._preempt_could_place():
            return False
        return not self._reclaims or not running or self._reclaim_is_futile(free)

    def _allocate_could_bind(self, free: float, pending: Mapping[int, Work]) -> bool:
        """Whether allocate (or consolidate) could bind a pending job, `free` GPUs being free in all."""
        if _least(self.pending_sizes) > free:
            return False
        if self._consolidates:
            return True
        if not self._fits_nodes(self.pending_shapes):
            return False
        return not self._backfill or self._fractional_pods > 0 or not self._reserved_head_blocks(pending)

    def _fits_nodes(self, shapes: Iterable[tuple[float, int]]) -> bool:
        """Whether pods of one of these (GPUs per pod, pods) shapes could each find a node with that many
        GPUs free, as they are now (models and fractions ignored, on the permissive side)."""
        return _fits_on(self._node_room(), shapes, self._able)

    def _node_room(self) -> dict[str, float]:
        """GPUs free on each node: the empty node's less its pods', subtracted in start order."""
        room = self._room
        stale = self._room_stale
        if stale:
            for name in stale:
                value = self._empty_room[name]
                for amounts in self._on_node[name].values():
                    for amount in amounts:
                        value -= amount
                room[name] = value
            stale.clear()
            self._able.clear()
        return room

    def _reserved_head_blocks(self, pending: Mapping[int, Work]) -> bool:
        """Under backfill (whole GPUs only): whether the head of the line cannot start and, once it
        reserves nodes as the cycle would (the nodes with its GPUs per pod free, then those with that
        many GPUs, each by name: no running work declares an end), no pending job's pods each find a node
        with as many GPUs free outside them."""
        head = next(iter(pending.values()))
        demand = head.demand
        need = demand.count
        if demand.models or demand.min_memory_bytes is not None or need < 1 or need != int(need):
            return False  # its reservation is not modelled here
        room = self._node_room()
        short = head.nodes - _able(room, self._able, need)  # reserved nodes beyond those with room for it now
        if short <= 0:
            return False  # the head may start
        outside: dict[str, float] = {}  # the nodes left to the jobs behind the head, with their room
        for name, gpus in self._gpus_by_node:
            value = room[name]
            if value + SLACK >= need:
                continue  # reserved, free for the head now
            if short and gpus >= need:
                short -= 1  # reserved, waits for running work to end
            else:
                outside[name] = value
        if short:
            return False  # too few nodes for a reservation
        return not _fits_on(outside, self.pending_shapes, {})

    def _preempt_could_place(self) -> bool:
        """Whether some pending job that outranks running work of its queue could be placed by evicting
        that work: on enough nodes, the GPUs free there plus those of the queue's lower-priority single-pod
        jobs there must cover its GPUs per pod (models and fractions ignored, on the permissive side).
        Pending jobs of one queue, priority and shape are one case."""
        room: dict[str, float] | None = None
        for tally in self.tallies.values():
            if not tally.priorities or not tally.pending_shapes:
                continue
            lowest = _least(tally.priorities)
            gains: dict[int, dict[str, float]] = {}  # priority -> the nodes with victims below it: their room
            for priority, count, pods in tally.pending_shapes:
                if priority <= lowest:
                    continue  # outranks none of its queue's running work
                if count <= 0:
                    return True
                if room is None:
                    room = self._node_room()
                gain = gains.get(priority)
                if gain is None:
                    gain = gains[priority] = {}  # once those victims are evicted
                    for below, held in tally.victim_room.items():
                        if below < priority:
                            for node, (_, gpus) in held.items():
                                gain[node] = gain.get(node, room[node]) + gpus
                able = _able(room, self._able, count)  # nodes with that much room before evictions
                for node, value in gain.items():
                    able += (value + SLACK >= count) - (room[node] + SLACK >= count)
                if able >= pods:
                    return True
        return False

    def _reclaim_is_futile(self, free: float) -> bool:
        """No pending workload could reclaim: see `nothing_can_change`."""
        demand: dict[str, float] = {}
        alloc: dict[str, float] = {}
        smallest: dict[str, float] = {}
        for name, tally in self.tallies.items():
            if tally.active_jobs:
                demand[name] = tally.active
            if tally.running:
                alloc[name] = tally.running
            if tally.pending_sizes:
                smallest[name] = _least(tally.pending_sizes)
        views = self._queues()
        last = self._fair_for
        if last is not None and views is last[0] and demand == last[1]:
            fair = last[2]  # fair shares are a function of the queues and their demand
        else:
            queues = list(views)
            known = self._known
            unknown = [name for name in demand if name not in known]  # queues only work names: defaults
            if unknown:
                queues.extend(QueueView(name) for name in sorted(unknown))
            capacity = {"gpu": self._gpu_capacity}
            shares = fair_shares(queues, {q: {"gpu": d} for q, d in demand.items()}, capacity,
                                 self._usage_weight, GPU_ONLY)  # fmt: skip
            fair = {q: s.get("gpu", 0.0) for q, s in shares.items()}
            self._fair_for = (views, demand, fair)
        self.fair = fair  # what the skipped cycle would have reported
        # Reclaim keeps a victim queue at its fair share; for a reclaimer that stays within its quota, at
        # the lower of its fair share and its quota (reclaim by quota), except that a queue above its quota
        # may lose any of its work, a job that borrows going whole (all it holds is counted then).
        above_fair = {q: a - fair.get(q, 0.0) for q, a in alloc.items() if a > fair.get(q, 0.0) + SLACK}
        quotas = self._quotas
        floors = {q: min(fair.get(q, 0.0), quotas.get(q, 0.0)) for q in alloc}
        above_quota = {
            q: a if a > quotas.get(q, 0.0) + SLACK else a - floors[q]
            for q, a in alloc.items()
            if a > floors[q] + SLACK
        }
        classes: tuple[tuple[dict[str, float], list[str]], ...] = ((above_fair, []), (above_quota, []))
        surpluses = (sum(a for a in above_fair.values()), sum(a for a in above_quota.values()))
        for queue, gpus in smallest.items():
            if alloc.get(queue, 0.0) + gpus > fair.get(queue, 0.0) + SLACK:
                continue  # the reclaimer may not end above its fair share
            within_quota = alloc.get(queue, 0.0) + gpus <= quotas.get(queue, 0.0) + SLACK
            above, reclaimers = classes[within_quota]
            surplus = surpluses[within_quota]
            if surplus - max(0.0, above.get(queue, 0.0)) + free + SLACK >= gpus:
                reclaimers.append(queue)
        for above, reclaimers in classes:
            if not reclaimers:
                continue
            for queue, headroom in above.items():
                gangs = self.tallies[queue].gangs
                if gangs and _least(gangs) <= headroom + SLACK:
                    return False  # a whole gang could go: the node test below counts single-pod jobs only
            if self._nested:
                return False  # a parent's share bounds reclaim too: the node test reads leaf queues only
            if self._reclaim_could_place(reclaimers, above, alloc, fair):
                return False
        return True

    def _reclaim_could_place(
        self, reclaimers: list[str], above: dict[str, float], alloc: dict[str, float], fair: dict[str, float]
    ) -> bool:
        """Whether a pending job of one of these queues (flat queues) could be placed by reclaim: on enough
        nodes, the GPUs free there plus those of the single-pod jobs there of queues above their floor
        (the lower of fair share and quota) must cover its GPUs per pod (a reclaimer is never above its
        own share, so none of its own work counts). Reclaim's budget keeps every victim queue at or above
        its floor: from a queue `above` it by h GPUs, only jobs of at most h GPUs may go, and at most h
        GPUs in all (a whole number when every running pod holds whole GPUs; a queue above its quota, for
        a reclaimer within its own, comes with h = all it holds, so any of its jobs counts), so the GPUs
        missing on the nodes it would use must not exceed what all those queues may give (models and
        fractions ignored, on the permissive side)."""
        room = self._node_room()
        gain = dict(room)
        budget = 0.0  # GPUs reclaim may take in all
        whole = not self._fractional_pods  # every victim holds whole GPUs
        for queue, headroom in above.items():
            limit = headroom + SLACK
            taken: dict[str, float] = {}  # node -> GPUs of this queue's victims there
            for node, gpus in self.tallies[queue].victims.values():
                if gpus <= limit:
                    taken[node] = taken.get(node, 0.0) + gpus
            offered = 0.0
            for node, gpus in taken.items():
                gain[node] += min(gpus, limit)
                offered += gpus
            budget += min(offered, math.floor(limit) if whole else limit)
        shapes = {
            (count, pods)
            for queue in reclaimers
            for _, count, pods in self.tallies[queue].pending_shapes
            if count * pods <= fair.get(queue, 0.0) - alloc.get(queue, 0.0) + SLACK  # stays within its share
        }
        for count, pods in shapes:
            if count <= 0:
                return True
            missing = sorted(
                max(0.0, count - room[node]) for node, value in gain.items() if value + SLACK >= count
            )
            if len(missing) >= pods and sum(missing[:pods]) <= budget + SLACK:
                return True
        return False
