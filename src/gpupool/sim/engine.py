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
from collections.abc import Callable, Sequence
from dataclasses import replace
from operator import attrgetter
from typing import cast

from gpupool.scheduler import (
    Decisions,
    GpuDemand,
    NodeView,
    PodPlacement,
    QueueView,
    Share,
    Snapshot,
    WorkloadView,
    decide,
)
from gpupool.scheduler.placement import gpu_matches
from gpupool.scheduler.snapshot import ANY_NODE, RESOURCES
from gpupool.sim.cluster import Cluster
from gpupool.sim.policies import POOL, Policy
from gpupool.sim.results import JobRecord, Sample, SimOptions, SimResult
from gpupool.sim.skip import EPS, SkipTest
from gpupool.sim.trace import TraceJob
from gpupool.spec.scheduling import young_totals, young_weight, young_weighted

ARRIVAL, FINISH, BAND, TICK = 0, 1, 2, 3
MAX_ROUNDS = 4  # cycles at one instant (evictions release at once; the gainers bind in the next round)
TIMELINE_POINTS = 600
_CODE = attrgetter("code")


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


def shape(gpus: float, max_per_node: int, nodes_hint: int = 0) -> tuple[int, float]:
    """(pods, GPUs per pod) for a job of `gpus` GPUs: the pods the trace says (`nodes_hint`; 1, an
    alibaba-openb pod, must fit one node or is dropped), else one pod up to a node's size, else whole
    nodes."""
    if nodes_hint > 1:
        return nodes_hint, math.ceil(gpus / nodes_hint)
    if nodes_hint == 1 or gpus <= max_per_node or max_per_node <= 0:
        return 1, gpus
    nodes = math.ceil(gpus / max_per_node)
    return nodes, float(math.ceil(gpus / nodes))


# Why a job cannot run even on the empty cluster (`unfit`), in the order asked.
GPUS, MODEL, CPUS, MEMORY = "gpus", "model", "cpus", "memory"
_FitKey = tuple[int, GpuDemand, float, int]  # pods, GPUs per pod, CPUs and memory per pod


def unfit(
    nodes: int, demand: GpuDemand, cpus: float, memory_bytes: int, cluster: Sequence[NodeView]
) -> str | None:
    """Why `nodes` pods of `demand` GPUs, `cpus` CPUs and `memory_bytes` each cannot all run on the empty
    cluster, or None where they can: fewer nodes than pods have that many GPUs (`GPUS`), then of a model
    the job accepts (`MODEL`), then with its CPUs (`CPUS`), then its memory (`MEMORY`). A node that does
    not say its CPUs or memory has no limit on them, as in the scheduler."""
    need = max(demand.count, 1)  # a fraction of a GPU needs one
    able = [n for n in cluster if len(n.gpus) >= need]
    if len(able) < nodes:
        return GPUS
    able = [n for n in able if sum(1 for g in n.gpus if gpu_matches(g.model, g.memory_bytes, demand)) >= need]
    if len(able) < nodes:
        return MODEL
    able = [n for n in able if not (n.cpus and n.cpus < cpus)]
    if len(able) < nodes:
        return CPUS
    able = [n for n in able if not (n.memory_bytes and n.memory_bytes < memory_bytes)]
    return MEMORY if len(able) < nodes else None


def drop_reasons(jobs: Sequence[TraceJob], cluster: Cluster) -> list[str | None]:
    """Why a replay on `cluster` drops each job (`unfit`), or None for a job it replays: what the engine
    finds at the job's arrival, known before any replay."""
    per_node = cluster.max_gpus_per_node
    known: dict[_FitKey, str | None] = {}
    reasons = []
    for trace in jobs:
        nodes, count = shape(trace.gpus, per_node, trace.nodes)
        key = (nodes, GpuDemand(count, trace.gpu_models), trace.cpus, trace.memory_bytes)
        if key not in known:
            known[key] = unfit(*key, cluster.nodes)
        reasons.append(known[key])
    return reasons


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
        # Each job names its queue with the queue's own string object: the scheduler looks queues up by
        # name many times a cycle, and a dict finds the very key it holds without comparing characters.
        names = {q.name: q.name for q in self.queues}
        for trace in jobs:
            nodes, count = shape(trace.gpus, per_node, trace.nodes)
            demand = GpuDemand(count, trace.gpu_models)
            queue = POOL if policy.queues == POOL else trace.queue
            queue = names.get(queue, queue)
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
        self.fair: dict[str, float] = {}  # tenant -> fair GPUs, as last reported (see `_fair_shares`)
        # the last cycle's fair shares by resource, turned into `fair` only when a sample reads it
        self._fair_shares: dict[str, dict[str, float]] | None = None
        # decayed GPU-seconds per queue, kept only for policies that tilt fair share by it
        self.usage = {q.name: 0.0 for q in self.queues} if self.config.usage_weight > 0 else {}
        # each queue's sum of its jobs' young weights, kept only for policies whose weights count them
        self.counts: dict[str, float] = {q.name: 0.0 for q in self.queues} if policy.young else {}
        # each queue's own ordering, where its spec gives one (bands apply in "las" queues only)
        self._orderings = {q.name: q.ordering for q in self.queues if q.ordering is not None}
        # band thresholds, plus the service thresholds of young work's weights
        young = {below for below, _ in policy.young}
        self._thresholds = tuple(sorted(set(policy.bands) | young))
        # The policy's properties, read once: it is a module the build does not compile, and the engine
        # asks them at every arrival, start, eviction, finish and threshold crossing.
        self._bands = policy.bands
        self._young = policy.young
        self._by_attained = policy.band_by == "attained"
        self._est_sum: dict[object, list[float]] = {}
        self._fits_cache: dict[_FitKey, bool] = {}
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
        self._cluster_gpus = cluster.gpus
        self._strict = self._strict_fifo()
        # The quotas the shortfall is measured against (`_quota_gaps`): each leaf's by its own demand, each
        # parent's by its subtree's (the queue and every one under it).
        below = _subtrees(self.tenant_queues)
        positive = [(name, quota) for name, quota in self.quotas.items() if quota > 0]
        self._positive_quotas = [(name, quota) for name, quota in positive if name not in below]
        self._parent_quotas = [(name, quota, below[name]) for name, quota in positive if name in below]
        self.result.parents = tuple(sorted(below))
        self._gaps: list[tuple[str, float]] | None = None  # `_quota_gaps()` until demand or allocation moves
        self.shortcuts = True  # skip cycles that provably change nothing (off only to test that claim)
        self.skipped = 0
        self.gainers_started = 0  # rounds saved by starting an eviction's gainer (`_start_gainer`)
        # The views the scheduler sees, kept from cycle to cycle in the order of `running` / `pending`:
        # a job's view is rebuilt only when it changed (`_stale`), or for a running job when its next
        # checkpoint passes (`_checkpoints`: a heap of (time, job, attempt)).
        self._running_views_by_job: dict[int, WorkloadView | None] = {}
        self._pending_views_by_job: dict[int, WorkloadView | None] = {}
        # pending jobs whose view is still to be built, where views are kept: not under strict FIFO, nor
        # with learned estimates (they move as other jobs finish; an oracle's stays while a job waits)
        keeps_views = self.policy.estimate != "learned" and not self._strict
        self._unbuilt: list[int] | None = [] if keeps_views else None
        self._stale: list[_Job] = []
        self._checkpoints: list[tuple[float, int, int]] = []
        self._running_tuple: tuple[WorkloadView, ...] | None = None
        self._pending_tuple: tuple[WorkloadView, ...] | None = None  # kept until the pending set changes
        # The workloads the last cycle's evictions were for: their victims stopped at once (the engine
        # releases evicted GPUs at once), so the next cycle gives them as `victims_stopped`, as the server
        # does once their victims have stopped: their room is theirs, served first.
        self._owed: frozenset[int] = frozenset()
        # and the room the last cycle left each of them waiting for: the next cycle's `Snapshot.nominated`
        self._nominated: dict[int, tuple[PodPlacement, ...]] = {}
        self._queues_tuple: tuple[QueueView, ...] | None = None
        self._queues_counts: tuple[float, ...] = ()
        self._queues_totals: list[float] = []  # each queue's young total behind `_queues_tuple`
        self._queues_nested = any(q.parent is not None for q in self.queues)
        self._queues_weighted: dict[tuple[int, float], QueueView] = {}  # (queue, young total) -> its view
        self._min_runtimes = any(
            (q.min_runtime_preempt or 0) > 0 or (q.min_runtime_reclaim or 0) > 0 for q in self.queues
        )
        self._dirty = False
        # whether the one gainer of an eviction may start on its nominated room without a round (see
        # `_start_gainer`): its admission can refuse it only through a queue limit, or non-preemptible
        # work's quota (trace jobs are preemptible; `sim whatif`'s live ones may not be), and its room's node
        # only by CPUs, memory or a backfill reservation (and under strict or backfill blocking the skip
        # tests read the line's head)
        gpus_only = not any(j.trace.cpus > 0 or j.trace.memory_bytes > 0 for j in self.jobs)
        self._gainers_start_at_once = (
            self.config.blocking == "skip"
            and not any(q.share(resource).limit is not None for q in self.queues for resource in RESOURCES)
            and gpus_only
            and all(j.trace.preemptible for j in self.jobs)
        )
        # The skip test models backfill's reservation by GPUs alone: where jobs ask for CPUs or memory,
        # which reservations count too, it does not model it (those cycles run).
        self.skip = SkipTest(
            cluster, self.config, self.queues, self._queues_for_cycle,
            strict=self._strict, backfill=self._backfill_fifo() and gpus_only, nested=self._queues_nested,
        )  # fmt: skip

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
            if t - self.now >= self._sample_every:
                self._sample_before_lull()
            self._advance(t)
            while self.events and self.events[0][0] <= t:
                _, _, kind, index, token = heapq.heappop(self.events)
                self._handle(kind, self.jobs[index], token)
            if not self.pending:
                next_tick = math.inf
            elif self._dirty or t == next_tick:
                next_tick = t + self.options.cycle if self._cycles(t == next_tick) else math.inf
            steps += 1
            if progress is not None and steps % 200 == 0:
                progress(self.settled, len(self.jobs))
        self._sample_before_lull()  # the end: what stays
        self.result.unfinished = len(self.pending) + len(self.running)
        if math.isinf(self.result.arrival_window):  # all arrived at once: the run, to its last finish
            self.result.arrival_window = (
                max((j.record.finish for j in self.jobs if j.record.finish is not None), default=self.now)
                if not self.result.unfinished
                else self.now
            )
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
            gaps = self._gaps
            if gaps is None:
                gaps = self._gaps = self._quota_gaps()
            shortfall = self.result.shortfall_gpu_s
            for name, gap in gaps:
                shortfall[name] += gap * dt
        self.now = t

    def _quota_gaps(self) -> list[tuple[str, float]]:
        """(queue, GPUs it wants within its quota but does not have) for each queue short of them. A leaf
        wants its own jobs' GPUs; a parent, those of its subtree, against its own quota (its line alone:
        the overall figure counts the leaves, `metrics.summarize`)."""
        demand, alloc = self.demand, self.alloc
        gaps = []
        for name, quota in self._positive_quotas:
            wanted = min(quota, demand.get(name, 0.0))
            got = alloc.get(name, 0.0)
            if got + EPS < wanted:
                gaps.append((name, wanted - got))
        for name, quota, members in self._parent_quotas:
            wanted = min(quota, sum(demand.get(m, 0.0) for m in members))
            got = sum(alloc.get(m, 0.0) for m in members)
            if got + EPS < wanted:
                gaps.append((name, wanted - got))
        return gaps

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
        self._gaps = None
        self.skip.arrive(job)
        self._recount(job)
        self._dirty = True

    def _fits_empty(self, job: _Job) -> bool:
        """Whether the job fits the empty cluster: enough nodes with its GPUs, CPUs and memory (`unfit`)."""
        trace = job.trace
        key = (job.nodes, job.demand, trace.cpus, trace.memory_bytes)
        if key not in self._fits_cache:
            self._fits_cache[key] = unfit(*key, self.cluster.nodes) is None
        return self._fits_cache[key]

    def _finish(self, job: _Job) -> None:
        self._release(job)
        job.state = "done"
        self.settled += 1
        job.record.finish = self.now
        job.record.lost_gpu_s += job.overhead * job.gpus  # the restart this attempt paid, if it was one
        self.demand[job.trace.queue] -= job.gpus
        self._gaps = None
        self.skip.finish(job)
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
        self._gaps = None
        self.skip.release(job)
        self.attained_update(job)
        job.placement = ()
        job.view = None
        self._dirty = True

    def attained_update(self, job: _Job) -> None:
        job.attained += (self.now - job.start) * job.gpus

    def _band(self, job: _Job) -> None:
        priority = self._priority(job, self.now)
        if priority != job.priority:
            self.skip.reband(job, priority)
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
        if not self._bands:
            return 0
        attained = job.attained + ((now - job.start) * job.gpus if job.state == "running" else 0.0)
        remaining = (job.remaining - self._progress(job, now)) * job.gpus
        return self.policy.priority(attained, remaining, self._orderings.get(job.queue))

    def _schedule_band(self, job: _Job) -> None:
        bands = self._thresholds
        if not bands or job.gpus <= 0:
            return
        now = self.now
        if self._by_attained:
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
        """Run the scheduler at this instant as often as evictions ask for; whether the clock matters (by the
        next tick: False where an event that surely runs a cycle comes first)."""
        if not (self._dirty or tick):
            return False
        if self.shortcuts and self._skips():
            return False
        for _ in range(MAX_ROUNDS):
            self._reset_triggers()
            decisions = self._cycle()
            if not decisions.evictions:
                break
            if self.shortcuts and self._start_gainer():
                return False
        self._sample()
        # The answer matters only if the tick it would set can come: not where an event before it surely
        # runs a cycle, whose own answer sets the tick afresh (`run`).
        events = self.events
        if events and events[0][0] < self.now + self.options.cycle and self._wakes(events[0]):
            return False
        return self._clock_matters(decisions)

    def _skips(self) -> bool:
        """Skip the cycle this instant would run where it provably changes nothing (`SkipTest`)."""
        skip = self.skip.nothing_can_change(self.used, self.pending, bool(self.running))
        self._skip_fair()
        if skip:
            self._reset_triggers()
            self.skipped += 1
            self._sample()
        return skip

    def _skip_fair(self) -> None:
        if self.skip.fair is not None and self.policy.queues != POOL:
            self.fair = self.skip.fair  # what a skipped cycle would have reported
            self._fair_shares = None

    def _start_gainer(self) -> bool:
        """Start the one workload the last round's evictions were for, on the room it was left waiting for,
        where the next round would do that and nothing else: its victims stopped at once, so that round
        serves it first and gives it that room (`Snapshot.nominated`), then goes on as any cycle, and the
        skip test, asked with the workload started, finds nothing more that round could do. Only where
        nothing can refuse it that room: one gainer (several start in the round's order among them, which
        orders their finish events), no queue limit, nothing but GPUs asked. Else the round runs."""
        if len(self._owed) != 1 or not self._gainers_start_at_once:
            return False
        (gainer,) = self._owed
        room = self._nominated.get(gainer)
        job = self.pending.get(gainer)
        if room is None or job is None:
            return False
        skip = self.skip
        job.placement = room  # as started, for the tests (they read running jobs' placements)
        skip.start(job, room)
        # The tests read the pending jobs themselves only for the head of a strict or backfill line, which
        # this never meets (see `_gainers_start_at_once`): their tallies already count the gainer started.
        rest = len(self.pending) > 1
        if rest and not skip.nothing_can_change(self.used + job.gpus, self.pending, True):
            skip.release(job)
            skip.add_pending(job)
            job.placement = ()
            return False
        self._owed, self._nominated = frozenset(), {}
        self._reset_triggers()
        self._start(job, room, tallied=True)
        self.gainers_started += 1
        if rest:
            self._skip_fair()
        self._sample()
        return True

    def _wakes(self, event: tuple[float, int, int, int, int]) -> bool:
        """Whether this event surely runs a cycle at its instant: a job arriving that the cluster can hold,
        or the end of a running attempt. An event of an attempt evicted since, or a band change that moves
        no priority, changes nothing, and a tick set before it must still come."""
        _, _, kind, index, token = event
        job = self.jobs[index]
        if kind == ARRIVAL:
            return self._fits_empty(job)
        return kind == FINISH and token == job.attempt and job.state == "running"

    def _reset_triggers(self) -> None:
        self._dirty = False

    def _strict_fifo(self) -> bool:
        """One queue in submit order that nothing may pass: only its head (and what fits before the first
        blocked job) can start. Evictions never happen in it, so `pending` stays in submit order."""
        return self._one_fifo_line("strict")

    def _backfill_fifo(self) -> bool:
        """One queue in submit order under `blocking: backfill`, allocate only: the first job that
        cannot start reserves nodes that nothing behind it may use (no workload declares a duration)."""
        return self._one_fifo_line("backfill")

    def _one_fifo_line(self, blocking: str) -> bool:
        """One queue in submit order, allocate only, with this blocking mode."""
        config = self.config
        return (
            self.policy.queues == POOL
            and config.blocking == blocking
            and config.ordering == "fifo"
            and not self._bands
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
        owed = self._owed
        if owed:
            pending = tuple(v.with_victims_stopped() if v.id in owed else v for v in pending)
        running = self._running_views()
        nominated = self._nominated
        snapshot = Snapshot(
            self.cluster.nodes, pending, self._queues_for_cycle(), running, self.config, nominated
        )
        began = time.perf_counter()
        decisions = decide(snapshot, self.now)
        self.result.decide_s += time.perf_counter() - began
        self.result.cycles += 1
        self._owed = frozenset(e.for_workload for e in decisions.evictions if e.for_workload is not None)
        self._nominated = {w: decisions.nominated[w] for w in self._owed if w in decisions.nominated}
        if decisions.fair_shares and self.policy.queues != POOL:
            self._fair_shares = decisions.fair_shares
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
            weight = young_weight(attained, self._young)
        if weight == job.counted:
            return False
        self.counts[job.queue] = self.counts.get(job.queue, 0.0) + weight - job.counted
        job.counted = weight
        return True

    def _pending_view(self, job: _Job) -> WorkloadView:
        estimate = self._estimate(job)
        view = job.view
        if view is None or view.duration_estimate != estimate:
            view = job.view = workload_view(job, self.origin, duration_estimate=estimate)
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
            view = job.view = workload_view(
                job, self.origin, placement=job.placement, start_time=job.start, last_checkpoint_time=last
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
        self.skip.add_pending(job)

    def _start(self, job: _Job, pods: tuple[PodPlacement, ...], *, tallied: bool = False) -> None:
        """`tallied`: the skip test has counted the start already."""
        del self.pending[job.idx]
        del self._pending_views_by_job[job.idx]
        self._pending_tuple = None
        if not tallied:
            self.skip.start(job, pods)
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
        self._gaps = None
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

    def _sample_before_lull(self) -> None:
        """Record the state that holds through a stretch with nothing to do. Samples are taken at cycles, at
        most one an interval, so the finishes between them, which need no cycle, would go unrecorded: with
        nothing pending, the utilization plot would draw its line from one busy moment to the next."""
        timeline = self.result.timeline
        if timeline and timeline[-1].t == self.now:
            timeline.pop()  # taken amid this instant's events: the state at its end replaces it
        self._next_sample = self.now
        self._sample()

    def _sample(self) -> None:
        if self.now < self._next_sample:
            return
        self._next_sample = self.now + self._sample_every
        if self._fair_shares is not None:
            self.fair = {q: s.get("gpu", 0.0) for q, s in self._fair_shares.items()}
            self._fair_shares = None
        if not self.pending and self.fair and self.policy.queues != POOL:
            # Nothing waits, so no cycle runs to say it; fair shares are capped by demand, and with every
            # job running each queue's is what it holds (the last cycle's figures would stand for days).
            self.fair = {q: self.alloc.get(q, 0.0) for q in self.fair}
        self.result.timeline.append(
            Sample(self.now, len(self.pending), self.used, dict(self.alloc), dict(self.fair))
        )


def _subtrees(queues: Sequence[QueueView]) -> dict[str, tuple[str, ...]]:
    """Each parent queue's subtree: itself and every queue under it, at any depth."""
    children: dict[str, list[str]] = {}
    for q in queues:
        if q.parent is not None:
            children.setdefault(q.parent, []).append(q.name)
    subtrees = {}
    for parent in children:
        found, frontier = [parent], [parent]
        while frontier:
            frontier = [c for q in frontier for c in children.get(q, ()) if c not in found]
            found += frontier
        subtrees[parent] = tuple(found)
    return subtrees


def workload_view(
    job: _Job,
    origin: float,
    *,
    duration_estimate: float | None = None,
    placement: tuple[PodPlacement, ...] = (),
    start_time: float | None = None,
    last_checkpoint_time: float | None = None,
) -> WorkloadView:
    """The scheduler's view of a trace job: pending (no placement) or running.

    The one place the engine builds a view, by position: this module and the scheduler are compiled
    apart, and a call across them with keywords makes the view's compiled `__init__` look each of its
    22 parameter names up in a dict, 13,000 instructions a view, 6% of a replay (docs/benchmarks.md
    "Simulator"); by position it takes a few hundred. A unit test checks it against the keyword form, so a
    field moved in WorkloadView cannot slip by."""
    trace = job.trace
    return WorkloadView(
        job.idx,  # id
        job.queue,  # queue
        job.priority,  # priority
        trace.submit - origin,  # submit_time
        job.nodes,  # nodes
        job.demand,  # gpus
        trace.cpus,  # cpus
        trace.memory_bytes,  # memory_bytes
        trace.preemptible,  # preemptible
        None,  # topology
        None,  # topology_preferred
        ANY_NODE,  # node_names
        None,  # max_duration
        job.attained,  # attained_service
        duration_estimate,  # duration_estimate
        placement,  # placement
        start_time,  # start_time
        last_checkpoint_time,  # last_checkpoint_time
    )
