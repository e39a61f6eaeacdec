"""Placement and allocation basics, as a specification (the scenario files cover the policy in depth)."""

from __future__ import annotations

from typing import Any

from gpupool.scheduler import (
    GpuDemand,
    GpuView,
    NodeView,
    PodPlacement,
    QueueView,
    SchedulerConfig,
    Share,
    Snapshot,
    WorkloadView,
    decide,
)

GB = 1_000_000_000


def node(
    name: str = "n1",
    gpus: int = 8,
    model: str = "H100",
    memory: int = 85 * GB,
    *,
    islands: list[int] | None = None,
    schedulable: bool = True,
    state: str = "ready",
) -> NodeView:
    islands = islands or [0] * gpus
    return NodeView(
        name=name,
        schedulable=schedulable,
        state=state,
        gpus=tuple(GpuView(i, model, memory, islands[i]) for i in range(gpus)),
    )


def job(
    wid: int,
    gpus: float = 1,
    *,
    priority: int = 50,
    queue: str = "q",
    models: tuple[str, ...] = (),
    memory: int | None = None,
    nodes: int = 1,
    on: tuple[PodPlacement, ...] = (),
    start: float | None = None,
) -> WorkloadView:
    return WorkloadView(
        wid,
        queue,
        priority,
        float(wid),
        nodes,
        GpuDemand(gpus, models, memory),
        placement=on,
        start_time=start,
    )


def running(
    wid: int, node_name: str, indices: tuple[int, ...], fraction: float = 1.0, **kw: object
) -> WorkloadView:
    gpus = fraction if fraction < 1 else float(len(indices))
    return job(wid, gpus, on=(PodPlacement(node_name, indices, fraction),), start=0.0, **kw)  # type: ignore[arg-type]


def test_whole_gpus_are_bound_lowest_index_first() -> None:
    d = decide(Snapshot((node(),), (job(1, 2), job(2, 3))), now=0)
    assert [(b.workload_id, b.gpu_indices) for b in d.binds] == [(1, (0, 1)), (2, (2, 3, 4))]


def test_higher_priority_goes_first_then_submit_order() -> None:
    d = decide(Snapshot((node(gpus=2),), (job(1, 2, priority=50), job(2, 2, priority=100))), now=0)
    assert [b.workload_id for b in d.binds] == [2]
    assert d.explanations[1].code in ("no-capacity", "over-fair-share")


def test_a_gpu_is_never_given_twice() -> None:
    snapshot = Snapshot(
        (node(gpus=4),), (job(1, 2), job(2, 1)), running=(running(9, "n1", (0,)), running(8, "n1", (2,)))
    )
    d = decide(snapshot, now=0)
    assert d.binds[0].gpu_indices == (1, 3)
    assert 2 in d.explanations


def test_a_multi_gpu_job_prefers_one_nvlink_island() -> None:
    islands = [0, 0, 0, 0, 1, 1, 1, 1]
    snapshot = Snapshot((node(islands=islands),), (job(1, 3),), running=(running(9, "n1", (0, 1)),))
    assert decide(snapshot, now=0).binds[0].gpu_indices == (4, 5, 6)


def test_fractions_share_one_gpu_before_opening_another() -> None:
    snapshot = Snapshot((node(gpus=2),), (job(1, 0.5), job(2, 0.5)), running=(running(9, "n1", (1,), 0.5),))
    d = decide(snapshot, now=0)
    assert [(b.gpu_indices, b.gpu_fraction) for b in d.binds] == [((1,), 0.5), ((0,), 0.5)]


def test_gpu_model_and_memory_constraints_are_honoured() -> None:
    nodes = (node("a100", 4, "A100", 42 * GB), node("h100", 4, "H100", 85 * GB))
    pending = (
        job(1, 1, models=("H100",)),
        job(2, 1, memory=80 * GB),
        job(3, 1, models=("A100-80GB",)),
        job(4, 1, models=("A100", "L4")),
    )
    d = decide(Snapshot(nodes, pending), now=0)
    assert {b.workload_id: b.node for b in d.binds} == {1: "h100", 2: "h100", 4: "a100"}
    assert d.explanations[3].code == "no-matching-gpu"


def mixed(name: str = "mix") -> NodeView:
    """A node of 4 H100s (0-3) and 4 L4s (4-7)."""
    gpus = [GpuView(i, "H100", 85 * GB, 0) for i in range(4)] + [
        GpuView(i, "L4", 24 * GB, 0) for i in range(4, 8)
    ]
    return NodeView(name=name, schedulable=True, state="ready", gpus=tuple(gpus))


def test_a_pods_gpus_are_all_of_one_model_on_a_node_of_several() -> None:
    # 2 H100s and 2 L4s free: 4 GPUs, but no 4 of one model; 2 fit on the model with the fewest free
    busy = (running(8, "mix", (0, 1)), running(9, "mix", (4, 5)))
    d = decide(Snapshot((mixed(),), (job(1, 4),), running=busy), now=0)
    assert not d.binds and d.explanations[1].message.endswith("the largest free block is 2 GPUs on mix")
    d = decide(Snapshot((mixed(),), (job(1, 2), job(2, 2)), running=busy), now=0)
    assert [b.gpu_indices for b in d.binds] == [(2, 3), (6, 7)]
    d = decide(Snapshot((mixed(),), (job(1, 3),), running=(running(9, "mix", (4,)),)), now=0)
    assert d.binds[0].gpu_indices == (5, 6, 7)  # binpack: the 3 L4s left, not 3 of the 4 H100s
    # a fraction or a single GPU is of one model anyway; a demand naming both models still gets one
    d = decide(Snapshot((mixed(),), (job(1, 6, models=("H100", "L4")),)), now=0)
    assert not d.binds
    d = decide(Snapshot((mixed(), mixed("mix2")), (job(1, 4, models=("H100", "L4")), job(2, 4))), now=0)
    assert [b.gpu_indices for b in d.binds] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_fragmentation_counts_a_mixed_nodes_room_per_model() -> None:
    config = SchedulerConfig(placement="fragmentation")
    busy = (running(8, "mix", (0, 1)), running(9, "mix", (4, 5)))
    d = decide(Snapshot((mixed(),), (job(1, 4),), running=busy, config=config), now=0)
    assert not d.binds
    d = decide(Snapshot((mixed(),), (job(1, 2),), running=busy, config=config), now=0)
    assert d.binds[0].gpu_indices in ((2, 3), (6, 7))


def test_cordoned_nodes_take_no_work_and_say_so() -> None:
    d = decide(Snapshot((node(schedulable=False, state="cordoned"),), (job(1),)), now=0)
    assert not d.binds and d.explanations[1].code == "no-capacity"
    assert "n1 cordoned" in d.explanations[1].message


def test_queue_gpu_limit_is_never_exceeded() -> None:
    queues = (QueueView("q", gpu=Share(limit=4)),)
    snapshot = Snapshot((node(),), (job(1, 2), job(2, 1)), queues, running=(running(9, "n1", (0, 1)),))
    d = decide(snapshot, now=0)
    assert [b.workload_id for b in d.binds] == [1]
    assert d.explanations[2].code == "queue-limit"
    assert d.explanations[2].message == "queue q is at its limit (4/4 GPUs)"


def test_work_that_would_pass_a_limit_not_yet_reached_is_told_the_numbers() -> None:
    queues = (QueueView("q", gpu=Share(limit=6)),)
    snapshot = Snapshot((node(),), (job(1, 4),), queues, running=(running(9, "n1", (0, 1, 2, 3)),))
    d = decide(snapshot, now=0)
    assert d.explanations[1].code == "queue-limit"
    assert d.explanations[1].message == "queue q would pass its limit: 4 of 6 GPUs in use, and this needs 4"


def test_work_larger_than_its_queues_limit_is_told_the_limit_must_be_raised() -> None:
    queues = (QueueView("team", gpu=Share(limit=8)), QueueView("nlp", parent="team", gpu=Share()))
    gang = job(1, 5, queue="nlp", nodes=2)  # 10 GPUs: the two nodes have room, the limit has not
    d = decide(Snapshot((node(), node("n2")), (gang,), queues), now=0)
    assert not d.binds and d.explanations[1].code == "queue-limit"
    assert d.explanations[1].message == (
        "needs 10 GPUs, more than queue team's limit of 8: it starts only once an admin raises the limit "
        "(`gpupool queue update team --gpu-limit 10`) or it asks for less"
    )


def test_smaller_jobs_behind_a_blocked_one_start_when_skipping() -> None:
    snapshot = Snapshot(
        (node(gpus=4),), (job(1, 4), job(2, 1)), running=(running(9, "n1", (0,)),),
        config=SchedulerConfig(blocking="skip"),
    )  # fmt: skip
    assert [b.workload_id for b in decide(snapshot, now=0).binds] == [2]


def test_multi_node_gangs_are_placed_all_or_nothing() -> None:
    d = decide(Snapshot((node("a"), node("b")), (job(1, 8, nodes=2), job(2, 8, nodes=2))), now=0)
    assert [(b.workload_id, [p.node for p in b.pods]) for b in d.binds] == [(1, ["a", "b"])]
    assert 2 in d.explanations


def test_zero_gpu_jobs_run_without_gpus() -> None:
    snapshot = Snapshot((node(gpus=1),), (job(1, 0),), running=(running(9, "n1", (0,)),))
    assert decide(snapshot, now=0).binds[0].gpu_indices == ()


def test_decide_is_deterministic() -> None:
    snapshot = Snapshot((node(), node("n2")), tuple(job(i, (i % 3) + 1) for i in range(1, 12)))
    assert decide(snapshot, 0) == decide(snapshot, 0)


def _every_field_set(**overrides: object) -> WorkloadView:
    """A view whose init fields all differ from their defaults but those in `overrides`, checked here: a
    copy that leaves a field out gives it its default, which then tells."""
    import dataclasses

    fields: dict[str, Any] = dict(
        id=7, queue="q", priority=3, submit_time=1.5, nodes=2, gpus=GpuDemand(2, ("H100",), 40 * GB),
        cpus=4.0, memory_bytes=GB, preemptible=False, topology="rack", topology_preferred="zone",
        node_names=frozenset({"n1", "n2"}), max_duration=60.0, attained_service=9.0, duration_estimate=30.0,
        placement=(PodPlacement("n9", (0,), 1.0),), start_time=2.0, last_checkpoint_time=2.5, stopping=True,
        evicted_for=11, victims_stopped=True, spread_group=7,
    )  # fmt: skip
    fields.update(overrides)
    view = WorkloadView(**fields)
    defaults = WorkloadView(id=0, queue="", priority=0, submit_time=0.0)
    for f in dataclasses.fields(WorkloadView):
        if f.init and f.name not in overrides:
            assert getattr(view, f.name) != getattr(defaults, f.name), f.name
    return view


def test_a_started_view_keeps_every_other_field() -> None:
    """`WorkloadView.started` writes its fields out by hand (for speed): a field added to the view and
    left out there would silently fall back to its default for this cycle's binds seen as victims."""
    import dataclasses

    original = _every_field_set()
    pods = (PodPlacement("n1", (1,), 1.0), PodPlacement("n2", (1,), 1.0))
    started = original.started(pods, 5.0)
    assert started == dataclasses.replace(original, placement=pods, start_time=5.0)


def test_a_view_with_its_victims_stopped_keeps_every_other_field() -> None:
    """`with_victims_stopped` writes its fields out by hand too (the simulator gives it, cycle after cycle,
    for each workload whose victims stopped)."""
    import dataclasses

    original = _every_field_set(victims_stopped=False)
    copy = original.with_victims_stopped()
    assert copy.victims_stopped and not original.victims_stopped
    assert copy == dataclasses.replace(original, victims_stopped=True)
    assert copy.key == original.id


def test_a_views_key_is_its_id_and_not_part_of_its_value() -> None:
    """The cycle keys its dicts by `key`: it must be the id of every view, however made."""
    import dataclasses

    view = WorkloadView(id=41, queue="q", priority=0, submit_time=0.0)
    assert view.key == 41
    assert dataclasses.replace(view, id=42).key == 42
    assert view.started((PodPlacement("n1", (0,), 1.0),), 1.0).key == 41
    again = WorkloadView(id=41, queue="q", priority=0, submit_time=0.0)
    assert again == view and hash(again) == hash(view) and "key" not in repr(view)


def test_a_views_gpu_units_are_its_gangs_gpus_however_made() -> None:
    """`gpu_units` is worked out with the view: every way of making one gives the gang's GPUs."""
    import dataclasses

    view = WorkloadView(id=1, queue="q", priority=0, submit_time=0.0, nodes=2, gpus=GpuDemand(0.5))
    assert view.gpu_units == 1.0
    assert dataclasses.replace(view, nodes=3).gpu_units == 1.5
    assert dataclasses.replace(view, gpus=GpuDemand(4)).gpu_units == 8.0
    pods = (PodPlacement("n1", (0,), 0.5), PodPlacement("n2", (0,), 0.5))
    assert view.started(pods, 1.0).gpu_units == view.with_victims_stopped().gpu_units == 1.0
    assert "gpu_units" not in repr(view)


# --- a service's replicas: spread over nodes where they can be -----------------------------------------


def replica(wid: int, group: int = 100, **kw: object) -> WorkloadView:
    from dataclasses import replace

    return replace(job(wid, **kw), spread_group=group)  # type: ignore[arg-type]


def test_replicas_of_one_service_go_to_different_nodes_where_there_is_room() -> None:
    """Binpacking alone would put both on n1; a group's replicas prefer nodes none of them is on, binds of
    the same cycle included."""
    d = decide(Snapshot((node("n1"), node("n2")), (replica(1), replica(2), job(3), job(4))), now=0)
    nodes = {b.workload_id: b.node for b in d.binds}
    assert nodes[1] != nodes[2]
    assert nodes[3] == nodes[4] == "n1", "work of no group still packs"


def test_a_replica_joins_a_node_of_its_group_only_when_nothing_else_fits() -> None:
    nodes = (node("n1"), node("n2"))
    on_n1 = replace_placement(replica(1), "n1", (0,))
    full_n2 = running(9, "n2", tuple(range(8)))  # n2 has no room: the replica shares n1
    d = decide(Snapshot(nodes, (replica(2),), running=(on_n1, full_n2)), now=0)
    assert [(b.workload_id, b.node) for b in d.binds] == [(2, "n1")]
    # with room on n2, it goes there; another service's replica does not count
    d = decide(Snapshot(nodes, (replica(2),), running=(on_n1, running(8, "n2", (0,)))), now=0)
    assert [(b.workload_id, b.node) for b in d.binds] == [(2, "n2")]
    other = replace_placement(replica(1, group=200), "n1", (0, 1))
    d = decide(Snapshot(nodes, (replica(2),), running=(other, running(8, "n2", (0,)))), now=0)
    assert [(b.workload_id, b.node) for b in d.binds] == [(2, "n1")], "binpacks beside another group"


def test_a_stopping_replica_does_not_keep_the_others_off_its_node() -> None:
    from dataclasses import replace

    leaving = replace(replace_placement(replica(1), "n1", (0, 1)), stopping=True)
    d = decide(
        Snapshot((node("n1"), node("n2")), (replica(2),), running=(leaving, running(8, "n2", (0,)))), now=0
    )
    assert [(b.workload_id, b.node) for b in d.binds] == [(2, "n1")]


def replace_placement(w: WorkloadView, node_name: str, indices: tuple[int, ...]) -> WorkloadView:
    return w.started((PodPlacement(node_name, indices, 1.0),), 0.0)
