"""Per-queue figures: every replayed job is counted, finished or not, and a tree of queues measures each
quota guarantee once."""

from __future__ import annotations

import pytest

from gpupool.scheduler import QueueView, Share
from gpupool.sim.cluster import load_cluster
from gpupool.sim.engine import Simulation
from gpupool.sim.metrics import summarize
from gpupool.sim.policies import BY_NAME
from gpupool.sim.results import SimOptions, SimResult
from gpupool.sim.trace import TraceJob

NO_OVERHEAD = SimOptions(restart_overhead=0.0, checkpoint_interval=0.0)


def replay(jobs: list[TraceJob], cluster: str, policy: str, queues: tuple[QueueView, ...]) -> SimResult:
    return Simulation(jobs, 0.0, load_cluster(cluster), queues, BY_NAME[policy], NO_OVERHEAD).run()


def test_a_queue_counts_its_jobs_that_never_finished_and_its_averages_say_they_cover_the_finished() -> None:
    """Queue a's limit of 1 GPU never lets its 2-GPU job start under gpupool (fifo ignores limits): both
    policies replay the same 4 jobs, a's line counts 2 of them, one unfinished under gpupool."""
    queues = (
        QueueView("a", gpu=Share(quota=1.0, limit=1.0)),
        QueueView("b", gpu=Share(quota=4.0)),
        QueueView("idle", gpu=Share(quota=1.0)),
    )
    jobs = [
        TraceJob(0, 0.0, 100.0, 1, "a"),
        TraceJob(1, 10.0, 100.0, 2, "a"),
        TraceJob(2, 20.0, 100.0, 4, "b"),
        TraceJob(3, 30.0, 100.0, 16, "b"),  # larger than the cluster: dropped, in no count of replayed jobs
    ]
    figures = {p: summarize(replay(jobs, "1x8", p, queues)) for p in ("fifo", "gpupool")}
    fifo, gpupool = figures["fifo"], figures["gpupool"]
    assert (fifo["jobs"], fifo["finished"], fifo["unfinished"], fifo["dropped"]) == (3, 3, 0, 1)
    assert (gpupool["jobs"], gpupool["finished"], gpupool["unfinished"], gpupool["dropped"]) == (3, 2, 1, 1)
    for f in figures.values():
        assert {q: f["queues"][q]["jobs"] for q in ("a", "b", "idle")} == {"a": 2, "b": 1, "idle": 0}
    a = gpupool["queues"]["a"]
    assert (a["finished"], a["unfinished"], a["avg_jct_s"]) == (1, 1, 100.0)  # the average: finished jobs
    assert (fifo["queues"]["a"]["finished"], fifo["queues"]["a"]["unfinished"]) == (2, 0)
    assert gpupool["queues"]["idle"]["unfinished"] == 0
    assert sum(q["unfinished"] for q in gpupool["queues"].values()) == gpupool["unfinished"]


FLAT = (
    QueueView("a", gpu=Share(quota=2.0)),
    QueueView("b", gpu=Share(quota=2.0)),
    QueueView("c", gpu=Share(quota=4.0)),
)
NESTED = (
    QueueView("dept", gpu=Share(quota=4.0)),
    QueueView("a", parent="dept", gpu=Share(quota=2.0)),
    QueueView("b", parent="dept", gpu=Share(quota=2.0)),
    QueueView("c", gpu=Share(quota=4.0)),
)


def test_a_parent_that_adds_no_constraint_leaves_the_overall_quota_violation_as_flat_queues_give() -> None:
    """c's 8-GPU job holds the cluster from 0 to 1,000 s while a (2 GPUs) and b (1 GPU) wait: a is 2 GPUs
    short of its quota, b 1, for the whole window. fifo ignores quotas, so both trees replay alike; the
    overall figure counts the leaves' quotas, each guarantee once: 3 of 8 GPUs, flat or nested (counting the
    parent's quota too gave 3 of 12). The parent's own line measures its subtree: 3 of its 4 GPUs."""
    jobs = [
        TraceJob(0, 0.0, 1000.0, 8, "c"),
        TraceJob(1, 0.0, 1000.0, 2, "a"),
        TraceJob(2, 0.0, 1000.0, 1, "b"),
        TraceJob(3, 1000.0, 1.0, 1, "c"),  # the last arrival: the window is 0 to 1,000 s
    ]
    flat = summarize(replay(jobs, "1x8", "fifo", FLAT))
    nested = summarize(replay(jobs, "1x8", "fifo", NESTED))
    assert flat["quota_violation"] == pytest.approx(3 / 8)
    assert nested["quota_violation"] == pytest.approx(flat["quota_violation"])
    for q in ("a", "b", "c"):
        assert nested["queues"][q]["quota_violation"] == flat["queues"][q]["quota_violation"]
    assert nested["queues"]["dept"]["quota_violation"] == pytest.approx(3 / 4)


def test_flat_and_nested_quotas_give_one_violation_on_a_busy_trace_where_quotas_bind_nothing() -> None:
    """Policies of one shared queue replay alike whatever the tree; the overall figure must not move."""
    jobs = [
        TraceJob(i, float(i * 97 % 7200), float(300 + (i * 7919) % 6000), [1, 2, 4, 8][i % 4], "abc"[i % 3])
        for i in range(90)
    ]
    for policy in ("fifo", "sjf-oracle", "las"):
        flat = summarize(replay(jobs, "1x8", policy, FLAT))
        nested = summarize(replay(jobs, "1x8", policy, NESTED))
        assert flat["quota_violation"] > 0.05, policy
        assert nested["quota_violation"] == pytest.approx(flat["quota_violation"]), policy
