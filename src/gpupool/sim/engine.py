"""The discrete-event engine: trace jobs on a virtual clock, scheduled by the product's `decide`.

Events are arrivals, completions and band changes (a running job's attained or remaining GPU-service
crossing a threshold of a banded policy). A scheduler cycle runs at every instant where something changed
and every `cycle` seconds while the clock itself can change a decision (see `_clock_matters`); a cycle
whose snapshot would only differ from the last one by the clock, with nothing the clock affects, is
skipped, since `decide` is a pure function. Evicted work stops at once, pays `restart_overhead` when it
starts again and loses the work done since its last checkpoint (every `checkpoint_interval` seconds of
progress).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import TypeVar, cast

from gpupool.scheduler import (
    Decisions,
    GpuDemand,
    PodPlacement,
    QueueView,
    Share,
    Snapshot,
    WorkloadView,
    decide,
)
from gpupool.scheduler.fairshare import fair_shares
from gpupool.scheduler.placement import gpu_matches
from gpupool.sim.cluster import Cluster
from gpupool.sim.policies import POOL, Policy
from gpupool.sim.trace import TraceJob
from gpupool.spec.scheduling import young_totals, young_weight, young_weighted

EPS = 1e-9
SLACK = 1e-6  # float slack of the exact skip tests, on the side of running the cycle
ARRIVAL, FINISH, BAND, TICK = 0, 1, 2, 3
MAX_ROUNDS = 4  # cycles at one instant (evictions release at once; the gainers bind in the next round)
TIMELINE_POINTS = 600
_K = TypeVar("_K")
_CODE = attrgetter("code")


@dataclass(frozen=True, slots=True)
class SimOptions:
    cycle: float = 60.0  # seconds between periodic scheduler cycles
    restart_overhead: float = 60.0  # seconds a restarted job spends before it progresses again
    checkpoint_interval: float = 1800.0  # seconds of progress between checkpoints; 0 = nothing is lost
    seed: int = 0  # kept for reproducibility records; the engine itself draws nothing at random


@dataclass(slots=True)
class JobRecord:
    """What happened to one job (times in seconds since the window start)."""

    id: int
    queue: str  # the tenant
    submit: float
    duration: float
    gpus: float
    start: float | None = None  # first start
    finish: float | None = None
    queued: float = 0.0  # all time pending, time spent preempted included
    preemptions: int = 0
    lost_gpu_s: float = 0.0  # GPU-seconds of work lost since checkpoints, plus restart overheads paid

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.submit


@dataclass(slots=True)
class Sample:
    t: float
    pending: int
    used_gpus: float
    allocated: dict[str, float]  # tenant -> GPUs
    fair_share: dict[str, float]  # tenant -> GPUs (policies with tenant queues)


@dataclass(slots=True)
class SimResult:
    policy: str
    cluster_gpus: int
    arrival_window: float  # seconds from time zero to the last arrival
    jobs: list[JobRecord]
    dropped: list[int]  # trace job ids larger than the cluster
    quotas: dict[str, float]
    busy_gpu_s: float = 0.0  # GPU-seconds in use during the arrival window
    shortfall_gpu_s: dict[str, float] = field(default_factory=dict)  # wanted within quota, not given
    timeline: list[Sample] = field(default_factory=list)
    cycles: int = 0
    decide_s: float = 0.0
    wall_s: float = 0.0
    unfinished: int = 0


class _Job:
    __slots__ = ("attained", "attempt", "band_at", "ckpt_at", "counted", "demand", "est_key", "gpus", "idx",
                 "nodes", "overhead", "pending_since", "placement", "priority", "queue", "record",
                 "remaining", "start", "state", "trace", "view")  # fmt: skip

    def __init__(self, idx: int, trace: TraceJob, queue: str, nodes: int, demand: GpuDemand) -> None:
        self.idx = idx  # the workload id the scheduler sees
        self.trace = trace
        self.queue = queue
        self.nodes = nodes
        self.demand = demand
        self.gpus = demand.count * nodes
        self.remaining = trace.duration  # seconds of work left, from the last checkpoint
        self.overhead = 0.0
        self.state = "future"
        self.start = 0.0
        self.attained = 0.0  # GPU-seconds received before the current attempt
        self.attempt = 0
        self.placement: tuple[PodPlacement, ...] = ()
        self.priority = 0
        self.pending_since = 0.0
        self.ckpt_at = math.inf  # next checkpoint of the running attempt (its view is rebuilt then)
        self.band_at = math.inf
        self.counted = 0.0  # what it adds to its queue's over-quota weight (policies that count young work)
        self.view: WorkloadView | None = None
        self.est_key = (trace.queue, trace.gpus)
        self.record = JobRecord(trace.id, trace.queue, 0.0, trace.duration, self.gpus)


class _QueueTally:
    """What the skip test (`_nothing_can_change`) reads of one queue, kept up to date as its jobs arrive,
    start, stop and finish, so that the test never walks every job."""

    __slots__ = ("active", "active_jobs", "pending_shapes", "pending_sizes", "priorities", "running",
                 "victims")  # fmt: skip

    def __init__(self) -> None:
        self.active = 0.0  # GPUs of its pending and running jobs (its demand for fair share)
        self.active_jobs = 0  # its pending and running jobs
        self.running = 0.0  # GPUs of its running jobs
        self.pending_sizes: dict[float, int] = {}  # GPUs -> pending jobs of that size
        self.pending_shapes: dict[tuple[int, float, int], int] = {}  # (priority, GPUs per pod, pods) -> jobs
        self.priorities: dict[int, int] = {}  # priority -> running jobs at it
        self.victims: dict[int, _Job] = {}  # its running single-pod jobs, in start order


def _count(counter: dict[_K, int], key: _K, step: int) -> None:
    left = counter.get(key, 0) + step
    if left:
        counter[key] = left
    else:
        del counter[key]


def _nodes_with(room: dict[str, float], gpus: float) -> int:
    """How many nodes have `gpus` GPUs of room (with the skip tests' slack)."""
    return sum(1 for value in room.values() if value + SLACK >= gpus)


def _fits_on(room: dict[str, float], shapes: Iterable[tuple[float, int]]) -> bool:
    """Whether pods of one of these (GPUs per pod, pods) shapes could each find a node with that much
    `room` (GPUs by node)."""
    able: dict[float, int] = {}  # GPUs per pod -> nodes with that much room
    for count, pods in shapes:
        if count <= 0:
            return True
        nodes = able.get(count)
        if nodes is None:
            nodes = able[count] = _nodes_with(room, count)
        if nodes >= pods:
            return True
    return False


def shape(gpus: float, max_per_node: int, nodes_hint: int = 0) -> tuple[int, float]:
    """(pods, GPUs per pod) for a job of `gpus` GPUs: one pod up to a node's size, else whole nodes."""
    if nodes_hint > 1:
        return nodes_hint, math.ceil(gpus / nodes_hint)
    if gpus <= max_per_node or max_per_node <= 0:
        return 1, gpus
    nodes = math.ceil(gpus / max_per_node)
    return nodes, float(math.ceil(gpus / nodes))


class Simulation:
    def __init__(
        self,
        jobs: Sequence[TraceJob],
        origin: float,
        cluster: Cluster,
        queues: Sequence[QueueView],
        policy: Policy,
        options: SimOptions | None = None,
    ) -> None:
        self.policy = policy
        self.options = options or SimOptions()
        self.cluster = cluster
        self.config = policy.config
        self.origin = origin
        self.tenant_queues = tuple(queues)
        self.quotas = {q.name: q.gpu.quota for q in queues}
        self.queues = self._policy_queues(queues, jobs)
        self.jobs: list[_Job] = []
        per_node = cluster.max_gpus_per_node
        for trace in jobs:
            nodes, count = shape(trace.gpus, per_node, trace.nodes)
            demand = GpuDemand(count, trace.gpu_models)
            queue = POOL if policy.queues == POOL else trace.queue
            self.jobs.append(_Job(len(self.jobs), trace, queue, nodes, demand))
        self.pending: dict[int, _Job] = {}
        self.running: dict[int, _Job] = {}
        self.events: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self.now = 0.0
        self.used = 0.0
        tenants = {j.trace.queue for j in self.jobs} | set(self.quotas)
        self.alloc = dict.fromkeys(tenants, 0.0)
        self.demand = dict.fromkeys(tenants, 0.0)
        self.fair: dict[str, float] = {}
        # decayed GPU-seconds per queue, kept only for policies that tilt fair share by it
        self.usage = {q.name: 0.0 for q in self.queues} if self.config.usage_weight > 0 else {}
        # each queue's sum of its jobs' young weights, kept only for policies whose weights count them
        self.counts: dict[str, float] = {q.name: 0.0 for q in self.queues} if policy.young else {}
        # each queue's own ordering, where its spec gives one (bands apply in "las" queues only)
        self._orderings = {q.name: q.ordering for q in self.queues if q.ordering is not None}
        # band thresholds, plus the service thresholds of young work's weights
        young = {below for below, _ in policy.young}
        self._thresholds = tuple(sorted(set(policy.bands) | young))
        self._est_sum: dict[object, list[float]] = {}
        self._fits_cache: dict[tuple[int, GpuDemand], bool] = {}
        last_arrival = max((t.submit for t in jobs), default=origin) - origin
        # Utilisation and quota shortfall are measured while work arrives (the whole run if all at once).
        window = last_arrival if last_arrival > 0 else math.inf
        self.result = SimResult(
            policy.name, cluster.gpus, window, [], [], dict(self.quotas),
            shortfall_gpu_s=dict.fromkeys(self.quotas, 0.0),
        )  # fmt: skip
        self._sample_every = max(self.options.cycle, last_arrival / TIMELINE_POINTS)
        self._next_sample = 0.0
        self.settled = 0  # jobs finished or dropped
        # GPUs of schedulable nodes, as the scheduler counts them for fair share
        self._gpu_capacity = sum(g.free for n in cluster.nodes if n.schedulable for g in n.gpus)
        self._cluster_gpus = cluster.gpus
        self._strict = self._strict_fifo()
        self._positive_quotas = [(name, quota) for name, quota in self.quotas.items() if quota > 0]
        self.shortcuts = True  # skip cycles that provably change nothing (off only to test that claim)
        self.skipped = 0
        # The views the scheduler sees, kept from cycle to cycle in the order of `running` / `pending`:
        # a job's view is rebuilt only when it changed (`_stale`), or for a running job when its next
        # checkpoint passes (`_checkpoints`: a heap of (time, job, attempt)).
        self._running_views_by_job: dict[int, WorkloadView | None] = {}
        self._pending_views_by_job: dict[int, WorkloadView | None] = {}
        self._pending_sizes: dict[float, int] = {}  # GPUs -> pending jobs of that size
        self._pending_shapes: dict[tuple[float, int], int] = {}  # (GPUs per pod, pods) -> pending jobs
        # pending jobs whose view is still to be built, where views are kept: not under strict FIFO, nor
        # with learned estimates (they move as other jobs finish; an oracle's stays while a job waits)
        keeps_views = self.policy.estimate != "learned" and not self._strict
        self._unbuilt: list[int] | None = [] if keeps_views else None
        self._tallies: dict[str, _QueueTally] = {}  # by the queue the scheduler sees
        # the reclaim skip test's last fair shares: (queues, demand by queue, fair GPUs by queue)
        self._fair_for: tuple[tuple[QueueView, ...], dict[str, float], dict[str, float]] | None = None
        # GPUs free on each node, as the preempt skip test counts them: the empty node's, less the pods
        # placed on it (`_on_node`: node -> job -> GPUs of its pods there, in start order), recomputed for
        # the nodes in `_room_stale` only
        self._empty_room = {n.name: sum(g.free for g in n.gpus) for n in cluster.nodes}
        self._room = dict(self._empty_room)
        self._on_node: dict[str, dict[int, tuple[float, ...]]] = {}
        self._room_stale: set[str] = set()
        self._stale: list[_Job] = []
        self._checkpoints: list[tuple[float, int, int]] = []
        self._running_tuple: tuple[WorkloadView, ...] | None = None
        self._pending_tuple: tuple[WorkloadView, ...] | None = None  # kept until the pending set changes
        self._queues_tuple: tuple[QueueView, ...] | None = None
        self._queues_counts: tuple[float, ...] = ()
        self._queues_totals: list[float] = []  # each queue's young total behind `_queues_tuple`
        self._queues_nested = any(q.parent is not None for q in self.queues)
        self._queues_weighted: dict[tuple[int, float], QueueView] = {}  # (queue, young total) -> its view
        self._min_runtimes = any(
            (q.min_runtime_preempt or 0) > 0 or (q.min_runtime_reclaim or 0) > 0 for q in self.queues
        )
        self._dirty = False

    def _policy_queues(self, queues: Sequence[QueueView], jobs: Sequence[TraceJob]) -> tuple[QueueView, ...]:
        if self.policy.queues == POOL:
            return (QueueView(POOL),)
        if self.policy.queues == "equal":
            names = sorted({q.name for q in queues} | {j.queue for j in jobs})
            return tuple(QueueView(n, gpu=Share(0.0, None, 1.0)) for n in names)
        return tuple(queues)

    # -- the loop -------------------------------------------------------------------------------------

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Replay the whole trace; `progress(settled, total)` is called now and then."""
        began = time.perf_counter()
        for i, job in enumerate(self.jobs):
            self._push(job.trace.submit - self.origin, ARRIVAL, i, 0)
        next_tick = math.inf
        steps = 0
        while self.events:
            t = self.events[0][0]
            if next_tick < t and self.pending:
                t = next_tick
            self._advance(t)
            while self.events and self.events[0][0] <= t:
                _, _, kind, index, token = heapq.heappop(self.events)
                self._handle(kind, self.jobs[index], token)
            clock_matters = False
            if self.pending:
                clock_matters = self._cycles(t == next_tick)
            next_tick = t + self.options.cycle if clock_matters else math.inf
            steps += 1
            if progress is not None and steps % 200 == 0:
                progress(self.settled, len(self.jobs))
        self.result.unfinished = len(self.pending) + len(self.running)
        if math.isinf(self.result.arrival_window):
            self.result.arrival_window = self.now
        self.result.jobs = [j.record for j in self.jobs if j.state != "dropped"]
        self.result.wall_s = time.perf_counter() - began
        if progress is not None:
            progress(self.settled, len(self.jobs))
        return self.result

    def _push(self, t: float, kind: int, index: int, token: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, index, token))

    def _advance(self, t: float) -> None:
        """Move the clock to `t`, integrating utilisation and quota shortfall over the arrival window, and
        each queue's decayed GPU usage for policies that tilt fair share by it."""
        if self.config.usage_weight > 0 and t > self.now:
            decay = 0.5 ** ((t - self.now) / self.policy.usage_half_life)
            for name in self.usage:
                self.usage[name] = self.usage[name] * decay + self.alloc.get(name, 0.0) * (t - self.now)
        dt = min(t, self.result.arrival_window) - min(self.now, self.result.arrival_window)
        if dt > 0:
            self.result.busy_gpu_s += self.used * dt
            demand, alloc, shortfall = self.demand, self.alloc, self.result.shortfall_gpu_s
            for name, quota in self._positive_quotas:
                wanted = min(quota, demand.get(name, 0.0))
                got = alloc.get(name, 0.0)
                if got + EPS < wanted:
                    shortfall[name] += (wanted - got) * dt
        self.now = t

    def _handle(self, kind: int, job: _Job, token: int) -> None:
        if kind == ARRIVAL:
            self._arrive(job)
        elif token != job.attempt or job.state != "running":
            return  # an event of an attempt that was evicted since
        elif kind == FINISH:
            self._finish(job)
        elif kind == BAND:
            self._band(job)

    def _arrive(self, job: _Job) -> None:
        job.record.submit = self.now
        if not self._fits_empty(job):
            job.state = "dropped"
            self.settled += 1
            self.result.dropped.append(job.trace.id)
            return
        job.state = "pending"
        job.pending_since = self.now
        job.priority = self._priority(job, 0.0)
        self._add_pending(job)
        self.demand[job.trace.queue] += job.gpus
        tally = self._tally(job.queue)
        tally.active += job.gpus
        tally.active_jobs += 1
        self._recount(job)
        self._dirty = True

    def _tally(self, queue: str) -> _QueueTally:
        tally = self._tallies.get(queue)
        if tally is None:
            tally = self._tallies[queue] = _QueueTally()
        return tally

    def _fits_empty(self, job: _Job) -> bool:
        key = (job.nodes, job.demand)
        if key not in self._fits_cache:
            need = job.demand.count
            able = 0
            for node in self.cluster.nodes:
                matching = sum(1 for g in node.gpus if gpu_matches(g.model, g.memory_bytes, job.demand))
                if (need < 1 and matching > 0) or (need >= 1 and matching >= need):
                    able += 1
            self._fits_cache[key] = able >= job.nodes
        return self._fits_cache[key]

    def _finish(self, job: _Job) -> None:
        self._release(job)
        job.state = "done"
        self.settled += 1
        job.record.finish = self.now
        self.demand[job.trace.queue] -= job.gpus
        tally = self._tallies[job.queue]
        tally.active -= job.gpus
        tally.active_jobs -= 1
        self._recount(job)
        if self.policy.estimate == "learned":
            self._pending_tuple = None  # the estimates learned from finished jobs change
        stats = self._est_sum.setdefault(job.est_key, [0.0, 0.0])
        stats[0] += job.trace.duration
        stats[1] += 1
        tenant = self._est_sum.setdefault(job.trace.queue, [0.0, 0.0])
        tenant[0] += job.trace.duration
        tenant[1] += 1

    def _release(self, job: _Job) -> None:
        del self.running[job.idx]
        del self._running_views_by_job[job.idx]
        self._running_tuple = None
        self.used -= job.gpus
        self.alloc[job.trace.queue] -= job.gpus
        tally = self._tallies[job.queue]
        tally.running -= job.gpus
        _count(tally.priorities, job.priority, -1)
        tally.victims.pop(job.idx, None)
        for pod in job.placement:
            self._on_node[pod.node].pop(job.idx, None)
            self._room_stale.add(pod.node)
        self.attained_update(job)
        job.placement = ()
        job.view = None
        self._dirty = True

    def attained_update(self, job: _Job) -> None:
        job.attained += (self.now - job.start) * job.gpus

    def _band(self, job: _Job) -> None:
        priority = self._priority(job, self.now)
        if priority != job.priority:
            priorities = self._tallies[job.queue].priorities
            _count(priorities, job.priority, -1)
            _count(priorities, priority, 1)
            job.priority = priority
            job.view = None
            self._stale.append(job)
            self._running_tuple = None
            self._dirty = True
        if self._recount(job):
            self._dirty = True
        self._schedule_band(job)

    # -- priorities (banded policies) -----------------------------------------------------------------

    def _progress(self, job: _Job, now: float) -> float:
        """Seconds of work done in the running attempt."""
        return max(0.0, now - job.start - job.overhead) if job.state == "running" else 0.0

    def _priority(self, job: _Job, now: float) -> int:
        if not self.policy.bands:
            return 0
        attained = job.attained + ((now - job.start) * job.gpus if job.state == "running" else 0.0)
        remaining = (job.remaining - self._progress(job, now)) * job.gpus
        return self.policy.priority(attained, remaining, self._orderings.get(job.queue))

    def _schedule_band(self, job: _Job) -> None:
        bands = self._thresholds
        if not bands or job.gpus <= 0:
            return
        now = self.now
        if self.policy.band_by == "attained":
            attained = job.attained + (now - job.start) * job.gpus
            later = [t for t in bands if t > attained + EPS]
            if not later:
                return
            at = now + (later[0] - attained) / job.gpus
        else:
            remaining = (job.remaining - self._progress(job, now)) * job.gpus
            below = [t for t in bands if t <= remaining]
            if not below:
                return
            at = max(now, job.start + job.overhead) + (remaining - below[-1]) / job.gpus + 1e-6
        self._push(at, BAND, job.idx, job.attempt)

    # -- cycles ---------------------------------------------------------------------------------------

    def _cycles(self, tick: bool) -> bool:
        """Run the scheduler at this instant as often as evictions ask for; whether the clock matters."""
        if not (self._dirty or tick):
            return False
        if self._nothing_can_change():
            self._reset_triggers()
            self.skipped += 1
            self._sample()
            return False
        clock = False
        for _ in range(MAX_ROUNDS):
            self._reset_triggers()
            decisions = self._cycle()
            clock = self._clock_matters(decisions)
            if not decisions.evictions:
                break
        self._sample()
        return clock

    def _reset_triggers(self) -> None:
        self._dirty = False

    def _nothing_can_change(self) -> bool:
        """Whether `decide` is sure to return no binds and no evictions, so the cycle can be skipped.

        Exact (each test is a necessary condition of an action doing anything, checked the way the cycle
        checks it, with float slack on the permissive side):
        - allocate and consolidate need a pending workload no larger than the free GPUs in total (for
          strict FIFO: the head of the line); allocate alone (no consolidate to move running work) needs
          one whose pods each find a node with as many GPUs free;
        - preempt needs pending work that outranks running work of its own queue;
        - reclaim needs a pending workload that stays within its queue's fair share when it starts,
          while the other queues hold at least its GPUs above their fair shares, or free."""
        if not self.shortcuts:
            return False
        free = self._cluster_gpus - self.used + EPS
        actions = self.config.actions
        if self._strict:
            head = next(iter(self.pending.values()))
            if head.gpus <= free and self._fits_nodes(((head.demand.count, head.nodes),)):
                return False
        elif min(self._pending_sizes) <= free and (
            "consolidate" in actions or self._fits_nodes(self._pending_shapes)
        ):
            return False
        if "preempt" in actions and self.running and self._preempt_could_place():
            return False
        return "reclaim" not in actions or not self.running or self._reclaim_is_futile(free)

    def _preempt_could_place(self) -> bool:
        """Whether some pending job that outranks running work of its queue could be placed by evicting
        that work: on enough nodes, the GPUs free there plus those of the queue's lower-priority single-pod
        jobs there must cover its GPUs per pod (models and fractions ignored, on the permissive side).
        Pending jobs of one queue, priority and shape are one case."""
        room: dict[str, float] | None = None
        able_empty: dict[float, int] = {}  # GPUs per pod -> nodes with that much room before evictions
        for tally in self._tallies.values():
            if not tally.priorities or not tally.pending_shapes:
                continue
            lowest = min(tally.priorities)
            for priority, count, pods in tally.pending_shapes:
                if priority <= lowest:
                    continue  # outranks none of its queue's running work
                if count <= 0:
                    return True
                if room is None:
                    room = self._node_room()
                gain: dict[str, float] = {}  # the nodes with victims: their room once those are evicted
                for victim in tally.victims.values():
                    if victim.priority < priority:
                        pod = victim.placement[0]
                        node = pod.node
                        gain[node] = gain.get(node, room[node]) + len(pod.gpu_indices) * pod.gpu_fraction
                able = able_empty.get(count)
                if able is None:
                    able = able_empty[count] = _nodes_with(room, count)
                for node, value in gain.items():
                    able += (value + SLACK >= count) - (room[node] + SLACK >= count)
                if able >= pods:
                    return True
        return False

    def _fits_nodes(self, shapes: Iterable[tuple[float, int]]) -> bool:
        """Whether pods of one of these (GPUs per pod, pods) shapes could each find a node with that many
        GPUs free, as they are now (models and fractions ignored, on the permissive side)."""
        return _fits_on(self._node_room(), shapes)

    def _node_room(self) -> dict[str, float]:
        """GPUs free on each node: the empty node's less its pods', subtracted in start order."""
        room = self._room
        for name in self._room_stale:
            value = self._empty_room[name]
            for amounts in self._on_node[name].values():
                for amount in amounts:
                    value -= amount
            room[name] = value
        self._room_stale.clear()
        return room

    def _reclaim_is_futile(self, free: float) -> bool:
        """No pending workload could reclaim: see `_nothing_can_change`."""
        demand: dict[str, float] = {}
        alloc: dict[str, float] = {}
        smallest: dict[str, float] = {}
        for name, tally in self._tallies.items():
            if tally.active_jobs:
                demand[name] = tally.active
            if tally.running:
                alloc[name] = tally.running
            if tally.pending_sizes:
                smallest[name] = min(tally.pending_sizes)
        views = self._queues_for_cycle()
        last = self._fair_for
        if last is not None and views is last[0] and demand == last[1]:
            fair = last[2]  # fair shares are a function of the queues and their demand
        else:
            queues = list(views)
            known = {q.name for q in queues}
            queues.extend(QueueView(name) for name in sorted(demand) if name not in known)
            capacity = {"gpu": self._gpu_capacity}
            shares = fair_shares(queues, {q: {"gpu": d} for q, d in demand.items()}, capacity,
                                 self.config.usage_weight)  # fmt: skip
            fair = {q: s.get("gpu", 0.0) for q, s in shares.items()}
            self._fair_for = (views, demand, fair)
        if self.policy.queues != POOL:
            self.fair = fair  # what the skipped cycle would have reported
        above = {q: a - fair.get(q, 0.0) for q, a in alloc.items() if a > fair.get(q, 0.0) + SLACK}
        surplus = sum(above.values())
        reclaimers = []
        for queue, gpus in smallest.items():
            if alloc.get(queue, 0.0) + gpus > fair.get(queue, 0.0) + SLACK:
                continue  # the reclaimer may not end above its fair share
            if surplus - max(0.0, above.get(queue, 0.0)) + free + SLACK >= gpus:
                reclaimers.append(queue)
        if not reclaimers:
            return True
        if self._queues_nested:
            return False  # a parent's share bounds reclaim too: the node test below reads leaf queues only
        return not self._reclaim_could_place(reclaimers, above, alloc, fair)

    def _reclaim_could_place(
        self, reclaimers: list[str], above: dict[str, float], alloc: dict[str, float], fair: dict[str, float]
    ) -> bool:
        """Whether a pending job of one of these queues (flat queues) could be placed by reclaim: on enough
        nodes, the GPUs free there plus those of the single-pod jobs there of queues above their fair
        share must cover its GPUs per pod (a reclaimer is never above its own share, so none of its own
        work counts). Reclaim's budget keeps every victim queue at or above its fair share: from a queue
        `above` it by h GPUs, only jobs of at most h GPUs may go, and at most h GPUs in all (counted here
        per node, so on the permissive side; models and fractions ignored too)."""
        gain = dict(self._node_room())
        for queue, headroom in above.items():
            limit = headroom + SLACK
            taken: dict[str, float] = {}  # node -> GPUs of this queue's victims there
            for victim in self._tallies[queue].victims.values():
                pod = victim.placement[0]
                gpus = len(pod.gpu_indices) * pod.gpu_fraction
                if gpus <= limit:
                    taken[pod.node] = taken.get(pod.node, 0.0) + gpus
            for node, gpus in taken.items():
                gain[node] += min(gpus, limit)
        shapes = [
            (count, pods)
            for queue in reclaimers
            for _, count, pods in self._tallies[queue].pending_shapes
            if count * pods <= fair.get(queue, 0.0) - alloc.get(queue, 0.0) + SLACK  # stays within its share
        ]
        return _fits_on(gain, shapes)

    def _strict_fifo(self) -> bool:
        """One queue in submit order that nothing may pass: only its head (and what fits before the first
        blocked job) can start. Evictions never happen in it, so `pending` stays in submit order."""
        config = self.config
        return (
            self.policy.queues == POOL
            and config.blocking == "strict"
            and config.ordering == "fifo"
            and not self.policy.bands
            and config.actions == ("allocate",)
        )

    def _pending_for_cycle(self) -> tuple[WorkloadView, ...]:
        """The pending work the scheduler needs to see. Under strict FIFO that is the prefix of the line
        up to the first job that cannot fit the free GPUs: nothing behind it can start this cycle."""
        if not self._strict:
            if self._pending_tuple is None:
                if self._unbuilt is not None:
                    by_job = self._pending_views_by_job
                    for idx in self._unbuilt:
                        if idx in by_job:
                            by_job[idx] = self._pending_view(self.jobs[idx])
                    self._unbuilt.clear()
                    self._pending_tuple = cast(tuple[WorkloadView, ...], tuple(by_job.values()))
                else:  # learned estimates move as jobs finish: each view is checked
                    self._pending_tuple = tuple(self._pending_view(j) for j in self.pending.values())
            return self._pending_tuple
        room = self._cluster_gpus - self.used + EPS
        views = []
        for job in self.pending.values():
            views.append(self._pending_view(job))
            room -= job.gpus
            if room < 0:
                break
        return tuple(views)

    def _clock_matters(self, decisions: Decisions) -> bool:
        """Would a later cycle with the same inputs decide differently? Only through minimum runtimes and
        consolidation's minimum age."""
        if not self.pending:
            return False
        if self._min_runtimes:
            return True
        if "consolidate" in self.config.actions:
            return "fragmented" in map(_CODE, decisions.explanations.values())
        return False

    def _cycle(self) -> Decisions:
        pending = self._pending_for_cycle()
        running = self._running_views()
        snapshot = Snapshot(self.cluster.nodes, pending, self._queues_for_cycle(), running, self.config)
        began = time.perf_counter()
        decisions = decide(snapshot, self.now)
        self.result.decide_s += time.perf_counter() - began
        self.result.cycles += 1
        if decisions.fair_shares and self.policy.queues != POOL:
            self.fair = {q: s.get("gpu", 0.0) for q, s in decisions.fair_shares.items()}
        for eviction in decisions.evictions:
            self._evict(self.running[eviction.workload_id])
        for bind in decisions.binds:
            self._start(self.pending[bind.workload_id], bind.pods)
        return decisions

    def _queues_for_cycle(self) -> tuple[QueueView, ...]:
        queues = self.queues
        if self.counts:
            counts = tuple(self.counts.values())
            if self._queues_tuple is None or counts != self._queues_counts:
                self._queues_tuple = self._weighted_by_young()
                self._queues_counts = counts
            queues = self._queues_tuple
        if not self.usage:
            return queues
        return tuple(replace(q, usage=self.usage.get(q.name, 0.0)) for q in queues)

    def _weighted_by_young(self) -> tuple[QueueView, ...]:
        """`weighted_by_young(self.queues, self.counts)`, equal to it, with only the views whose young
        total changed since the last call built again."""
        totals = young_totals(self.queues, self.counts) if self._queues_nested else self.counts
        last = self._queues_totals
        if not last:
            views = [young_weighted(q, totals.get(q.name, 0)) for q in self.queues]
            self._queues_totals = [totals.get(q.name, 0) for q in self.queues]
            return tuple(views)
        assert self._queues_tuple is not None
        views = list(self._queues_tuple)
        known = self._queues_weighted
        for i, queue in enumerate(self.queues):
            total = totals.get(queue.name, 0)
            if total != last[i]:
                view = known.get((i, total))
                if view is None:
                    view = known[(i, total)] = young_weighted(queue, total)
                views[i] = view
                last[i] = total
        return tuple(views)

    def _recount(self, job: _Job) -> bool:
        """Keep `counts` (each queue's sum of its jobs' young weights) up to date after `job` changed;
        whether it changed."""
        if not self.counts:
            return False
        weight = 0.0
        if job.state in ("pending", "running"):
            attained = job.attained + ((self.now - job.start) * job.gpus if job.state == "running" else 0.0)
            weight = young_weight(attained, self.policy.young)
        if weight == job.counted:
            return False
        self.counts[job.queue] = self.counts.get(job.queue, 0.0) + weight - job.counted
        job.counted = weight
        return True

    def _pending_view(self, job: _Job) -> WorkloadView:
        estimate = self._estimate(job)
        view = job.view
        if view is None or view.duration_estimate != estimate:
            view = job.view = WorkloadView(
                id=job.idx,
                queue=job.queue,
                priority=job.priority,
                submit_time=job.trace.submit - self.origin,
                nodes=job.nodes,
                gpus=job.demand,
                cpus=job.trace.cpus,
                memory_bytes=job.trace.memory_bytes,
                attained_service=job.attained,
                duration_estimate=estimate,
            )
        return view

    def _running_views(self) -> tuple[WorkloadView, ...]:
        """The running workloads' views; the tuple is kept until one starts, stops or changes priority,
        or the next checkpoint of one of them passes, and then only those views are built again."""
        views = self._running_tuple
        checkpoints = self._checkpoints
        if views is not None and not (checkpoints and checkpoints[0][0] <= self.now):
            return views
        by_job = self._running_views_by_job
        while checkpoints and checkpoints[0][0] <= self.now:
            at, idx, attempt = heapq.heappop(checkpoints)
            job = self.jobs[idx]
            if job.state == "running" and job.attempt == attempt and job.ckpt_at == at:
                self._stale.append(job)
        for job in self._stale:
            if job.state == "running" and job.idx in by_job:
                by_job[job.idx] = self._running_view(job)
        self._stale.clear()
        views = self._running_tuple = cast(tuple[WorkloadView, ...], tuple(by_job.values()))
        return views

    def _running_view(self, job: _Job) -> WorkloadView:
        view = job.view
        if view is None or self.now >= job.ckpt_at:
            # The view must not depend on when it is built (cycles are skipped when nothing can change):
            # the attempt's last checkpoint, else its start; with no checkpoint interval, now (nothing is
            # lost), rebuilt at any later cycle.
            interval = self.options.checkpoint_interval
            if interval > 0:
                began = job.start + job.overhead
                saved = (max(0.0, self.now - began) // interval) * interval
                last = began + saved if saved > 0 else job.start
                job.ckpt_at = began + saved + interval
            else:
                last = self.now
                job.ckpt_at = math.nextafter(self.now, math.inf)
            heapq.heappush(self._checkpoints, (job.ckpt_at, job.idx, job.attempt))
            view = job.view = WorkloadView(
                id=job.idx,
                queue=job.queue,
                priority=job.priority,
                submit_time=job.trace.submit - self.origin,
                nodes=job.nodes,
                gpus=job.demand,
                cpus=job.trace.cpus,
                memory_bytes=job.trace.memory_bytes,
                attained_service=job.attained,
                placement=job.placement,
                start_time=job.start,
                last_checkpoint_time=last,
            )
        return view

    def _estimate(self, job: _Job) -> float | None:
        kind = self.policy.estimate
        if kind == "oracle":
            ran = job.attained / job.gpus if job.gpus > 0 else 0.0
            return job.remaining + ran  # srtf-oracle subtracts the service received
        if kind == "learned":
            for key in (job.est_key, job.trace.queue):
                stats = self._est_sum.get(key)
                if stats is not None and stats[1] > 0:
                    return stats[0] / stats[1]
        return None

    def _add_pending(self, job: _Job) -> None:
        self.pending[job.idx] = job
        self._pending_views_by_job[job.idx] = None  # built at the next cycle
        if self._unbuilt is not None:
            self._unbuilt.append(job.idx)
        self._pending_tuple = None
        _count(self._pending_sizes, job.gpus, 1)
        _count(self._pending_shapes, (job.demand.count, job.nodes), 1)
        tally = self._tally(job.queue)
        _count(tally.pending_sizes, job.gpus, 1)
        _count(tally.pending_shapes, (job.priority, job.demand.count, job.nodes), 1)

    def _start(self, job: _Job, pods: tuple[PodPlacement, ...]) -> None:
        del self.pending[job.idx]
        del self._pending_views_by_job[job.idx]
        self._pending_tuple = None
        _count(self._pending_sizes, job.gpus, -1)
        _count(self._pending_shapes, (job.demand.count, job.nodes), -1)
        tally = self._tallies[job.queue]
        _count(tally.pending_sizes, job.gpus, -1)
        _count(tally.pending_shapes, (job.priority, job.demand.count, job.nodes), -1)
        tally.running += job.gpus
        _count(tally.priorities, job.priority, 1)
        if len(pods) == 1:
            tally.victims[job.idx] = job
        for pod in pods:
            on = self._on_node.setdefault(pod.node, {})
            on[job.idx] = (*on.get(job.idx, ()), len(pod.gpu_indices) * pod.gpu_fraction)
            self._room_stale.add(pod.node)
        job.record.queued += self.now - job.pending_since
        if job.record.start is None:
            job.record.start = self.now
        job.state = "running"
        job.start = self.now
        job.attempt += 1
        job.placement = pods
        job.view = None
        job.ckpt_at = math.inf
        self.running[job.idx] = job
        self._running_views_by_job[job.idx] = None
        self._stale.append(job)
        self._running_tuple = None
        self.used += job.gpus
        self.alloc[job.trace.queue] += job.gpus
        self._recount(job)
        self._push(self.now + job.overhead + job.remaining, FINISH, job.idx, job.attempt)
        self._schedule_band(job)

    def _evict(self, job: _Job) -> None:
        elapsed = self.now - job.start
        done = self._progress(job, self.now)
        interval = self.options.checkpoint_interval
        saved = min(job.remaining, (done // interval) * interval if interval > 0 else done)
        job.record.lost_gpu_s += (elapsed - saved) * job.gpus
        job.record.preemptions += 1
        self._release(job)
        job.remaining -= saved
        job.overhead = self.options.restart_overhead
        job.attempt += 1
        job.state = "pending"
        job.pending_since = self.now
        job.priority = self._priority(job, self.now)
        self._add_pending(job)
        self._recount(job)

    def _sample(self) -> None:
        if self.now < self._next_sample:
            return
        self._next_sample = self.now + self._sample_every
        self.result.timeline.append(
            Sample(self.now, len(self.pending), self.used, dict(self.alloc), dict(self.fair))
        )
