"""`Scheduler` remembers its last answer; these cases change only the clock and must change the answer."""

from __future__ import annotations

from pathlib import Path

from gpupool.scheduler import (
    GpuDemand,
    GpuView,
    NodeView,
    PodPlacement,
    QueueView,
    Scheduler,
    Share,
    Snapshot,
    WorkloadView,
    decide,
)
from tests.unit.scheduler.scenario_loader import load_scenario

SCENARIOS = Path(__file__).parent / "scenarios"
NOW = 100_000.0
GB = 10**9


def node(name: str, gpus: int = 2) -> NodeView:
    return NodeView(name, True, tuple(GpuView(i, "H100", 80 * GB) for i in range(gpus)))


def running(
    wid: int, queue: str, started: float, where: str = "n1", gpus: tuple[int, ...] = (0, 1)
) -> WorkloadView:
    return WorkloadView(
        id=wid,
        queue=queue,
        priority=50,
        submit_time=started - 10,
        gpus=GpuDemand(float(len(gpus))),
        placement=(PodPlacement(where, gpus),),
        start_time=started,
    )


def pending(wid: int, queue: str, gpus: float = 2.0, **extra: object) -> WorkloadView:
    return WorkloadView(id=wid, queue=queue, priority=50, submit_time=NOW - 5, gpus=GpuDemand(gpus), **extra)  # type: ignore[arg-type]


def test_a_victim_reaching_its_minimum_runtime_is_reclaimed_on_time() -> None:
    snapshot = Snapshot(
        nodes=(node("n1"),),
        queues=(QueueView("a", gpu=Share(quota=2)), QueueView("b", min_runtime_reclaim=600.0)),
        running=(running(1, "b", started=NOW - 100),),
        pending=(pending(2, "a"),),
    )
    scheduler = Scheduler()
    assert scheduler.decide(snapshot, NOW).evictions == []
    assert scheduler.decide(snapshot, NOW + 499).evictions == []
    assert scheduler.reused == 1  # nothing could change yet
    later = scheduler.decide(snapshot, NOW + 500)
    assert [e.workload_id for e in later.evictions] == [1]
    assert later == decide(snapshot, NOW + 500)
    assert scheduler.cycles == 2


def test_work_started_ahead_of_the_clock_is_not_reclaimed_until_then() -> None:
    # No queue sets a minimum runtime, but the victim's start (written by a clock ahead of the scheduler's)
    # is still to come: it has not run at all yet, and the answer holds only until it has.
    snapshot = Snapshot(
        nodes=(node("n1"),),
        queues=(QueueView("a", gpu=Share(quota=2)), QueueView("b")),
        running=(running(1, "b", started=NOW + 30),),
        pending=(pending(2, "a"),),
    )
    scheduler = Scheduler()
    assert scheduler.decide(snapshot, NOW).evictions == []
    assert scheduler.decide(snapshot, NOW + 29).evictions == []
    assert scheduler.reused == 1
    later = scheduler.decide(snapshot, NOW + 30)
    assert [e.workload_id for e in later.evictions] == [1]
    assert later == decide(snapshot, NOW + 30)


def test_a_closing_backfill_window_is_noticed() -> None:
    # Workload 3 (4 GPUs) waits for workload 1 to end at NOW + 1000 and reserves n1 from then; workload 4
    # (2 GPUs, 600 s) may start beside it now, but not once it would run past the reservation's start.
    snapshot = Snapshot(
        nodes=(node("n1", 4),),
        queues=(QueueView("a", gpu=Share(quota=4)),),
        running=(
            WorkloadView(
                id=1, queue="a", priority=50, submit_time=0.0, gpus=GpuDemand(2.0), preemptible=False,
                placement=(PodPlacement("n1", (0, 1)),), start_time=NOW - 1000, max_duration=2000.0,
            ),
        ),
        pending=(pending(3, "a", gpus=4.0), pending(4, "a", gpus=2.0, max_duration=600.0)),
    )  # fmt: skip
    scheduler = Scheduler()
    for step in (0, 100, 399, 400, 401, 900, 1000, 1001):
        assert scheduler.decide(snapshot, NOW + step) == decide(snapshot, NOW + step), f"at NOW + {step}"
    early = decide(snapshot, NOW)
    late = decide(snapshot, NOW + 401)
    assert {b.workload_id for b in early.binds} == {4}
    assert 4 not in {b.workload_id for b in late.binds}


def test_a_changed_snapshot_is_decided_afresh() -> None:
    nodes = (node("n1"),)
    first = Snapshot(nodes=nodes, pending=(pending(1, "a"),))
    second = Snapshot(nodes=nodes, pending=(pending(1, "a"), pending(2, "a")))
    scheduler = Scheduler()
    scheduler.decide(first, NOW)
    decisions = scheduler.decide(second, NOW + 1)
    assert decisions == decide(second, NOW + 1)
    assert scheduler.cycles == 2 and scheduler.reused == 0


def test_an_equal_snapshot_is_remembered_and_the_answer_is_a_copy() -> None:
    snapshot = Snapshot(nodes=(node("n1"),), pending=(pending(1, "a"), pending(2, "a")))
    scheduler = Scheduler()
    first = scheduler.decide(snapshot, NOW)
    first.binds.clear()
    again = scheduler.decide(
        Snapshot(nodes=(node("n1"),), pending=(pending(1, "a"), pending(2, "a"))), NOW + 5
    )
    assert again == decide(snapshot, NOW + 5)
    assert again.binds and scheduler.reused == 1


def test_a_second_reservation_that_counts_work_bound_this_cycle_is_not_served_from_memory() -> None:
    """The second reservation of the cycle judges n2 by work bound earlier in it (11, whose end counts
    from the clock): the answer holds for this instant only, as `decide` itself says."""
    scenario = load_scenario(
        SCENARIOS / "a_second_backfill_reservation_counts_work_bound_earlier_in_the_cycle.yaml"
    )
    scheduler = Scheduler()
    first = scheduler.decide(scenario.snapshot, scenario.now)
    assert sorted(b.workload_id for b in first.binds) == [11, 12]
    again = scheduler.decide(scenario.snapshot, scenario.now + 1)
    assert scheduler.cycles == 2 and scheduler.reused == 0
    assert again == decide(scenario.snapshot, scenario.now + 1)
