"""A seeded, realistic synthetic cluster as a scheduler `Snapshot`, and a way to apply `Decisions` to it.

Not imported by the package or the tests. `build_snapshot` gives the same values for the same arguments
(each call builds new objects); `apply_decisions` plays the control loop: binds start, evictions requeue.

What it builds:
- nodes: racks of 32 nodes, racks spread over 4 zones; ~70% of racks H100 80GB, ~30% A100 (half 40GB,
  half 80GB); two NVLink islands per node; 224 CPUs and 2 TiB per 8-GPU node; ~1.5% not schedulable;
  ~0.5% with one GPU held by foreign use.
- queues: departments of ~10 leaf queues; leaf GPU quotas (lognormal sizes, a few zero) sum to ~95% of
  the schedulable GPUs; a department's quota is its children's sum; random limits, over-quota weights,
  priority tiers, orderings and minimum runtimes; CPU and memory quotas in proportion to GPUs.
- workloads: a size mix of 0.5, 1, 2, 4, 8 GPUs per pod and gangs of 2-4 x 8 GPUs, some bound to a GPU
  model or memory size, priorities from {50, 75, 100, 125}, mostly preemptible. Running ones are placed
  biggest first, partly best-fit and partly on random nodes, never over-committing a GPU and never
  exceeding a queue limit (a workload that no longer fits is shrunk along the size ladder); pending ones
  are spread over queues with a skew, so the busiest queues want far more than their quota.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gpupool.scheduler.snapshot import (
    Decisions,
    GpuDemand,
    GpuView,
    NodeView,
    PodPlacement,
    QueueView,
    SchedulerConfig,
    Share,
    Snapshot,
    WorkloadView,
)

GIB = 1024**3
NOW = 1_750_000_000.0  # a fixed "now" so every run of the generator gives the same snapshot
RACK_SIZE = 32
ZONES = 4
QUEUES_PER_DEPARTMENT = 10
EPSILON = 1e-9

# (pods, GPUs per pod, weight): mostly 1-GPU pods, ~1% multi-node gangs. Averages ~1.7 GPUs a workload.
SIZE_MIX: tuple[tuple[int, float, float], ...] = (
    (1, 0.5, 0.15),
    (1, 1.0, 0.615),
    (1, 2.0, 0.12),
    (1, 4.0, 0.07),
    (1, 8.0, 0.03),
    (2, 8.0, 0.005),
    (3, 8.0, 0.0025),
    (4, 8.0, 0.0025),
)
# A running workload that no longer fits is shrunk to the next rung: 8 -> 4 -> 2 -> 1 -> 0.5 GPUs.
SIZE_LADDER = (8.0, 4.0, 2.0, 1.0, 0.5)
PRIORITIES = (50, 75, 100, 125)
PRIORITY_WEIGHTS = (0.2, 0.25, 0.45, 0.1)
MAX_DURATIONS = (3600.0, 4 * 3600.0, 12 * 3600.0, 24 * 3600.0, 72 * 3600.0)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What to generate; the defaults are the issue's 1,000-node target."""

    nodes: int = 1000
    gpus_per_node: int = 8
    pending: int = 5000
    running: int = 4000
    queues: int = 50
    seed: int = 1
    now: float = NOW
    config: SchedulerConfig = field(default_factory=SchedulerConfig)  # the policy the snapshot carries


@dataclass(slots=True)
class ClusterStats:
    """What the generator actually produced, for the report."""

    gpus: int = 0
    schedulable_gpus: int = 0
    departments: int = 0
    running_gpu_units: float = 0.0
    pending_gpu_units: float = 0.0
    running_shrunk: int = 0  # running workloads made smaller than drawn because the cluster was full
    running_gangs: int = 0
    pending_gangs: int = 0
    models: dict[str, int] = field(default_factory=dict)  # GPUs per model


def build_snapshot(spec: ClusterSpec) -> tuple[Snapshot, ClusterStats]:
    """A Snapshot for `spec`; the same spec always gives equal values (new objects each call)."""
    if spec.nodes < 1 or spec.gpus_per_node < 1 or spec.queues < 1 or spec.pending < 0 or spec.running < 0:
        raise ValueError("nodes, gpus_per_node and queues must be >= 1; pending and running >= 0")
    rng = random.Random(spec.seed)
    stats = ClusterStats()
    nodes = _nodes(spec, rng, stats)
    queues = _queues(spec, nodes, rng, stats)
    leaves = [q for q in queues if q.parent is not None]
    running = _running(spec, nodes, queues, leaves, rng, stats)
    pending = _pending(spec, leaves, rng, stats)
    # Ids in submit order, as a store would hand them out.
    ordered = sorted([*running, *pending], key=lambda w: w.submit_time)
    new_id = {id(w): i for i, w in enumerate(ordered, 1)}
    snapshot = Snapshot(
        nodes=tuple(nodes),
        pending=tuple(replace(w, id=new_id[id(w)]) for w in pending),
        queues=tuple(queues),
        running=tuple(replace(w, id=new_id[id(w)]) for w in running),
        config=spec.config,
    )
    return snapshot, stats


# -- nodes --------------------------------------------------------------------------------------------------


def _nodes(spec: ClusterSpec, rng: random.Random, stats: ClusterStats) -> list[NodeView]:
    n_racks = math.ceil(spec.nodes / RACK_SIZE)
    # Whole racks share a model when there are enough racks to keep the 70/30 split; else node by node.
    by_rack = n_racks >= 4
    units = n_racks if by_rack else spec.nodes
    a100 = set(rng.sample(range(units), round(0.3 * units)))
    a100_80gb = {u for u in a100 if rng.random() < 0.5}
    half = max(1, spec.gpus_per_node // 2)
    nodes: list[NodeView] = []
    for i in range(spec.nodes):
        rack = i // RACK_SIZE
        unit = rack if by_rack else i
        if unit in a100:
            model, memory = "A100", (80 if unit in a100_80gb else 40) * GIB
        else:
            model, memory = "H100", 80 * GIB
        foreign = rng.random() < 0.005
        gpus = tuple(
            GpuView(
                index=g,
                model=model,
                memory_bytes=memory,
                nvlink_island=g // half if spec.gpus_per_node >= 8 else 0,
                allocated=1.0 if foreign and g == spec.gpus_per_node - 1 else 0.0,
            )
            for g in range(spec.gpus_per_node)
        )
        draw = rng.random()
        state = "cordoned" if draw < 0.01 else "not-ready" if draw < 0.015 else "ready"
        nodes.append(
            NodeView(
                name=f"node-{i:05d}",
                schedulable=state == "ready",
                gpus=gpus,
                cpus=28.0 * spec.gpus_per_node,
                memory_bytes=256 * GIB * spec.gpus_per_node,
                state=state,
                labels=(("zone", f"zone-{rack % ZONES}"), ("rack", f"rack-{rack:04d}")),
            )
        )
        stats.gpus += spec.gpus_per_node
        stats.models[model] = stats.models.get(model, 0) + spec.gpus_per_node
        if state == "ready":
            stats.schedulable_gpus += sum(1 for g in gpus if g.allocated == 0.0)
    return nodes


# -- queues -------------------------------------------------------------------------------------------------


def _queues(
    spec: ClusterSpec, nodes: Sequence[NodeView], rng: random.Random, stats: ClusterStats
) -> list[QueueView]:
    capacity = sum(len(n.gpus) for n in nodes if n.schedulable)
    cpu_per_gpu = nodes[0].cpus / max(1, len(nodes[0].gpus))
    memory_per_gpu = nodes[0].memory_bytes / max(1, len(nodes[0].gpus))
    n_departments = max(1, round(spec.queues / QUEUES_PER_DEPARTMENT))
    stats.departments = n_departments

    sizes = [0.0 if rng.random() < 0.05 else rng.lognormvariate(0.0, 0.8) for _ in range(spec.queues)]
    scale = 0.95 * capacity / (sum(sizes) or 1.0)
    quotas = [math.floor(s * scale) for s in sizes]

    def queue(name: str, parent: str | None, quota: float, limit: float | None, weight: float) -> QueueView:
        """A queue with GPU shares as given and CPU and memory shares in proportion."""
        return QueueView(
            name=name,
            parent=parent,
            gpu=Share(quota=quota, limit=limit, weight=weight),
            cpu=Share(quota=quota * cpu_per_gpu, limit=None if limit is None else limit * cpu_per_gpu),
            memory=Share(
                quota=quota * memory_per_gpu, limit=None if limit is None else limit * memory_per_gpu
            ),
            usage=quota * rng.uniform(0.0, 2.0) * 86400.0,
        )

    leaves: list[QueueView] = []
    department_of = [i * n_departments // spec.queues for i in range(spec.queues)]
    for i, quota in enumerate(quotas):
        draw = rng.random()
        if draw < 0.35:
            limit: float | None = None
        elif draw < 0.45:
            limit = float(max(quota, 1))  # hard-capped at its quota
        else:
            limit = float(math.ceil(max(quota, 1) * rng.choice((1.5, 2.0, 3.0, 4.0))))
        department = f"dept-{department_of[i]:02d}"
        weight = rng.choice((1.0, 1.0, 1.0, 2.0, 3.0, 5.0))
        leaf = queue(f"{department}/team-{i:03d}", department, float(quota), limit, weight)
        leaves.append(
            replace(
                leaf,
                ordering="attained" if rng.random() < 0.2 else "fifo",
                min_runtime_preempt=rng.choice((None, None, None, 300.0)),
                min_runtime_reclaim=rng.choice((None, None, None, 300.0, 1800.0)),
            )
        )
    departments: list[QueueView] = []
    for d in range(n_departments):
        total = float(sum(q for q, dep in zip(quotas, department_of, strict=True) if dep == d))
        cap = None if rng.random() < 0.5 else float(math.ceil(1.5 * total))
        top = queue(f"dept-{d:02d}", None, total, cap, 1.0)
        departments.append(
            replace(
                top,
                priority=1 if rng.random() < 0.15 else 0,
                min_runtime_preempt=60.0,
                min_runtime_reclaim=600.0,
            )
        )
    return [*departments, *leaves]


def _queue_weights(queues: Sequence[QueueView], rng: random.Random, floor: float) -> list[float]:
    """How busy each queue is: its quota plus a floor, times a heavy-tailed random factor."""
    return [(q.gpu.quota + floor) * rng.lognormvariate(0.0, 1.0) for q in queues]


# -- workloads ----------------------------------------------------------------------------------------------


def _draw_shape(rng: random.Random, gpus_per_node: int) -> tuple[int, float]:
    pods, per_pod, _ = rng.choices(SIZE_MIX, weights=[w for *_, w in SIZE_MIX])[0]
    if per_pod >= 1:
        per_pod = float(min(per_pod, gpus_per_node))
    return pods, per_pod


def _pod_resources(per_pod: float, rng: random.Random) -> tuple[float, int]:
    """CPUs and memory per pod; never more per GPU than a node has per GPU (28 CPUs, 256 GiB)."""
    if per_pod < 1:
        return 4.0, rng.choice((16, 32)) * GIB
    return per_pod * rng.choice((4.0, 8.0, 12.0, 16.0)), int(per_pod) * rng.choice((32, 64, 96)) * GIB


def _priority(rng: random.Random) -> int:
    return rng.choices(PRIORITIES, weights=PRIORITY_WEIGHTS)[0]


def _pending(
    spec: ClusterSpec, leaves: Sequence[QueueView], rng: random.Random, stats: ClusterStats
) -> list[WorkloadView]:
    weights = _queue_weights(leaves, rng, floor=0.02 * stats.schedulable_gpus / len(leaves))
    cumulative = _cumulative(weights)
    pending: list[WorkloadView] = []
    for _ in range(spec.pending):
        queue = rng.choices(leaves, cum_weights=cumulative)[0]
        pods, per_pod = _draw_shape(rng, spec.gpus_per_node)
        cpus, memory = _pod_resources(per_pod, rng)
        draw = rng.random()
        models: tuple[str, ...] = ()
        min_memory: int | None = None
        if draw < 0.25:
            models = ("H100",)
        elif draw < 0.30:
            models = ("A100",)
        elif draw < 0.35:
            models = ("H100", "A100-80GB")
        elif draw < 0.40:
            min_memory = 80 * 10**9
        topology = preferred = None
        if pods > 1:
            stats.pending_gangs += 1
            draw = rng.random()
            if draw < 0.3:
                topology = "zone"
            elif draw < 0.7:
                preferred = "rack"
        age = min(rng.expovariate(1 / 7200.0), 7 * 86400.0)
        pending.append(
            WorkloadView(
                id=0,
                queue=queue.name,
                priority=_priority(rng),
                submit_time=spec.now - age,
                nodes=pods,
                gpus=GpuDemand(count=per_pod, models=models, min_memory_bytes=min_memory),
                cpus=cpus,
                memory_bytes=memory,
                preemptible=rng.random() < 0.8,
                topology=topology,
                topology_preferred=preferred,
                max_duration=rng.choice(MAX_DURATIONS) if rng.random() < 0.3 else None,
                attained_service=(rng.uniform(0.0, per_pod * pods * 86400.0) if rng.random() < 0.2 else 0.0),
            )
        )
        stats.pending_gpu_units += per_pod * pods
    return pending


def _cumulative(weights: Sequence[float]) -> list[float]:
    total, out = 0.0, []
    for w in weights:
        total += w
        out.append(total)
    return out


class _Occupancy:
    """GPU use per node while the generator places running workloads (whole GPUs and 0.5 shares)."""

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        self.nodes = nodes
        self.size = len(nodes[0].gpus)
        self.used = [[g.allocated for g in n.gpus] for n in nodes]
        self.schedulable = [i for i, n in enumerate(nodes) if n.schedulable]
        self.whole_free = [sum(1 for u in used if u == 0.0) for used in self.used]
        self.by_free: list[set[int]] = [set() for _ in range(self.size + 1)]
        self.empty_by_rack: dict[str, set[int]] = {}
        self.rack = [n.label("rack") or "" for n in nodes]
        self.zone = [n.label("zone") or "" for n in nodes]
        self.half_free: dict[tuple[int, int], None] = {}  # GPUs shared by one 0.5 pod, in use order
        for i in self.schedulable:
            self._index(i)

    def _index(self, node: int) -> None:
        self.by_free[self.whole_free[node]].add(node)
        if self.whole_free[node] == self.size:
            self.empty_by_rack.setdefault(self.rack[node], set()).add(node)

    def _unindex(self, node: int) -> None:
        self.by_free[self.whole_free[node]].discard(node)
        if self.whole_free[node] == self.size:
            self.empty_by_rack[self.rack[node]].discard(node)

    def _take_whole(self, node: int, count: int) -> tuple[int, ...]:
        """Claim `count` free GPUs on `node`, one NVLink island when one holds them all."""
        gpus = self.nodes[node].gpus
        free = [g for g in gpus if self.used[node][g.index] == 0.0]
        islands: dict[int, list[GpuView]] = {}
        for g in free:
            islands.setdefault(g.nvlink_island, []).append(g)
        fitting = [gs for gs in islands.values() if len(gs) >= count]
        chosen = min(fitting, key=len)[:count] if fitting else free[:count]
        self._unindex(node)
        for g in chosen:
            self.used[node][g.index] = 1.0
        self.whole_free[node] -= count
        self._index(node)
        return tuple(g.index for g in chosen)

    def _node_with(self, count: int, rng: random.Random) -> int | None:
        """A node with `count` whole free GPUs: 30% of the time a random one (fragments), else best fit."""
        if rng.random() < 0.3:
            for _ in range(8):
                node = rng.choice(self.schedulable)
                if self.whole_free[node] >= count:
                    return node
        for free in range(count, self.size + 1):
            bucket = self.by_free[free]
            if bucket:
                node = bucket.pop()
                bucket.add(node)
                return node
        return None

    def place(self, pods: int, per_pod: float, rng: random.Random) -> tuple[PodPlacement, ...] | None:
        if per_pod < 1:
            return self._place_share(rng)
        if pods == 1:
            node = self._node_with(int(per_pod), rng)
            if node is None:
                return None
            return (PodPlacement(self.nodes[node].name, self._take_whole(node, int(per_pod))),)
        return self._place_gang(pods, rng)

    def _place_share(self, rng: random.Random) -> tuple[PodPlacement, ...] | None:
        if self.half_free:
            (node, gpu), _ = self.half_free.popitem()
            self.used[node][gpu] = 1.0
            return (PodPlacement(self.nodes[node].name, (gpu,), 0.5),)
        found = self._node_with(1, rng)
        if found is None:
            return None
        (gpu,) = self._take_whole(found, 1)
        self.used[found][gpu] = 0.5
        self.half_free[(found, gpu)] = None
        return (PodPlacement(self.nodes[found].name, (gpu,), 0.5),)

    def _place_gang(self, pods: int, rng: random.Random) -> tuple[PodPlacement, ...] | None:
        """`pods` empty nodes: in one rack when one has room, else anywhere (as schedulers try)."""
        racks = [r for r, members in self.empty_by_rack.items() if len(members) >= pods]
        if racks:
            members = self.empty_by_rack[rng.choice(racks)]
            chosen = sorted(members)[:pods]
        else:
            empty = self.by_free[self.size]
            if len(empty) < pods:
                return None
            chosen = sorted(empty)[:pods]
        return tuple(PodPlacement(self.nodes[n].name, self._take_whole(n, self.size)) for n in chosen)


def _running(
    spec: ClusterSpec,
    nodes: Sequence[NodeView],
    queues: Sequence[QueueView],
    leaves: Sequence[QueueView],
    rng: random.Random,
    stats: ClusterStats,
) -> list[WorkloadView]:
    if spec.running == 0:
        return []
    occupancy = _Occupancy(nodes)
    node_model = {n.name: n.gpus[0].model for n in nodes}
    node_zone = {n.name: n.label("zone") for n in nodes}
    by_name = {q.name: q for q in queues}
    used: defaultdict[str, float] = defaultdict(float)  # GPU units per queue, leaves and departments
    guaranteed: defaultdict[str, float] = defaultdict(float)  # non-preemptible GPU units per leaf
    weights = _queue_weights(leaves, rng, floor=0.02 * stats.schedulable_gpus / len(leaves))
    cumulative = _cumulative(weights)
    # Biggest first, as a packed cluster would have fitted them.
    shapes = sorted(
        (_draw_shape(rng, spec.gpus_per_node) for _ in range(spec.running)), key=lambda s: -s[0] * s[1]
    )
    running: list[WorkloadView] = []
    for pods, per_pod in shapes:
        placement = occupancy.place(pods, per_pod, rng)
        while placement is None:
            smaller = [s for s in SIZE_LADDER if s < per_pod or (pods > 1 and s <= per_pod)]
            if not smaller:
                raise ValueError(
                    f"--running {spec.running} does not fit on {spec.nodes} nodes x {spec.gpus_per_node} "
                    "GPUs (the mix averages ~1.7 GPUs a workload): lower --running or raise --nodes"
                )
            pods, per_pod = 1, smaller[0]
            stats.running_shrunk += 1
            placement = occupancy.place(pods, per_pod, rng)
        units = pods * per_pod
        queue = _queue_with_room(leaves, cumulative, by_name, used, units, rng)
        preemptible = rng.random() < 0.85
        if not preemptible and guaranteed[queue.name] + units > queue.gpu.quota + EPSILON:
            preemptible = True  # non-preemptible work only ever runs within quota
        if not preemptible:
            guaranteed[queue.name] += units
        used[queue.name] += units
        if queue.parent is not None:
            used[queue.parent] += units
        running.append(_running_workload(spec, queue, pods, per_pod, placement, preemptible, rng,
                                         node_model, node_zone))  # fmt: skip
        stats.running_gpu_units += units
        stats.running_gangs += pods > 1
    return running


def _queue_with_room(
    leaves: Sequence[QueueView],
    cumulative: Sequence[float],
    by_name: dict[str, QueueView],
    used: defaultdict[str, float],
    units: float,
    rng: random.Random,
) -> QueueView:
    """A leaf drawn by busyness whose limit (and its department's) still has room for `units`."""

    def has_room(q: QueueView) -> bool:
        for name in (q.name, q.parent):
            if name is None:
                continue
            limit = by_name[name].gpu.limit
            if limit is not None and used[name] + units > limit + EPSILON:
                return False
        return True

    for _ in range(20):
        queue = rng.choices(leaves, cum_weights=cumulative)[0]
        if has_room(queue):
            return queue
    for queue in leaves:
        if has_room(queue):
            return queue
    raise ValueError("every queue is at its limit: the generated quotas and limits are too small")


def _running_workload(
    spec: ClusterSpec,
    queue: QueueView,
    pods: int,
    per_pod: float,
    placement: tuple[PodPlacement, ...],
    preemptible: bool,
    rng: random.Random,
    node_model: dict[str, str],
    node_zone: dict[str, str | None],
) -> WorkloadView:
    elapsed = min(rng.expovariate(1 / (12 * 3600.0)), 7 * 86400.0) + 1.0
    start = spec.now - elapsed
    cpus, memory = _pod_resources(per_pod, rng)
    model = node_model[placement[0].node]
    models = (model,) if rng.random() < 0.4 else ()  # a constraint the placement already satisfies
    topology = preferred = None
    if pods > 1:
        draw = rng.random()
        if draw < 0.3 and len({node_zone[p.node] for p in placement}) == 1:
            topology = "zone"
        elif draw < 0.7:
            preferred = "rack"
    declared = [d for d in MAX_DURATIONS if d > elapsed]
    units = pods * per_pod
    return WorkloadView(
        id=0,
        queue=queue.name,
        priority=_priority(rng),
        submit_time=start - rng.uniform(0.0, 7200.0),
        nodes=pods,
        gpus=GpuDemand(count=per_pod, models=models),
        cpus=cpus,
        memory_bytes=memory,
        preemptible=preemptible,
        topology=topology,
        topology_preferred=preferred,
        max_duration=rng.choice(declared) if declared and rng.random() < 0.3 else None,
        attained_service=units * elapsed + (rng.uniform(0.0, units * 86400.0) if rng.random() < 0.2 else 0.0),
        placement=placement,
        start_time=start,
        last_checkpoint_time=spec.now - rng.uniform(0.0, min(elapsed, 3600.0))
        if rng.random() < 0.6
        else None,
        stopping=rng.random() < 0.003,
    )


# -- the control loop's side: apply decisions ---------------------------------------------------------------


@dataclass(slots=True)
class ApplyReport:
    """What applying one `Decisions` did, and anything in it that a correct scheduler never emits."""

    binds: int = 0
    evictions: int = 0
    eviction_codes: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # first few only
    problem_count: int = 0

    def problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < 10:
            self.problems.append(text)


def apply_decisions(snapshot: Snapshot, decisions: Decisions, now: float) -> tuple[Snapshot, ApplyReport]:
    """The next snapshot: bound workloads run from `now`; evicted ones are released and pending again.

    As the control loop does once evicted work has stopped (`control/loop.py`), and the simulator's engine
    at once: the workloads this cycle evicted for are pending with `victims_stopped`, and the room the
    cycle left each waiting for is the next snapshot's `nominated` (so a gainer takes the GPUs released
    for it, served first, and does not evict again for GPUs that other work took).

    Checks on the way that binds name pending workloads, one placement per pod, schedulable nodes, and
    leave no GPU over-committed; evictions name running workloads.
    """
    report = ApplyReport(binds=len(decisions.binds), evictions=len(decisions.evictions))
    pending = {w.id: w for w in snapshot.pending}
    running = {w.id: w for w in snapshot.running}
    for eviction in decisions.evictions:
        report.eviction_codes[eviction.code] = report.eviction_codes.get(eviction.code, 0) + 1
        victim = running.pop(eviction.workload_id, None)
        if victim is None:
            report.problem(f"eviction of workload {eviction.workload_id}, which is not running")
            continue
        pending[victim.id] = replace(
            victim, placement=(), start_time=None, last_checkpoint_time=None, stopping=False
        )
    nodes = {n.name: n for n in snapshot.nodes}
    for bind in decisions.binds:
        workload = pending.pop(bind.workload_id, None)
        if workload is None:
            report.problem(f"bind of workload {bind.workload_id}, which is not pending")
            continue
        if len(bind.pods) != workload.nodes:
            report.problem(f"workload {workload.id}: {len(bind.pods)} placements for {workload.nodes} pods")
        for pod in bind.pods:
            node = nodes.get(pod.node)
            if node is None or not node.schedulable:
                report.problem(
                    f"workload {workload.id} bound to {pod.node}, which is unknown or not schedulable"
                )
        running[workload.id] = replace(workload, placement=bind.pods, start_time=now)
    _check_gpu_use(nodes, running.values(), report)
    owed = {
        e.for_workload
        for e in decisions.evictions
        if e.for_workload is not None and e.for_workload in pending
    }
    for w in pending.values():
        if w.victims_stopped != (w.id in owed):
            pending[w.id] = replace(w, victims_stopped=w.id in owed)
    nominated = {w: decisions.nominated[w] for w in owed if w in decisions.nominated}
    next_snapshot = replace(
        snapshot, pending=tuple(pending.values()), running=tuple(running.values()), nominated=nominated
    )
    return next_snapshot, report


def _check_gpu_use(nodes: dict[str, NodeView], running: Iterable[WorkloadView], report: ApplyReport) -> None:
    use: dict[tuple[str, int], float] = {}
    for node in nodes.values():
        for gpu in node.gpus:
            if gpu.allocated:
                use[(node.name, gpu.index)] = gpu.allocated
    for workload in running:
        for pod in workload.placement:
            for index in pod.gpu_indices:
                key = (pod.node, index)
                use[key] = use.get(key, 0.0) + pod.gpu_fraction
    over = [key for key, value in use.items() if value > 1.0 + 1e-6]
    for node_name, index in over[:5]:
        report.problem(f"GPU {index} on {node_name} over-committed ({use[(node_name, index)]:.2f})")
    report.problem_count += max(0, len(over) - 5)
