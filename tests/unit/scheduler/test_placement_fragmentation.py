"""The `fragmentation` placement: each pod goes where it costs the least usable capacity for the pod
shapes the workload is made of (the snapshot's pending and running pods)."""

from __future__ import annotations

import pytest

from gpupool.scheduler import (
    GpuDemand,
    GpuView,
    NodeView,
    PodPlacement,
    SchedulerConfig,
    Snapshot,
    WorkloadView,
    decide,
)
from gpupool.scheduler.prepare import ConfigError

GB = 1_000_000_000
GIB = 1 << 30


def node(
    name: str, gpus: int, cpus: float = 0.0, *, model: str = "T4", used: tuple[float, ...] = ()
) -> NodeView:
    """`used`: what foreign work already takes of each GPU (0..1)."""
    views = tuple(
        GpuView(i, model, 16 * GB, allocated=used[i] if i < len(used) else 0.0) for i in range(gpus)
    )
    return NodeView(name, True, views, cpus=cpus, memory_bytes=512 * GIB)


def pod(
    wid: int,
    gpus: float,
    cpus: float = 0.0,
    *,
    submit: float | None = None,
    models: tuple[str, ...] = (),
    on: tuple[PodPlacement, ...] = (),
) -> WorkloadView:
    return WorkloadView(
        wid,
        "q",
        0,
        float(wid) if submit is None else submit,
        gpus=GpuDemand(gpus, models),
        cpus=cpus,
        memory_bytes=GIB,
        placement=on,
        start_time=0.0 if on else None,
    )


def place(
    nodes: tuple[NodeView, ...],
    first: WorkloadView,
    mix: list[WorkloadView],
    placement: str = "fragmentation",
    running: tuple[WorkloadView, ...] = (),
) -> tuple[PodPlacement, ...] | None:
    """Where `first` goes, with `mix` pending after it (the mix is what the workload looks like)."""
    config = SchedulerConfig(actions=("allocate",), placement=placement, fair_share=False)
    d = decide(Snapshot(nodes, (first, *mix), running=running, config=config), now=0.0)
    for b in d.binds:
        if b.workload_id == first.id:
            return b.pods
    return None


def light_mix(n: int = 40) -> list[WorkloadView]:
    """Pods of one GPU and 2 CPUs, pending after the pod under test: what the workload looks like."""
    return [
        WorkloadView(100 + i, "q", 0, 100.0 + i, nodes=1, gpus=GpuDemand(1), cpus=2.0, memory_bytes=GIB)
        for i in range(n)
    ]


def test_a_cpu_heavy_pod_goes_where_it_leaves_the_cpus_other_gpu_pods_need() -> None:
    # Same free GPUs; "poor" has 8 CPUs, "rich" 64. Binpack takes the first in its order (poor), where 6
    # CPUs strand 2 of the 3 GPUs left for the workload's 2-CPU pods; fragmentation takes rich.
    nodes = (node("poor", 4, 8.0), node("rich", 4, 64.0))
    heavy = pod(1, 1, 6.0)
    assert place(nodes, heavy, light_mix(), "binpack")[0].node == "poor"  # type: ignore[index]
    assert place(nodes, heavy, light_mix())[0].node == "rich"  # type: ignore[index]


def test_a_fraction_goes_on_the_gpu_that_leaves_room_for_the_workloads_fractions() -> None:
    # GPU 0 has 0.6 free, GPU 1 0.7. Binpack's tightest fit (GPU 0) leaves 0.4 and 0.7: one more 0.5 pod;
    # 0.2 on GPU 1 leaves 0.6 and 0.5: two.
    nodes = (node("n", 2, used=(0.4, 0.3)),)
    halves = [pod(100 + i, 0.5, submit=100.0 + i) for i in range(20)]
    small = pod(1, 0.2)
    assert place(nodes, small, [], "binpack") == (PodPlacement("n", (0,), 0.2),)
    placed = place(nodes, small, halves)
    assert placed == (PodPlacement("n", (1,), 0.2),)


def test_a_one_gpu_pod_keeps_a_whole_node_free_for_the_workloads_eight_gpu_pods() -> None:
    nodes = (node("empty", 8, model="H100"), node("busy", 8, model="H100", used=(1, 1, 1, 1)))
    eights = [pod(100 + i, 8, submit=100.0 + i) for i in range(3)]
    assert place(nodes, pod(1, 1), eights)[0].node == "busy"  # type: ignore[index]
    # Spread would break the empty node.
    assert place(nodes, pod(1, 1), eights, "spread")[0].node == "empty"  # type: ignore[index]


def test_a_cpu_only_pod_goes_where_it_costs_no_gpu_pod_its_cpus() -> None:
    nodes = (node("gpu", 4, 16.0), NodeView("cpu-only", True, (), cpus=32.0, memory_bytes=512 * GIB))
    cpu_pod = pod(1, 0, 12.0)
    placed = place(nodes, cpu_pod, light_mix())
    assert placed is not None and placed[0].node == "cpu-only"


def test_running_work_counts_in_the_shapes_weighed() -> None:
    # Nothing else is pending. Alone, the 1-GPU pod's own shape costs the same on both nodes and the best
    # fit (fewest GPUs and CPUs left) is "empty"; the running 8-GPU job tells the placement that 8-GPU
    # pods are part of the workload, and "empty" is kept whole.
    nodes = (
        node("empty", 8, 16.0, model="H100"),
        node("busy", 8, 128.0, model="H100", used=(1, 1, 1, 1)),
        node("full", 8, 128.0, model="H100"),
    )
    big = pod(50, 8, on=(PodPlacement("full", tuple(range(8)), 1.0),))
    assert place(nodes, pod(1, 1), [])[0].node == "empty"  # type: ignore[index]
    assert place(nodes, pod(1, 1), [], running=(big,))[0].node == "busy"  # type: ignore[index]


def test_model_constraints_and_cpus_still_decide_where_a_pod_may_go() -> None:
    nodes = (node("t4", 4, 64.0), node("v100", 4, 4.0, model="V100"))
    # Only the V100 node is acceptable; it lacks the CPUs: nothing is placed.
    assert place(nodes, pod(1, 1, 8.0, models=("V100",)), light_mix()) is None
    assert place(nodes, pod(1, 1, 2.0, models=("V100",)), light_mix())[0].node == "v100"  # type: ignore[index]


def test_a_gang_gets_one_pod_per_node_under_fragmentation() -> None:
    nodes = tuple(node(f"n{i}", 4, 32.0) for i in range(3))
    gang = WorkloadView(1, "q", 0, 1.0, nodes=2, gpus=GpuDemand(4), cpus=4.0, memory_bytes=GIB)
    config = SchedulerConfig(actions=("allocate",), placement="fragmentation", fair_share=False)
    d = decide(Snapshot(nodes, (gang,), config=config), now=0.0)
    assert len(d.binds) == 1
    assert len({p.node for p in d.binds[0].pods}) == 2


def test_an_unknown_placement_names_the_three() -> None:
    config = SchedulerConfig(placement="tetris")
    with pytest.raises(ConfigError, match="one of binpack, spread, fragmentation"):
        decide(Snapshot((node("n", 1),), (pod(1, 1),), config=config), now=0.0)


def test_gpus_of_one_model_but_two_memory_sizes_are_told_apart() -> None:
    # GPU 0 has 40 GB, GPU 1 80 GB: a fraction that needs 80 GB can only go on GPU 1, and the 80-GB
    # shape's room is counted on GPU 1 alone.
    views = (GpuView(0, "A100", 40 * GB), GpuView(1, "A100", 80 * GB))
    nodes = (NodeView("n", True, views, cpus=64.0, memory_bytes=512 * GIB),)
    big = WorkloadView(1, "q", 0, 1.0, gpus=GpuDemand(0.5, (), 80 * GB), cpus=1.0, memory_bytes=GIB)
    mix = [
        WorkloadView(100 + i, "q", 0, 100.0 + i, gpus=GpuDemand(0.5, (), 80 * GB), cpus=1.0, memory_bytes=GIB)
        for i in range(4)
    ]
    assert place(nodes, big, mix) == (PodPlacement("n", (1,), 0.5),)
