"""Hypothesis strategies for scheduler snapshots: small random clusters, queues and workloads.

Every generated snapshot is a real state: running work sits on existing GPUs without over-committing them
(foreign use included), running gangs have one pod per distinct node, and running work keeps every queue
(and its ancestors) within its limits. Running ids are 1..99, pending ids 100 and up.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import strategies as st

from gpupool.scheduler.snapshot import (
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
from tests.unit.scheduler.invariants import ancestors, gpu_fits

GB = 1_000_000_000
NOW = 100_000.0
MODELS = {"H100": 80 * GB, "A100": 40 * GB, "L4": 24 * GB}
GPU_COUNTS = (0.25, 0.5, 1.0, 1.0, 2.0, 4.0, 8.0)
GPU_CHOICES: tuple[tuple[tuple[str, ...], int | None], ...] = (
    ((), None),
    ((), None),
    ((), None),
    (("H100",), None),
    (("A100", "H100"), None),
    ((), 80 * GB),
)
LEAF_NAMES = ("a", "b", "c", "d")
PARENT = "p"


@st.composite
def nodes(draw: st.DrawFn, *, max_nodes: int = 6, failures: bool = True) -> tuple[NodeView, ...]:
    """1..max_nodes nodes of 1-8 GPUs, mixed models, two racks; some cordoned (or lost/unhealthy)."""
    states = ["ready"] * 6 + ["cordoned"] + (["lost", "unhealthy"] if failures else [])
    out: list[NodeView] = []
    for i in range(draw(st.integers(1, max_nodes))):
        count = draw(st.integers(1, 8))
        model = draw(st.sampled_from(sorted(MODELS)))
        split = draw(st.booleans()) and count >= 2
        foreign = draw(st.lists(st.sampled_from([0.0, 0.0, 0.0, 0.5, 1.0]), min_size=count, max_size=count))
        state = draw(st.sampled_from(states))
        gpus = tuple(
            GpuView(k, model, MODELS[model], int(split and k >= count // 2), foreign[k]) for k in range(count)
        )
        out.append(
            NodeView(
                name=f"n{i + 1}",
                schedulable=state == "ready",
                gpus=gpus,
                cpus=64.0,
                memory_bytes=1000 * GB,
                state=state,
                labels=(("rack", f"r{i % 2 + 1}"),),
            )
        )
    return tuple(out)


@st.composite
def queue_sets(draw: st.DrawFn) -> tuple[QueueView, ...]:
    """1-4 leaf queues with random quota, limit and weight; sometimes some of them under a parent."""
    count = draw(st.integers(1, 4))
    hierarchical = count >= 2 and draw(st.booleans())
    under_parent = draw(st.integers(1, count)) if hierarchical else 0
    queues: list[QueueView] = []
    if hierarchical:
        queues.append(QueueView(PARENT, gpu=draw(shares()), min_runtime_reclaim=draw(min_runtimes())))
    for i, name in enumerate(LEAF_NAMES[:count]):
        queues.append(
            QueueView(
                name,
                parent=PARENT if i < under_parent else None,
                priority=draw(st.sampled_from([0, 0, 0, 1])),
                gpu=draw(shares()),
                ordering=draw(st.sampled_from([None, None, "fifo", "attained"])),
                min_runtime_preempt=draw(min_runtimes()),
                min_runtime_reclaim=draw(min_runtimes()),
                usage=draw(st.sampled_from([0.0, 1000.0, 50000.0])),
            )
        )
    return tuple(queues)


@st.composite
def shares(draw: st.DrawFn) -> Share:
    quota = draw(st.sampled_from([0.0, 0.0, 1.0, 2.0, 4.0, 8.0]))
    limit = draw(st.sampled_from([None, None, None, 2.0, 4.0, 8.0, 16.0]))
    if limit is not None and limit < quota:
        limit = quota
    return Share(quota=quota, limit=limit, weight=draw(st.sampled_from([1.0, 1.0, 2.0, 3.0])))


def min_runtimes() -> st.SearchStrategy[float | None]:
    return st.sampled_from([None, None, None, 0.0, 600.0, 50_000.0])


@st.composite
def configs(draw: st.DrawFn) -> SchedulerConfig:
    return SchedulerConfig(
        placement=draw(st.sampled_from(["binpack", "spread"])),
        blocking=draw(st.sampled_from(["backfill", "skip", "strict"])),
        usage_weight=draw(st.sampled_from([0.0, 0.0, 1.0])),
        max_consolidation_moves=draw(st.sampled_from([16, 16, 1])),
        max_stopping_gpus=draw(st.sampled_from([None, None, None, 4.0, 12.0])),
    )


@st.composite
def workload_specs(draw: st.DrawFn, wid: int, leaves: tuple[str, ...]) -> WorkloadView:
    """A workload without placement: a gang of 1-3 pods, whole or fractional GPUs, constraints."""
    pods = draw(st.sampled_from([1, 1, 1, 2, 3]))
    count = draw(st.sampled_from(GPU_COUNTS))
    models, min_memory = draw(st.sampled_from(GPU_CHOICES))
    start = draw(st.floats(0, NOW, allow_nan=False).map(round))
    return WorkloadView(
        id=wid,
        queue=draw(st.sampled_from(leaves)),
        priority=draw(st.sampled_from([10, 50, 50, 100])),
        submit_time=float(start),
        nodes=pods,
        gpus=GpuDemand(count, models, min_memory),
        cpus=draw(st.sampled_from([0.0, 0.0, 4.0, 16.0])),
        memory_bytes=draw(st.sampled_from([0, 0, 0, 100 * GB, 400 * GB])),
        preemptible=draw(st.sampled_from([True, True, True, False])),
        topology="rack" if pods > 1 and draw(st.integers(0, 4)) == 0 else None,
        topology_preferred="rack" if pods > 1 and draw(st.integers(0, 4)) == 0 else None,
        max_duration=draw(st.sampled_from([None, None, 600.0, 7200.0])),
        attained_service=draw(st.sampled_from([0.0, 100.0, 10_000.0])),
        start_time=float(start),
    )


@dataclass
class _Room:
    """What is used so far while running work is laid out: GPU fractions, CPUs, queue GPU units."""

    gpu: dict[tuple[str, int], float]
    cpus: dict[str, float]
    queue_gpus: dict[str, float]


def _place(
    w: WorkloadView, cluster: tuple[NodeView, ...], order: list[int], room: _Room
) -> tuple[PodPlacement, ...] | None:
    """First fit, one pod per distinct node, on matching GPUs with room; None if it does not fit."""
    pods: list[PodPlacement] = []
    taken: dict[tuple[str, int], float] = {}
    cpus: dict[str, float] = {}
    for k in order:
        if len(pods) == w.nodes:
            break
        node = cluster[k]
        if room.cpus[node.name] + cpus.get(node.name, 0.0) + w.cpus > node.cpus:
            continue
        fits = [
            g for g in node.gpus if gpu_fits(g.model, g.memory_bytes, w.gpus.models, w.gpus.min_memory_bytes)
        ]
        if w.gpus.count <= 0:
            pods.append(PodPlacement(node.name, (), 1.0))
        elif w.gpus.is_fractional:
            shared = [g for g in fits if room.gpu[(node.name, g.index)] + w.gpus.count <= 1 + 1e-9]
            if not shared:
                continue
            pods.append(PodPlacement(node.name, (shared[0].index,), w.gpus.count))
        else:
            free = [g.index for g in fits if room.gpu[(node.name, g.index)] == 0]
            if len(free) < int(w.gpus.count):
                continue
            pods.append(PodPlacement(node.name, tuple(free[: int(w.gpus.count)]), 1.0))
        cpus[node.name] = cpus.get(node.name, 0.0) + w.cpus
        for index in pods[-1].gpu_indices:
            taken[(node.name, index)] = pods[-1].gpu_fraction
    if len(pods) < w.nodes:
        return None
    for key, fraction in taken.items():
        room.gpu[key] += fraction
    for name, used in cpus.items():
        room.cpus[name] += used
    return tuple(pods)


def _within_limits(w: WorkloadView, queues: dict[str, QueueView], room: _Room) -> bool:
    for name in ancestors(w.queue, queues):
        limit = queues[name].gpu.limit
        if limit is not None and room.queue_gpus.get(name, 0.0) + w.gpu_units > limit + 1e-9:
            return False
    return True


@st.composite
def snapshots(
    draw: st.DrawFn,
    *,
    pending: bool = True,
    stopping: bool = True,
    failures: bool = True,
    max_running: int = 10,
    max_pending: int = 8,
) -> Snapshot:
    """A random, consistent cluster state (see the module docstring)."""
    cluster = draw(nodes(failures=failures))
    queues = draw(queue_sets())
    by_name = {q.name: q for q in queues}
    leaves = tuple(q.name for q in queues if q.name != PARENT)
    room = _Room(
        gpu={(n.name, g.index): g.allocated for n in cluster for g in n.gpus},
        cpus={n.name: n.cpus_allocated for n in cluster},
        queue_gpus={},
    )
    running: list[WorkloadView] = []
    for wid in range(1, draw(st.integers(0, max_running)) + 1):
        spec = draw(workload_specs(wid, leaves))
        if not _within_limits(spec, by_name, room):
            continue
        order = draw(st.permutations(range(len(cluster))))
        placement = _place(spec, cluster, order, room)
        if placement is None:
            continue
        for name in ancestors(spec.queue, by_name):
            room.queue_gpus[name] = room.queue_gpus.get(name, 0.0) + spec.gpu_units
        checkpoint = draw(st.sampled_from([None, NOW - 10.0, NOW - 5000.0]))
        running.append(
            replace(
                spec,
                placement=placement,
                last_checkpoint_time=(
                    checkpoint if checkpoint is not None and checkpoint >= (spec.start_time or 0) else None
                ),
                stopping=stopping and draw(st.integers(0, 9)) == 0,
            )
        )
    waiting: list[WorkloadView] = []
    nominated: dict[int, tuple[PodPlacement, ...]] = {}
    if pending:
        for k in range(draw(st.integers(0, max_pending))):
            spec = draw(workload_specs(100 + k, leaves))
            waiting.append(replace(spec, start_time=None))
        # In one snapshot in four, work evicted for one or two pending workloads has stopped since the last
        # cycle (its GPUs are free now): they are given as `victims_stopped`.
        if waiting and draw(st.integers(0, 3)) == 0:
            owed = draw(st.sets(st.sampled_from([w.id for w in waiting]), min_size=1, max_size=2))
            waiting = [replace(w, victims_stopped=True) if w.id in owed else w for w in waiting]
            # Each may carry the room an earlier cycle nominated: any node's GPUs, free now or not, and
            # now and then one the node lacks (the scheduler must check, not trust it).
            for w in waiting:
                if w.id in owed and draw(st.booleans()):
                    nominated[w.id] = draw(_rooms(w, cluster))
    # Stopping work may say which pending workload its eviction was for (none: cancelled, or its gainer
    # has started or gone since).
    gainers = [None, *(w.id for w in waiting)]
    running = [
        replace(w, evicted_for=draw(st.sampled_from(gainers))) if w.stopping and len(gainers) > 1 else w
        for w in running
    ]
    return Snapshot(
        nodes=cluster,
        pending=tuple(waiting),
        queues=queues,
        running=tuple(running),
        config=draw(configs()),
        nominated=nominated,
    )


@st.composite
def _rooms(draw: st.DrawFn, w: WorkloadView, cluster: tuple[NodeView, ...]) -> tuple[PodPlacement, ...]:
    """A room for each pod of `w`: a node of `cluster` and GPU indices of it (or one past its last)."""
    pods = []
    for _ in range(w.nodes):
        node = draw(st.sampled_from(cluster))
        indices = [g.index for g in node.gpus] + [len(node.gpus)]
        count = min(1 if w.gpus.is_fractional else int(w.gpus.count), len(indices))  # too few: refused
        chosen = draw(st.lists(st.sampled_from(indices), min_size=count, max_size=count, unique=True))
        fraction = w.gpus.count if w.gpus.is_fractional else 1.0
        pods.append(PodPlacement(node.name, tuple(sorted(chosen)), fraction))
    return tuple(pods)


@dataclass(frozen=True)
class ReclaimCase:
    """A hungry queue with quota `quota` and exactly that many 1-GPU pending workloads; every GPU that is
    not free runs 1-GPU work of `others` other queues, which have no quota (except possibly the single other
    queue, whose non-preemptible work stays within its quota)."""

    snapshot: Snapshot
    hungry: str
    quota: int
    others: int
    free: int


@st.composite
def reclaim_cases(draw: st.DrawFn) -> ReclaimCase:
    count = draw(st.integers(1, 4))
    sizes = [draw(st.integers(1, 8)) for _ in range(count)]
    cluster = tuple(
        NodeView(f"n{i + 1}", True, tuple(GpuView(k, "H100", 80 * GB) for k in range(size)), 64.0, 1000 * GB)
        for i, size in enumerate(sizes)
    )
    capacity = sum(sizes)
    quota = draw(st.integers(1, capacity))
    others = draw(st.integers(1, 3))
    other_names = [f"o{k + 1}" for k in range(others)]
    other_quota = draw(st.integers(0, capacity - quota)) if others == 1 else 0
    queues = (
        QueueView("hungry", gpu=Share(quota=float(quota))),
        *(
            QueueView(
                name, gpu=Share(quota=float(other_quota), weight=draw(st.sampled_from([1.0, 2.0, 3.0])))
            )
            for name in other_names
        ),
    )
    running: list[WorkloadView] = []
    non_preemptible = 0
    free = 0
    for node in cluster:
        for gpu in node.gpus:
            if draw(st.integers(0, 5)) == 0:
                free += 1
                continue
            preemptible = True
            if non_preemptible < other_quota and draw(st.booleans()):
                preemptible = False
                non_preemptible += 1
            wid = len(running) + 1
            start = float(draw(st.integers(0, int(NOW) - 1)))
            running.append(
                WorkloadView(
                    id=wid,
                    queue=draw(st.sampled_from(other_names)),
                    priority=draw(st.sampled_from([10, 50])),
                    submit_time=start,
                    gpus=GpuDemand(1.0),
                    preemptible=preemptible,
                    placement=(PodPlacement(node.name, (gpu.index,)),),
                    start_time=start,
                )
            )
    pending = tuple(
        WorkloadView(
            id=100 + k, queue="hungry", priority=50, submit_time=NOW - quota + k, gpus=GpuDemand(1.0)
        )
        for k in range(quota)
    )
    config = SchedulerConfig(blocking=draw(st.sampled_from(["backfill", "skip"])))
    snapshot = Snapshot(nodes=cluster, pending=pending, queues=queues, running=tuple(running), config=config)
    return ReclaimCase(snapshot, "hungry", quota, others, free)
