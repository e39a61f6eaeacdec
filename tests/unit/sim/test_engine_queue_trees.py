"""The engine's skipped cycles with a tree of queues (parents, a tenant no queue names), fractional jobs
and free GPUs scattered across nodes: the figures do not depend on the cycles it skips, and the scheduler
sees the weights the server would give it."""

from __future__ import annotations

import pytest

from gpupool.scheduler import Decisions, QueueView, Share, Snapshot, decide
from gpupool.sim import engine
from gpupool.sim.cluster import load_cluster
from gpupool.sim.engine import Simulation
from gpupool.sim.policies import BY_NAME, POLICIES
from gpupool.sim.results import SimOptions
from gpupool.sim.trace import TraceJob
from gpupool.spec.scheduling import weighted_by_young

QUEUES = (
    QueueView("research", gpu=Share(quota=16.0, weight=1.5)),
    QueueView("product", gpu=Share(quota=12.0, weight=0.7)),
    QueueView("nlp", parent="research", gpu=Share(quota=8.0, weight=2.0)),
    QueueView("vision", parent="research", gpu=Share(quota=6.0, limit=20.0)),
    QueueView("search", parent="product", gpu=Share(quota=10.0, weight=0.3)),
)
TENANTS = ("nlp", "vision", "search", "other")  # "other" has no queue of its own


def jobs() -> list[TraceJob]:
    sizes = [0.5, 1, 1, 2, 4, 8, 16, 0.25]
    return [
        TraceJob(i, float(i * 53 % 1920), float(30 + (i * 7919) % 9000), sizes[i % 8], TENANTS[i % 4])
        for i in range(120)
    ]


Outcome = tuple[int, float | None, float | None, int]


def _both_ways(
    jobs: list[TraceJob],
    cluster: str,
    queues: tuple[QueueView, ...],
    policy: str,
    options: SimOptions | None = None,
) -> tuple[list[Outcome], int, int]:
    """Replay with the engine's shortcuts on and off; each job's (id, start, finish, preemptions), which
    must not depend on them, and the cycles skipped each way."""
    runs = []
    for shortcuts in (True, False):
        sim = Simulation(jobs, 0.0, load_cluster(cluster), queues, BY_NAME[policy], options or SimOptions())
        sim.shortcuts = shortcuts
        runs.append(([(j.id, j.start, j.finish, j.preemptions) for j in sim.run().jobs], sim.skipped))
    assert runs[0][0] == runs[1][0]
    return runs[0][0], runs[0][1], runs[1][1]


@pytest.mark.parametrize("policy", [p.name for p in POLICIES])
def test_skipped_cycles_leave_every_figure_as_it_was_with_a_tree_of_queues(policy: str) -> None:
    runs = []
    for shortcuts in (True, False):
        sim = Simulation(jobs(), 0.0, load_cluster("4x8"), QUEUES, BY_NAME[policy], SimOptions())
        sim.shortcuts = shortcuts
        result = sim.run()
        records = [(j.id, j.start, j.finish, j.preemptions, j.queued, j.lost_gpu_s) for j in result.jobs]
        runs.append((records, sim.skipped))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] > 0 == runs[1][1]


def test_the_scheduler_sees_each_queue_weighted_by_its_young_work_as_the_server_weighs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = Simulation(jobs(), 0.0, load_cluster("4x8"), QUEUES, BY_NAME["gpupool"], SimOptions())
    checked = 0

    def checked_decide(snapshot: Snapshot, now: float) -> Decisions:
        # The engine may run compiled (no subclass can override its methods): check what `decide` is given.
        nonlocal checked
        if sim.counts:
            assert snapshot.queues == weighted_by_young(sim.queues, sim.counts)
            checked += 1
        return decide(snapshot, now)

    monkeypatch.setattr(engine, "decide", checked_decide)
    sim.run()
    assert checked > 100


@pytest.mark.parametrize("policy", ["fifo", "fifo-backfill", "las"])
def test_a_job_with_enough_free_gpus_only_across_nodes_waits_through_skipped_cycles(policy: str) -> None:
    # Two 4-GPU jobs finish on each node at 100 s: 8 GPUs are free, 4 on each node, until 5,000 s.
    jobs = [TraceJob(i, 0.0, [5000.0, 100.0][i % 2], 4, "a") for i in range(4)]
    jobs += [TraceJob(4 + i, 200.0 + 100 * i, 100.0, 8, "a") for i in range(6)]  # a whole node each
    records, skipped, unskipped = _both_ways(jobs, "2x8", (QueueView("a", gpu=Share(quota=16.0)),), policy)
    assert skipped > 0 == unskipped
    if policy != "las":  # las preempts the long jobs once they pass its first band
        assert records[4][:3] == (4, 5000.0, 5100.0)


def test_a_queue_below_its_share_waits_through_skipped_cycles_while_only_a_gang_holds_the_surplus() -> None:
    # b's 16-GPU gang holds 12 GPUs above b's fair share, but reclaim never takes gangs: a's jobs wait
    # for it to finish, and the cycles at their arrivals are skipped (reclaim could place nothing).
    jobs = [
        TraceJob(0, 0.0, 5000.0, 16, "b"),
        TraceJob(1, 100.0, 100.0, 4, "a"),
        TraceJob(2, 200.0, 50.0, 2, "a"),
    ]
    records, skipped, unskipped = _both_ways(jobs, "2x8", (), "drf")
    assert records == [(0, 0.0, 5000.0, 0), (1, 5000.0, 5100.0, 0), (2, 5000.0, 5050.0, 0)]
    assert skipped == 2 and unskipped == 0


def test_cycles_are_skipped_while_reclaim_could_only_take_a_victim_queue_below_its_share() -> None:
    # b holds 12 GPUs, 2 above its fair share of 10 once a asks for 6; a's 6-GPU job would fit node 1 only
    # by evicting b's 4-GPU job, which would leave b below its share: reclaim may not, so the cycle at its
    # arrival is skipped. When a asks for more, b's share falls to 8 and the same eviction is allowed.
    jobs = [
        TraceJob(0, 0.0, 5000.0, 8, "b"),
        TraceJob(1, 0.0, 5000.0, 4, "b"),
        TraceJob(2, 100.0, 1000.0, 6, "a"),
        TraceJob(3, 200.0, 1000.0, 8, "a"),
    ]
    records, skipped, unskipped = _both_ways(jobs, "2x8", (), "drf", SimOptions(checkpoint_interval=0.0))
    assert records[1][3] == 1 and records[2][1] == 200.0  # reclaimed for a once its share allows
    assert skipped == 1 and unskipped == 0


def test_cycles_are_skipped_while_backfill_keeps_later_jobs_off_the_nodes_the_blocked_head_reserves() -> None:
    # Node 0 has 4 GPUs free, node 1 has 2. The 8-GPU head of the line cannot start and reserves node 0
    # (no node has 8 free; node 0 comes first by name), so the 4- and 3-GPU jobs behind it, which fit
    # node 0 only, wait: the cycles at their arrivals (and at the 2-GPU job's finish) are skipped. The
    # 2-GPU job fits node 1, outside the reservation, and starts at once.
    jobs = [
        TraceJob(0, 0.0, 5000.0, 4, "a"),
        TraceJob(1, 0.0, 5000.0, 6, "a"),
        TraceJob(2, 100.0, 1000.0, 8, "a"),
        TraceJob(3, 200.0, 1000.0, 4, "a"),
        TraceJob(4, 300.0, 1000.0, 3, "a"),
        TraceJob(5, 400.0, 1000.0, 2, "a"),
    ]
    queues = (QueueView("a", gpu=Share(quota=16.0)),)
    records, skipped, unskipped = _both_ways(jobs, "2x8", queues, "fifo-backfill")
    assert [start for _, start, _, _ in records] == [0.0, 0.0, 5000.0, 5000.0, 5000.0, 400.0]
    assert skipped == 4 and unskipped == 0


def test_a_gang_waits_through_skipped_cycles_while_reclaim_could_take_too_few_gpus_in_all() -> None:
    # b's one-GPU jobs leave 2, 2, 1 and 1 GPUs free on the four nodes. a's 2 x 8 gang is within a's fair
    # share of 16, and each node would have room for a pod once b's jobs there go; but b is only 10 GPUs
    # above its share, and the two best nodes lack 12: reclaim can take nothing, and the cycle at the
    # gang's arrival is skipped.
    ending = {0, 1, 8, 9, 16, 24}  # two on nodes 0 and 1, one on nodes 2 and 3
    jobs = [TraceJob(i, 0.0, 100.0 if i in ending else 5000.0, 1, "b") for i in range(32)]
    jobs.append(TraceJob(32, 200.0, 1000.0, 16, "a"))
    records, skipped, unskipped = _both_ways(jobs, "4x8", (), "drf")
    assert records[32] == (32, 5000.0, 6000.0, 0)
    assert skipped == 1 and unskipped == 0
