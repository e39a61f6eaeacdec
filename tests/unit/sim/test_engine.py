"""The engine: what a user of `sim run` would notice in the figures."""

from __future__ import annotations

import dataclasses
import random

import pytest

from gpupool.scheduler import GpuDemand, PodPlacement, QueueView, Share, WorkloadView
from gpupool.sim import engine
from gpupool.sim.cluster import Cluster, load_cluster
from gpupool.sim.engine import Simulation, shape
from gpupool.sim.errors import SimError
from gpupool.sim.metrics import jain, percentile, summarize
from gpupool.sim.policies import BY_NAME, POLICIES, resolve_policies
from gpupool.sim.queues import auto_queues
from gpupool.sim.results import SimOptions, SimResult
from gpupool.sim.trace import TraceJob

NO_OVERHEAD = SimOptions(restart_overhead=0.0, checkpoint_interval=0.0)


def simulate(jobs: list[TraceJob], cluster: str, policy: str, queues: tuple[QueueView, ...] | None = None,
             options: SimOptions = NO_OVERHEAD) -> SimResult:  # fmt: skip
    built = load_cluster(cluster)
    return Simulation(
        jobs, 0.0, built, queues or auto_queues(jobs, built.gpus), BY_NAME[policy], options
    ).run()


def by_id(result: SimResult) -> dict[int, tuple[float | None, float | None]]:
    return {j.id: (j.start, j.finish) for j in result.jobs}


def test_a_lone_job_finishes_after_its_duration() -> None:
    result = simulate([TraceJob(0, 10.0, 500.0, 4, "a")], "1x8", "fifo")
    assert by_id(result) == {0: (10.0, 510.0)}
    assert summarize(result)["avg_jct_s"] == 500.0


def test_fifo_makes_the_second_job_wait_for_the_first() -> None:
    jobs = [TraceJob(0, 0.0, 1000.0, 8, "a"), TraceJob(1, 5.0, 100.0, 8, "a")]
    result = simulate(jobs, "1x8", "fifo")
    assert by_id(result) == {0: (0.0, 1000.0), 1: (1000.0, 1100.0)}
    assert summarize(result)["avg_queue_s"] == pytest.approx(995.0 / 2)


def test_strict_fifo_blocks_small_jobs_behind_a_big_one_that_skip_policies_let_pass() -> None:
    jobs = [
        TraceJob(0, 0.0, 1000.0, 6, "a"),
        TraceJob(1, 1.0, 100.0, 4, "a"),
        TraceJob(2, 2.0, 100.0, 2, "a"),
    ]
    strict = by_id(simulate(jobs, "1x8", "fifo"))
    assert strict[1] == (1000.0, 1100.0) and strict[2] == (1000.0, 1100.0)  # 2 free GPUs stay idle
    passing = by_id(simulate(jobs, "1x8", "sjf-oracle"))
    assert passing[2][0] == 2.0


def test_las_preempts_a_long_job_for_a_new_one_and_the_restart_costs_time() -> None:
    jobs = [TraceJob(0, 0.0, 20_000.0, 8, "a"), TraceJob(1, 10_000.0, 100.0, 8, "a")]
    options = SimOptions(restart_overhead=60.0, checkpoint_interval=1800.0)
    result = simulate(jobs, "1x8", "las", options=options)
    runs = by_id(result)
    assert runs[1] == (10_000.0, 10_100.0)  # the newcomer (least attained service) runs at once
    # The long job lost the work since its last checkpoint (10,000 s = 5 x 1,800 + 1,000) and pays 60 s.
    assert runs[0][1] == pytest.approx(10_100.0 + 60.0 + 20_000.0 - 9_000.0)
    metrics = summarize(result)
    assert metrics["preemptions"] == 1
    # lost: the 1,000 s since that checkpoint and the 60 s restart, on 8 GPUs
    assert metrics["lost_gpu_h"] == pytest.approx(8 * (1_000.0 + 60.0) / 3600.0)


def test_work_that_all_arrives_at_once_is_measured_to_its_last_finish_by_every_policy() -> None:
    """With no arrival window to measure over, utilization and quota shortfall are taken over the run, to
    its last finish (not to the last event, such as a band threshold no job reached any more)."""
    jobs = [TraceJob(0, 0.0, 100.0, 4, "a"), TraceJob(1, 0.0, 50.0, 2, "b")]
    figures = {p: summarize(simulate(jobs, "1x4", p)) for p in ("fifo", "las", "gpupool")}
    for f in figures.values():
        assert f["makespan_s"] == 150.0
        assert f["gpu_util"] == pytest.approx((4 * 100 + 2 * 50) / (4 * 150))
    assert len({f["quota_violation"] for f in figures.values()}) == 1


def test_the_timeline_records_what_finishes_change_while_nothing_waits() -> None:
    """Samples are taken at cycles; a finish with nothing pending needs none, and the state it leaves is
    recorded before the lull it begins (the utilization plot steps down there, not hours later)."""
    jobs = [
        TraceJob(0, 0.0, 3_600.0, 4, "a"),
        TraceJob(1, 0.0, 36_000.0, 4, "a"),
        TraceJob(2, 72_000.0, 60.0, 8, "a"),
    ]
    timeline = simulate(jobs, "1x8", "fifo").timeline
    used_at = {s.t: s.used_gpus for s in timeline}
    assert used_at[3_600.0] == 4 and used_at[36_000.0] == 0
    assert timeline[-1].used_gpus == 0 and [s.t for s in timeline] == sorted({s.t for s in timeline})


def test_las_preempts_the_job_that_loses_least_since_its_last_checkpoint() -> None:
    # Two long 4-GPU jobs, started 1,000 s apart, checkpoint every 1,800 s. At 5,300 s the first has saved
    # at 3,600 s (1,700 s to lose) and the second at 4,600 s (700 s to lose): the newcomer takes the
    # second one's GPUs. At 5,500 s it would be the first (saved at 5,400 s). The views the scheduler sees
    # must follow each job's checkpoints as they pass.
    jobs = [
        TraceJob(0, 0.0, 50_000.0, 4, "a"),
        TraceJob(1, 1_000.0, 50_000.0, 4, "a"),
        TraceJob(2, 5_300.0, 100.0, 4, "a"),
    ]
    options = SimOptions(restart_overhead=0.0, checkpoint_interval=1800.0)
    result = simulate(jobs, "1x8", "las", options=options)
    assert {j.id: j.preemptions for j in result.jobs} == {0: 0, 1: 1, 2: 0}
    assert summarize(result)["lost_gpu_h"] == pytest.approx(4 * 700.0 / 3600.0)
    jobs[2] = TraceJob(2, 5_500.0, 100.0, 4, "a")
    result = simulate(jobs, "1x8", "las", options=options)
    assert {j.id: j.preemptions for j in result.jobs} == {0: 1, 1: 0, 2: 0}
    assert summarize(result)["lost_gpu_h"] == pytest.approx(4 * 100.0 / 3600.0)


def test_fifo_never_preempts() -> None:
    jobs = [TraceJob(0, 0.0, 20_000.0, 8, "a"), TraceJob(1, 10_000.0, 100.0, 8, "a")]
    assert summarize(simulate(jobs, "1x8", "fifo"))["preemptions"] == 0


def test_a_job_larger_than_the_cluster_is_dropped_and_counted() -> None:
    jobs = [TraceJob(0, 0.0, 100.0, 64, "a"), TraceJob(1, 0.0, 100.0, 8, "a")]
    result = simulate(jobs, "2x8", "fifo")
    assert result.dropped == [0]
    metrics = summarize(result)
    assert metrics["dropped"] == 1 and metrics["finished"] == 1


def test_a_job_that_asks_more_cpus_or_memory_than_any_node_has_is_dropped_and_counted() -> None:
    """It could never start, so it is dropped as a job too big for the GPUs is (it was neither dropped nor
    finished, and every figure left it out without a word)."""
    nodes = tuple(dataclasses.replace(n, cpus=32.0, memory_bytes=2**38) for n in load_cluster("2x8").nodes)
    built = Cluster(nodes, "2x8")
    jobs = [
        TraceJob(0, 0.0, 100.0, 8, "a", cpus=64.0),
        TraceJob(1, 0.0, 100.0, 8, "a", memory_bytes=2**39),
        TraceJob(2, 0.0, 100.0, 8, "a", cpus=32.0, memory_bytes=2**38),
    ]
    result = Simulation(
        jobs, 0.0, built, auto_queues(jobs, built.gpus), BY_NAME["gpupool"], NO_OVERHEAD
    ).run()
    assert result.dropped == [0, 1]
    assert (summarize(result)["finished"], result.unfinished) == (1, 0)


def test_a_job_that_is_not_preemptible_is_never_evicted() -> None:
    """`sim whatif` replays live jobs with their spec's `preemptible`: the newcomer waits, as it would."""
    queues = (QueueView("a", gpu=Share(quota=8.0)),)  # non-preemptible work runs only within a quota
    jobs = [TraceJob(0, 0.0, 20_000.0, 8, "a"), TraceJob(1, 10_000.0, 100.0, 8, "a")]
    assert by_id(simulate(jobs, "1x8", "gpupool", queues))[1] == (10_000.0, 10_100.0)  # the newcomer's band
    jobs[0] = dataclasses.replace(jobs[0], preemptible=False)
    result = simulate(jobs, "1x8", "gpupool", queues)
    assert by_id(result) == {0: (0.0, 20_000.0), 1: (20_000.0, 20_100.0)}
    assert summarize(result)["preemptions"] == 0


def test_with_nothing_pending_each_queue_s_fair_share_is_what_it_holds() -> None:
    """No cycle runs while nothing waits, yet the fair-share plot must not keep the last cycle's figures:
    `b`'s jobs end at 100 s, and from then on its fair share is 0, not the 4 GPUs it had."""
    queues = (QueueView("a", gpu=Share(quota=4.0)), QueueView("b", gpu=Share(quota=4.0)))
    jobs = [TraceJob(i, 0.0, 10_000.0, 1, "a") for i in range(4)]
    jobs += [TraceJob(4 + i, 0.0, 100.0, 1, "b") for i in range(4)]
    timeline = simulate(jobs, "1x8", "gpupool", queues).timeline
    idle = [s for s in timeline if not s.pending and s.fair_share]
    assert idle and all(s.fair_share == s.allocated for s in idle), idle
    assert any(s.t >= 100.0 and s.fair_share == {"a": 4.0, "b": 0.0} for s in timeline), timeline


def test_a_job_bigger_than_a_node_runs_as_a_gang_of_whole_nodes() -> None:
    assert shape(16, 8) == (2, 8.0)
    assert shape(12, 8) == (2, 6.0)
    assert shape(0.5, 8) == (1, 0.5)
    result = simulate([TraceJob(0, 0.0, 100.0, 16, "a")], "2x8", "fifo")
    assert by_id(result) == {0: (0.0, 100.0)}


def test_gpupool_reclaims_borrowed_gpus_for_a_queue_below_its_quota() -> None:
    queues = (QueueView("a", gpu=Share(quota=4.0)), QueueView("b", gpu=Share(quota=4.0)))
    jobs = [TraceJob(i, 0.0, 10_000.0, 1, "a") for i in range(8)]
    jobs += [TraceJob(8 + i, 1000.0, 100.0, 1, "b") for i in range(4)]
    jobs.append(TraceJob(12, 5000.0, 10.0, 1, "a"))  # arrivals (the measured window) go on to 5,000 s
    gp = simulate(jobs, "1x8", "gpupool", queues)
    fifo = simulate(jobs, "1x8", "fifo", queues)
    assert all(start == 1000.0 for start, _ in (by_id(gp)[i] for i in range(8, 12)))
    # 4 reclaimed for b; then the short job of a, in the top attained-service band, preempts one of a's own
    # long jobs and starts at once
    assert by_id(gp)[12] == (5000.0, 5010.0)
    assert summarize(gp)["preemptions"] == 5
    assert summarize(gp)["quota_violation"] < 1e-9 < summarize(fifo)["quota_violation"]


def test_gpupool_lends_the_gpus_above_the_quotas_to_the_queue_with_new_work() -> None:
    queues = (QueueView("a", gpu=Share(quota=2.0)), QueueView("b", gpu=Share(quota=2.0)))
    jobs = [TraceJob(i, 0.0, 10_000.0, 1, "a") for i in range(8)]  # a borrows 6 GPUs above its quota
    jobs += [TraceJob(8 + i, 4000.0, 100.0, 1, "b") for i in range(6)]  # then b's 6 new short jobs arrive
    young = by_id(simulate(jobs, "1x8", "gpupool", queues))
    fixed = by_id(simulate(jobs, "1x8", "gpupool-bands", queues))
    # Weights by young work: a has none (its jobs have had more than a GPU-hour each), so the 4 GPUs above
    # the quotas are b's fair share and all its jobs start at once; equal weights split them 2 + 2.
    assert sorted(young[i][0] or 0.0 for i in range(8, 14)) == [4000.0] * 6
    assert sorted(fixed[i][0] or 0.0 for i in range(8, 14)) == [4000.0] * 4 + [4100.0] * 2


def test_every_policy_finishes_every_job_without_overcommitting_gpus() -> None:
    jobs = [
        TraceJob(i, float(i * 37 % 900), float(60 + (i * 7919) % 5000), [1, 2, 4, 8, 16][i % 5], f"q{i % 3}")
        for i in range(60)
    ]
    for policy in POLICIES:
        result = simulate(jobs, "4x8", policy.name, options=SimOptions())
        assert summarize(result)["finished"] == 60, policy.name
        assert all(0 <= s.used_gpus <= 32 + 1e-9 for s in result.timeline), policy.name
        assert all(j.start is not None and j.finish is not None and j.finish >= j.start for j in result.jobs)


def test_metrics_follow_their_definitions() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert jain([1.0, 1.0, 1.0]) == 1.0
    assert jain([1.0, 0.0]) == 0.5


def test_unknown_policies_are_refused_before_anything_runs() -> None:
    with pytest.raises(SimError, match=r"--policy: unknown policy 'lottery'; one of fifo"):
        resolve_policies("fifo,lottery")
    assert [p.name for p in resolve_policies("las,fifo,las")] == ["las", "fifo"]
    assert len(resolve_policies("all")) == len(POLICIES)


@pytest.mark.parametrize("policy", [p.name for p in POLICIES])
def test_skipping_cycles_that_cannot_change_anything_leaves_every_figure_as_it_was(policy: str) -> None:
    jobs = [
        TraceJob(
            i, float(i * 53 % 1920), float(30 + (i * 7919) % 9000), [1, 1, 1, 2, 4, 8, 16][i % 7], f"q{i % 4}"
        )
        for i in range(120)
    ]
    queues = (
        QueueView("q0", gpu=Share(quota=4.0)),
        QueueView("q1", gpu=Share(quota=8.0, weight=2.0)),
        QueueView("q2", gpu=Share(quota=12.0)),
        QueueView("q3", gpu=Share(quota=8.0, limit=16.0)),
    )
    built = load_cluster("4x8")
    runs = []
    for shortcuts in (True, False):
        sim = Simulation(jobs, 0.0, built, queues, BY_NAME[policy], SimOptions())
        sim.shortcuts = shortcuts
        result = sim.run()
        runs.append(([(j.id, j.start, j.finish, j.preemptions, j.queued) for j in result.jobs], sim.skipped))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] > 0 == runs[1][1]  # cycles were skipped, and only with the shortcuts on


@pytest.mark.parametrize("policy", ["drf", "gpupool", "gpupool-bands", "gpupool-oracle"])
def test_skipping_cycles_stays_exact_where_reclaim_takes_gangs_and_reclaims_by_quota(policy: str) -> None:
    """A queue with a small quota borrows most of the cluster in 16-GPU gangs; queues within their quotas
    then reclaim (by fair share, by quota, and whole gangs): the skip test must count every rule."""
    jobs = [TraceJob(i, float(i * 37 % 600), 20_000.0, 16, "big") for i in range(3)]
    jobs += [
        TraceJob(3 + i, 900.0 + i * 211 % 5000, float(600 + (i * 7919) % 6000), [8, 4, 2, 1, 6][i % 5],
                 ["mid", "small", "tiny"][i % 3])
        for i in range(90)
    ]  # fmt: skip
    queues = (
        QueueView("big", gpu=Share(quota=4.0)),
        QueueView("mid", gpu=Share(quota=12.0)),
        QueueView("small", gpu=Share(quota=10.0)),
        QueueView("tiny", gpu=Share(quota=6.0, weight=3.0)),
    )
    runs = []
    for shortcuts in (True, False):
        sim = Simulation(jobs, 0.0, load_cluster("4x8"), queues, BY_NAME[policy], SimOptions())
        sim.shortcuts = shortcuts
        result = sim.run()
        runs.append(([(j.id, j.start, j.finish, j.preemptions, j.queued) for j in result.jobs], sim.skipped))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] > 0 == runs[1][1]
    gangs_evicted = sum(preemptions for id_, _, _, preemptions, _ in runs[0][0] if id_ < 3)
    assert gangs_evicted >= 1  # a borrowed gang went whole (only reclaim takes gangs)


@pytest.mark.parametrize("policy", ["gpupool", "las", "drf"])
def test_an_eviction_s_gainer_started_on_its_nominated_room_leaves_every_figure_as_the_next_round_would(
    policy: str,
) -> None:
    """Where an eviction has one gainer, the engine starts it on the room the cycle nominated for it and
    skips the round that would do only that (`_start_gainer`). A busy seeded trace with quotas, reclaim
    and preemption: the same outcome with the shortcuts on and off, and the shortcut taken."""
    rng = random.Random(11)
    jobs, t = [], 0.0
    for i in range(260):
        t += rng.expovariate(1 / 90.0)
        gpus = rng.choice([1, 1, 1, 2, 2, 4, 8, 16])
        jobs.append(TraceJob(i, t, rng.choice([60.0, 300.0, 1800.0, 7200.0, 30_000.0]), gpus, f"q{i % 3}"))
    queues = (
        QueueView("q0", gpu=Share(quota=8.0)),
        QueueView("q1", gpu=Share(quota=8.0, weight=2.0)),
        QueueView("q2", gpu=Share(quota=8.0)),
    )
    runs = []
    for shortcuts in (True, False):
        sim = Simulation(jobs, 0.0, load_cluster("3x8"), queues, BY_NAME[policy], SimOptions())
        sim.shortcuts = shortcuts
        result = sim.run()
        outcome = [(j.id, j.start, j.finish, j.preemptions, j.queued, j.lost_gpu_s) for j in result.jobs]
        runs.append((outcome, sim.gainers_started))
    assert runs[0][0] == runs[1][0]
    assert sum(preemptions for _, _, _, preemptions, _, _ in runs[0][0]) > 0
    assert runs[0][1] > 0 == runs[1][1]


def test_the_oracle_bound_inside_quotas_lets_less_remaining_work_go_first_and_keeps_other_quotas() -> None:
    queues = (QueueView("a", gpu=Share(quota=4.0)), QueueView("b", gpu=Share(quota=4.0)))
    jobs = [
        TraceJob(0, 0.0, 36_000.0, 4, "b"),  # inside b's quota the whole time
        TraceJob(1, 0.0, 3_600.0, 4, "a"),
        TraceJob(2, 3_000.0, 36_000.0, 4, "a"),  # arrives when job 1 has 10 minutes left
        TraceJob(3, 4_000.0, 300.0, 4, "a"),  # arrives behind job 2 with far less to do
    ]
    oracle = simulate(jobs, "1x8", "gpupool-oracle", queues)
    runs = by_id(oracle)
    preempted = {j.id: j.preemptions for j in oracle.jobs}
    # Job 1, nearly done, is not preempted for the new long job 2 (least attained service would: job 2
    # has attained nothing); job 3, with 5 minutes to do, preempts job 2; b's job is never touched.
    assert runs[1] == (0.0, 3_600.0)
    assert runs[2][0] == 3_600.0 and runs[3] == (4_000.0, 4_300.0)
    assert preempted == {0: 0, 1: 0, 2: 1, 3: 0}
    las_like = {j.id: j.preemptions for j in simulate(jobs, "1x8", "gpupool", queues).jobs}
    assert las_like[1] == 1 and las_like[0] == 0


def test_the_engine_builds_each_view_as_the_keyword_form_would() -> None:
    """`workload_view` passes WorkloadView's fields by position (for speed): it must give what naming
    them gives, pending and running, so that a field added or moved in WorkloadView cannot slip by."""
    trace = TraceJob(7, 1000.0, 60.0, 2, "a", cpus=4.0, memory_bytes=2**30)
    job = engine._Job(3, trace, "a", 1, GpuDemand(2.0))
    job.priority, job.attained = 5, 120.0
    pending = engine.workload_view(job, 400.0, duration_estimate=90.0)
    common = {
        "id": 3, "queue": "a", "priority": 5, "submit_time": 600.0, "nodes": 1, "gpus": GpuDemand(2.0),
        "cpus": 4.0, "memory_bytes": 2**30, "attained_service": 120.0,
    }  # fmt: skip
    assert pending == WorkloadView(**common, duration_estimate=90.0)
    pods = (PodPlacement("n1", (0, 1)),)
    running = engine.workload_view(job, 400.0, placement=pods, start_time=700.0, last_checkpoint_time=800.0)
    assert running == WorkloadView(**common, placement=pods, start_time=700.0, last_checkpoint_time=800.0)
    defaults = {f.name for f in dataclasses.fields(WorkloadView) if f.init} - set(common) - {
        "duration_estimate", "placement", "start_time", "last_checkpoint_time"
    }  # fmt: skip
    # every other field is its default: anything the positions put elsewhere would show here
    assert all(getattr(running, name) == getattr(WorkloadView(0, "q", 0, 0.0), name) for name in defaults)


@pytest.mark.parametrize(
    ("arrivals", "starts_at"),
    [
        ([], 95.0),  # the first tick after it arrived (35 + 60): a running job is old enough to move
        ([TraceJob(5, 50.0, 100.0, 4, "a")], 110.0),  # an arrival at 50 runs a cycle; the tick is 60 s on
        # a job larger than the cluster arrives at 50 and is dropped: nothing changed, the tick still comes
        ([TraceJob(5, 50.0, 100.0, 8, "a")], 95.0),
    ],
)
def test_work_that_only_consolidation_can_place_starts_at_a_clock_tick_with_no_event_to_wake_it(
    arrivals: list[TraceJob], starts_at: float
) -> None:
    """Two GPUs free, one on each node, and a 2-GPU job waits ("fragmented"): consolidation may move a
    1-GPU job once it has run MIN_MOVE_AGE (60 s), a change only the clock brings. With no event for
    hours, the engine's periodic cycle must come: the job starts at a tick, not when a job ends at 10,000;
    an event that changes nothing (a job dropped as too large) must not cancel that tick."""
    jobs = [
        TraceJob(0, 0.0, 10_000.0, 1, "a"),  # node 0, with job 1
        TraceJob(1, 0.0, 30.0, 1, "a"),
        TraceJob(2, 0.0, 20.0, 2, "a"),  # node 1
        TraceJob(3, 5.0, 10_000.0, 1, "a"),  # waits, then starts on node 1 at 20
        TraceJob(4, 35.0, 100.0, 2, "a"),  # at 35: one GPU free on each node
        *arrivals,
    ]
    result = simulate(jobs, "2x2", "gpupool-estimate")  # consolidation, and no bands (no band events)
    assert by_id(result)[4] == (starts_at, starts_at + 100.0)
    assert sum(j.preemptions for j in result.jobs) == 1  # one job moved to make room
    assert result.dropped == [j.id for j in arrivals if j.gpus > 4]


def test_a_figure_of_no_jobs_is_none_not_zero() -> None:
    """A queue of the quota file that sent no job has no JCT or slowdown: null in the JSON, "-" in tables
    (0.0 read as a queue served at once)."""
    queues = (QueueView("a", gpu=Share(quota=4.0)), QueueView("idle", gpu=Share(quota=4.0)))
    metrics = summarize(simulate([TraceJob(0, 0.0, 100.0, 1, "a")], "1x8", "gpupool", queues))
    assert metrics["queues"]["a"]["avg_jct_s"] == 100.0
    idle = metrics["queues"]["idle"]
    assert (idle["jobs"], idle["avg_jct_s"], idle["avg_queue_s"], idle["mean_slowdown"]) == (
        0,
        None,
        None,
        None,
    )
    assert percentile([], 50) is None
