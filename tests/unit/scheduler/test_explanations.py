"""What a workload left pending is told about its place: how many workloads of its queue come before it,
in the queue's own order (which allocate walks; the count must be that of the order, not of the walk)."""

from __future__ import annotations

import re
from dataclasses import replace

from gpupool.scheduler import QueueView, SchedulerConfig, Snapshot, decide
from tests.unit.scheduler.scenario_loader import parse_scenario


def _ahead(message: str) -> int:
    found = re.search(r"(\d+) workloads? ahead", message)
    return int(found.group(1)) if found else 0


def test_each_pending_workload_is_told_how_many_of_its_queue_come_before_it() -> None:
    # One free GPU: the first of queue a starts; queue b's work is ordered before a's by fair share, and
    # inside a queue by submit time (the ids), whatever order the snapshot lists them in.
    scenario = parse_scenario(
        {
            "description": "places in line",
            "nodes": [{"name": "n1", "gpus": 1}],
            "queues": [{"name": "a", "gpu": 1}, {"name": "b"}],
            "pending": [
                {"id": 13, "queue": "a"},
                {"id": 21, "queue": "b"},
                {"id": 11, "queue": "a"},
                {"id": 12, "queue": "a"},
                {"id": 20, "queue": "b"},
            ],
            "expect": {"binds": {11: "any"}},
        },
        "places_in_line",
    )
    decisions = decide(scenario.snapshot, scenario.now)
    assert [b.workload_id for b in decisions.binds] == [11]
    ahead = {wid: _ahead(e.message) for wid, e in decisions.explanations.items()}
    assert ahead == {12: 1, 13: 2, 20: 0, 21: 1}
    assert decisions.explanations[12].message.endswith("; 1 workload ahead")  # one, not "1 workloads"
    assert decisions.explanations[13].message.endswith("; 2 workloads ahead")


def test_work_that_can_never_fit_the_pool_is_not_counted_ahead_of_anyone() -> None:
    # 10 (16 GPUs on 2) and 11 (a model the pool lacks) come first in queue a's order, but hold no one back
    scenario = parse_scenario(
        {
            "description": "never ahead",
            "nodes": [{"name": "n1", "gpus": 2}],
            "queues": [{"name": "a", "gpu": 2}],
            "running": [{"id": 1, "queue": "a", "on": {"n1": "0-1"}}],
            "pending": [
                {"id": 10, "queue": "a", "gpus": 16},
                {"id": 11, "queue": "a", "gpus": "L4:1"},
                {"id": 12, "queue": "a"},
                {"id": 13, "queue": "a"},
            ],
            "expect": {"binds": {}},
        },
        "never_ahead",
    )
    decisions = decide(scenario.snapshot, scenario.now)
    codes = {wid: e.code for wid, e in decisions.explanations.items()}
    assert codes[10] == "too-large" and codes[11] == "no-matching-gpu"
    ahead = {wid: _ahead(decisions.explanations[wid].message) for wid in (12, 13)}
    assert ahead == {12: 0, 13: 1}, {w: decisions.explanations[w].message for w in (12, 13)}


def test_work_held_back_by_strict_order_names_the_workload_it_waits_behind() -> None:
    # 10 blocks the queue until preempt makes room for it; then 11 is tried and does not fit (nothing it
    # may evict): 12, which would fit on the free GPU, waits behind 11, not behind 10.
    scenario = parse_scenario(
        {
            "description": "strict order",
            "now": 10000,
            "config": {"blocking": "strict"},
            "nodes": [{"name": "n1", "gpus": 4}],
            "running": [
                {"id": 1, "on": {"n1": "0-1"}, "priority": 10},
                {"id": 2, "on": {"n1": [2]}, "priority": 50, "preemptible": False},
            ],
            "pending": [
                {"id": 10, "gpus": 2, "priority": 100},
                {"id": 11, "gpus": 3, "priority": 100},
                {"id": 12, "gpus": 1, "priority": 100},
            ],
            "expect": {"binds": {}, "evictions": {1: "preempt for 10"}},
        },
        "strict_order",
    )
    decisions = decide(scenario.snapshot, scenario.now)
    assert [e.workload_id for e in decisions.evictions] == [1]
    assert decisions.explanations[11].code == "no-capacity"
    assert decisions.explanations[12].message == "waiting behind workload 11 (strict order)"


def test_work_waiting_for_release_names_the_work_stopping_for_it_then_and_later() -> None:
    # Preempt evicts 1 and 2 for 10 (two GPUs of a full node): 10 is told which workloads stop for it. In
    # the next cycle they are stopping, evicted for 10, and 10 is told the same; stopping for no one
    # known (say, cancelled), they are named to no one.
    data: dict[str, object] = {
        "description": "waiting names its victims",
        "now": 10000,
        "nodes": [{"name": "n1", "gpus": 4}],
        "running": [
            {"id": 1, "on": {"n1": [0]}, "priority": 10},
            {"id": 2, "on": {"n1": [1]}, "priority": 10},
            {"id": 3, "on": {"n1": [2]}, "priority": 100},
            {"id": 4, "on": {"n1": [3]}, "priority": 100},
        ],
        "pending": [{"id": 10, "gpus": 2, "priority": 100}],
        "expect": {"binds": {}, "evictions": {1: "preempt for 10", 2: "preempt for 10"}},
    }
    first = parse_scenario(data, "first")
    decisions = decide(first.snapshot, first.now)
    assert sorted(e.workload_id for e in decisions.evictions) == [1, 2]
    waiting = "waiting for 2 GPUs being released by stopping work"
    assert decisions.explanations[10].message == waiting + " (workloads 1, 2 stop for it)"

    for gainer, told in ((10, waiting + " (workloads 1, 2 stop for it)"), (None, waiting)):
        later = {
            **data,
            "running": [
                {**r, "stopping": True, "evicted_for": gainer} if r["id"] in (1, 2) else r
                for r in _running(data)
            ],
            "expect": {"binds": {}, "evictions": {}},
        }
        second = parse_scenario(later, "second")
        decisions = decide(second.snapshot, second.now)
        assert not decisions.evictions
        assert decisions.explanations[10].message == told


def _running(data: dict[str, object]) -> list[dict[str, object]]:
    running = data["running"]
    assert isinstance(running, list)
    return running


def _reasons(raw: dict[str, object]) -> dict[int, tuple[str, str]]:
    data = {"description": "x", "config": {"blocking": "skip"}, "expect": {"evictions": {}}, **raw}
    decisions = decide(parse_scenario(data, "reasons").snapshot, 0.0)
    assert decisions.evictions == []
    return {wid: (e.code, e.message) for wid, e in decisions.explanations.items()}


def test_work_that_finds_its_gpus_free_but_not_the_cpus_or_memory_beside_them_is_told_which() -> None:
    # Both nodes have 7 GPUs free; n1's CPUs and n2's memory are nearly all taken by running work (n1
    # has 2 CPUs and 55GB free, n2 6 CPUs and 5GB).
    nodes = [
        {"name": "n1", "gpus": 8, "cpus": 32, "memory": "100GB"},
        {"name": "n2", "gpus": 8, "cpus": 32, "memory": "100GB"},
    ]
    running = [
        {"id": 1, "on": {"n1": [0]}, "cpus": 30, "memory": "45GB"},
        {"id": 2, "on": {"n2": [0]}, "cpus": 26, "memory": "95GB"},
    ]
    reasons = _reasons(
        {
            "nodes": nodes,
            "running": running,
            "pending": [
                {"id": 10, "gpus": 1, "cpus": 8},  # no node has 8 CPUs free (n2 has 6)
                {"id": 11, "gpus": 1, "cpus": 4, "memory": "10GB"},  # n1 lacks CPUs, n2 memory
                {"id": 12, "gpus": 2, "memory": "50GB"},  # n2 lacks memory; n1 has it: not the reason
            ],
        }
    )
    assert reasons[10] == (
        "fragmented",
        "needs 8 CPUs on a node with 1 GPU free; those nodes have at most 6 CPUs free (n2)",
    )
    assert reasons[11] == (
        "fragmented",
        "needs 4 CPUs and 10GB of memory on a node with 1 GPU free; no such node has both free",
    )
    assert 12 not in reasons  # bound
    memory_short = _reasons(
        {"nodes": nodes, "running": running, "pending": [{"id": 13, "gpus": 7, "cpus": 1, "memory": "60GB"}]}
    )
    assert memory_short[13] == (
        "fragmented",
        "needs 60GB of memory on a node with 7 GPUs free; those nodes have at most 55GB free (n1)",
    )


def test_work_that_lacks_gpus_is_told_about_gpus_whatever_cpus_it_asks_for() -> None:
    reasons = _reasons(
        {
            "nodes": [{"name": "n1", "gpus": 2, "cpus": 32}],
            "running": [{"id": 1, "on": {"n1": [0, 1]}, "cpus": 30}],
            "pending": [{"id": 10, "gpus": 1, "cpus": 8}],
        }
    )
    assert reasons[10][0] == "over-fair-share" and "CPUs" not in reasons[10][1]  # its queue holds them all
    # the pool is full, and said so first (Slurm's "Resources"), then why reclaim does not help
    assert reasons[10][1] == (
        "waiting for GPUs to come free: queue q holds 2 GPUs, at or over its fair share of 2, so no other "
        "queue's work is reclaimed for it"
    ), reasons[10][1]


def test_work_that_asks_more_cpus_or_memory_than_any_node_has_can_never_fit_and_evicts_nothing() -> None:
    """A pod's CPUs and memory must fit one node's whole, as its GPUs must: asking more is `too-large`
    (no eviction could make room), not a shortage that evictions might cure. Here it would outrank every
    running workload, and still preempts nothing."""
    nodes = [
        {"name": "n1", "gpus": 8, "cpus": 32, "memory": "100GB"},
        {"name": "n2", "gpus": 4, "cpus": 64, "memory": "200GB"},
        {"name": "n3", "gpus": 0, "cpus": 128, "memory": "1TB"},
    ]
    running = [{"id": 1, "on": {"n1": [0]}, "priority": 0}, {"id": 2, "on": {"n2": [0]}, "priority": 0}]
    pending = [
        {"id": 10, "gpus": 1, "cpus": 100, "priority": 100},  # only n3 has 100 CPUs, and no GPU
        {"id": 11, "gpus": 0, "memory": "2TB", "priority": 100},
        {"id": 12, "gpus": 2, "cpus": 48, "memory": "150GB", "nodes": 2, "priority": 100},  # n2 alone
        {"id": 13, "gpus": 8, "cpus": 40, "priority": 100},  # 8 GPUs: n1 alone, with 32 CPUs
        {"id": 14, "gpus": 1, "cpus": 48, "priority": 100, "only_on": ["n1"]},
        {"id": 15, "gpus": 2, "cpus": 60, "priority": 100},  # n2 has them: it fits
    ]
    reasons = _reasons({"nodes": nodes, "running": running, "pending": pending})
    assert reasons[10] == ("too-large", "can never fit this pool: needs 100 CPUs on one node with its GPUs; "
                           "the largest has 64")  # fmt: skip
    assert reasons[11] == ("too-large", "can never fit this pool: needs 2TB of memory on one node; "
                           "the largest has 1TB")  # fmt: skip
    assert reasons[12] == ("too-large", "can never fit this pool: needs 2 nodes with 48 CPUs and 150GB of "
                           "memory beside its GPUs each; 1 has them")  # fmt: skip
    assert reasons[13] == ("too-large", "can never fit this pool: needs 40 CPUs on one node with its GPUs; "
                           "the largest has 32")  # fmt: skip
    assert reasons[14] == ("too-large", "can never fit this pool: needs 48 CPUs on one node with its GPUs; "
                           "the largest has 32")  # fmt: skip
    assert 15 not in reasons  # bound on n2


def test_work_in_a_pool_no_node_has_joined_yet_waits_for_one_and_is_told_so() -> None:
    """A head whose agents have not joined has no nodes: its work is not "too large" for the pool."""
    data = {
        "description": "x",
        "nodes": [{"name": "n1", "gpus": 1}],
        "pending": [{"id": 10, "gpus": 1}],
        "expect": {},
    }
    pending = parse_scenario(data, "reasons").snapshot.pending
    gang = replace(pending[0], id=11, nodes=2)
    snapshot = Snapshot((), (*pending, gang), (QueueView("default"),), (), SchedulerConfig())
    reasons = {wid: (e.code, e.message) for wid, e in decide(snapshot, 0.0).explanations.items()}
    assert reasons == {
        10: (
            "no-capacity",
            "needs a node; the pool has no nodes (none has joined, or all were deleted: `gpupool nodes`)",
        ),
        11: (
            "no-capacity",
            "needs 2 nodes; the pool has no nodes (none has joined, or all were deleted: `gpupool nodes`)",
        ),
    }


def test_work_within_its_quota_that_nothing_can_be_reclaimed_for_is_told_why() -> None:
    # cv is within its quota of 4 and wants 4; 2 GPUs are free, and nlp borrows 2 beyond its own quota of
    # 4 in one 6-GPU job that is within its minimum runtime for reclaim: nothing may be taken yet.
    data: dict[str, object] = {
        "description": "quota not reclaimable",
        "now": 10000,
        "nodes": [{"name": "n1", "gpus": 8}],
        "queues": [{"name": "nlp", "gpu": 4, "min_runtime_reclaim": 3600}, {"name": "cv", "gpu": 4}],
        "running": [{"id": 1, "queue": "nlp", "gpus": 6, "on": {"n1": [0, 1, 2, 3, 4, 5]}, "start": 9940}],
        "pending": [{"id": 10, "queue": "cv", "gpus": 4}],
    }
    reasons = _reasons(data)
    assert reasons[10] == (
        "no-capacity",
        "needs 4 GPUs; 2 GPUs free in the pool; queue cv is within its quota (0 of 4 GPUs in use), but "
        "reclaim found nothing to take for it: the work beyond other queues' quotas is non-preemptible or "
        "within its minimum runtime, or stopping it would not free room this work can use",
    )
    # Past its minimum runtime, the 6-GPU job goes whole, though nlp ends below its quota: the job borrows.
    old = {**data, "running": [{**data["running"][0], "start": 2800}]}  # type: ignore[index]
    scenario = parse_scenario({**old, "expect": {"evictions": {1: "reclaim for 10"}}}, "borrowed whole")
    decisions = decide(scenario.snapshot, scenario.now)
    assert [(e.workload_id, e.for_workload) for e in decisions.evictions] == [(1, 10)]
    assert "queue nlp holds GPUs beyond its quota, and a job that borrows is stopped whole" in (
        decisions.evictions[0].reason
    )
    # The same 6 GPUs in a 2-GPU and a 4-GPU job: the 2-GPU one goes (nlp keeps its 4), and cv waits for it.
    split = {
        **data,
        "running": [
            {"id": 1, "queue": "nlp", "gpus": 2, "on": {"n1": [0, 1]}},
            {"id": 2, "queue": "nlp", "gpus": 4, "on": {"n1": [2, 3, 4, 5]}},
        ],
        "expect": {"binds": {}, "evictions": {1: "reclaim for 10"}},
    }
    scenario = parse_scenario(split, "reclaimable")
    decisions = decide(scenario.snapshot, scenario.now)
    assert [(e.workload_id, e.for_workload) for e in decisions.evictions] == [(1, 10)]
    assert decisions.explanations[10].code == "waiting-for-release"


def test_work_with_no_gpus_waiting_for_a_node_is_not_told_about_reclaim() -> None:
    """Reclaim frees GPUs; a quota promises GPUs. Work that asks for none and finds no node that takes work
    is told about the nodes alone, whatever its queue's quota."""
    data: dict[str, object] = {
        "nodes": [{"name": "n1", "gpus": 8, "state": "cordoned"}],
        "queues": [{"name": "cv", "gpu": 4}],
        "pending": [{"id": 10, "queue": "cv", "gpus": 0}, {"id": 11, "queue": "cv", "gpus": 1}],
    }
    reasons = _reasons(data)
    assert reasons[10][0] == "no-capacity" and "reclaim" not in reasons[10][1], reasons[10]
    assert "n1 cordoned" in reasons[10][1] and reasons[11][0] == "no-capacity"


def test_work_that_can_never_fit_raises_no_fair_share() -> None:
    """A 16-GPU job on an 8-GPU pool counted 16 GPUs of its queue's demand: queue a's fair share rose to
    the whole pool, a's small work reclaimed b's GPUs for it, and a's alert paged for work that can never
    run. It counts for nothing now, as a model no node has does."""
    scenario = parse_scenario(
        {
            "description": "never fits",
            "nodes": [{"name": "n1", "gpus": 8, "model": "H100"}],
            "queues": [{"name": "a", "gpu": 2}, {"name": "b", "gpu": 2}],
            "running": [{"id": 1, "queue": "b", "on": {"n1": [0, 1, 2, 3, 4, 5]}}],
            "pending": [
                {"id": 10, "queue": "a", "gpus": 16},
                {"id": 11, "queue": "a", "gpus": "A100:4"},
                {"id": 12, "queue": "a", "gpus": 2},
            ],
            "expect": {"binds": {12: "any"}},
        },
        "never_fits",
    )
    decisions = decide(scenario.snapshot, scenario.now)
    assert [b.workload_id for b in decisions.binds] == [12]
    assert (
        decisions.explanations[10].code == "too-large"
        and decisions.explanations[11].code == "no-matching-gpu"
    )
    assert decisions.fair_shares["a"]["gpu"] == 2.0  # its 2-GPU job alone: not 2 + 16 + 4 of demand
    assert decisions.fair_shares["b"]["gpu"] == 6.0
    assert decisions.evictions == []


def test_sizes_read_as_written_or_in_gib_as_nodes_shows_them() -> None:
    """A node's memory read "25.2762GB" beside `gpupool nodes`' "23.5GiB"; a request reads as written."""
    from gpupool.scheduler.explain import size_text

    assert [size_text(n) for n in (512 * 10**9, 64 * 2**30, 25_276_200_000, 27_139_112_960)] == [
        "512GB", "64GiB", "23.5GiB", "25.3GiB"
    ]  # fmt: skip


def test_non_preemptible_work_over_quota_at_two_levels_is_told_both_fixes() -> None:
    # dept-a and its parent dept both have no quota: raising dept-a's alone left it waiting, now told of
    # dept's only then
    scenario = parse_scenario(
        {
            "description": "two levels",
            "nodes": [{"name": "n1", "gpus": 8}],
            "queues": [{"name": "dept"}, {"name": "dept-a", "parent": "dept"}, {"name": "b", "gpu": 8}],
            "pending": [{"id": 10, "queue": "dept-a", "gpus": 1, "preemptible": False}],
            "expect": {"binds": {}},
        },
        "two_levels",
    )
    decisions = decide(scenario.snapshot, scenario.now)
    assert decisions.explanations[10].message == (
        "non-preemptible work runs only within quota: queue dept-a would hold 1 non-preemptible GPU, over "
        "its quota of 0; and queue dept would hold 1 non-preemptible GPU, over its quota of 0; it starts "
        "once these quotas cover it (`gpupool queue update dept-a --gpu-quota 1`, `gpupool queue update "
        "dept --gpu-quota 1`), or submit it preemptible (`gpupool run --preemptible`, `preemptible: true`)"
    )


def test_work_waiting_for_an_unhealthy_node_is_told_where_the_evidence_is() -> None:
    scenario = parse_scenario(
        {
            "description": "unhealthy",
            "nodes": [{"name": "n1", "state": "unhealthy"}, {"name": "n2", "state": "cordoned"}],
            "pending": [{"id": 10, "gpus": 1, "nodes": 2}],
            "expect": {"binds": {}},
        },
        "unhealthy",
    )
    said = decide(scenario.snapshot, scenario.now).explanations[10].message
    assert said.endswith(
        "0 can take work now (n1 unhealthy, n2 cordoned); why a node is unhealthy: `gpupool health status`"
    ), said


def test_over_fair_share_tells_the_gpus_being_freed_for_the_queue_apart_from_those_it_holds() -> None:
    """`gpupool why 13` said "queue nlp holds 13 GPUs" beside the queue's "allocated 9": the scheduler's
    allocation counts the GPUs being released for the queue's waiting work (4 here), `gpupool queues` only
    the GPUs its running work holds. The sentence says both apart."""
    from gpupool.scheduler import explain

    assert explain.over_fair_share(("nlp", 13.0, 12.0, 4.0), 1).message == (
        "waiting for GPUs to come free: queue nlp holds 9 GPUs and 4 more being freed for its work, at or "
        "over its fair share of 12, so no other queue's work is reclaimed for it; 1 workload ahead"
    )
    assert explain.over_fair_share(("nlp", 4.0, 4.0, 4.0), 0).message == (
        "waiting for GPUs to come free: queue nlp holds no GPUs but 4 GPUs being freed for its work, at or "
        "over its fair share of 4, so no other queue's work is reclaimed for it"
    )
    nothing_freed = explain.over_fair_share(("nlp", 1.0, 1.0, 0.0), 2).message
    assert nothing_freed == explain.over_fair_share(("nlp", 1.0, 1.0), 2).message  # as before: no 4th
    assert nothing_freed.startswith("waiting for GPUs to come free: queue nlp holds 1 GPU, at or over")


_NLP_WAITS_FOR_RELEASE: dict[str, object] = {
    # nlp runs 9 GPUs; cv's workload 3 stops for nlp's 10 (evicted in an earlier cycle): 10 waits for its
    # 4 GPUs, and 13 waits with nlp at its fair share (12) once those 4 count
    "description": "nlp's work waits for GPUs being released",
    "now": 10000,
    "nodes": [{"name": "n1", "gpus": 8}, {"name": "n2", "gpus": 8}],
    "queues": [{"name": "nlp", "gpu": 8}, {"name": "cv"}],
    "running": [
        {"id": 1, "queue": "nlp", "on": {"n1": "0-7"}},
        {"id": 2, "queue": "nlp", "on": {"n2": [0]}},
        {"id": 3, "queue": "cv", "on": {"n2": "1-4"}, "stopping": True, "evicted_for": 10},
        {"id": 4, "queue": "cv", "on": {"n2": "5-7"}},
    ],
    "pending": [{"id": 10, "queue": "nlp", "gpus": 4}, {"id": 13, "queue": "nlp", "gpus": 4}],
    "expect": {"binds": {}, "evictions": {}},
}


def test_work_over_its_fair_share_is_told_what_its_queue_runs_as_gpupool_queues_counts_it() -> None:
    scenario = parse_scenario(_NLP_WAITS_FOR_RELEASE, "waits_for_release")
    decisions = decide(scenario.snapshot, scenario.now)
    assert decisions.explanations[10].code == "waiting-for-release"
    assert decisions.explanations[13].message == (
        "waiting for GPUs to come free: queue nlp holds 9 GPUs and 4 more being freed for its work, at or "
        "over its fair share of 12, so no other queue's work is reclaimed for it; 1 workload ahead"
    )


def test_a_count_of_one_is_said_in_the_singular() -> None:
    """ "1 GPUs free", "needs 1 schedulable node(s)": a count of one reads "1 GPU", "1 node"."""
    scenario = parse_scenario(
        {
            "description": "one free",
            "nodes": [{"name": "n1", "gpus": 2, "cpus": 8}],
            "queues": [{"name": "a", "gpu": 2}, {"name": "b", "gpu": 0}],
            "running": [{"id": 1, "queue": "a", "on": {"n1": [0]}, "cpus": 7}],
            "pending": [{"id": 10, "queue": "a", "gpus": 2}, {"id": 11, "queue": "a", "gpus": 1, "cpus": 2}],
            "expect": {"binds": {}, "evictions": {}},
        },
        "one_free",
    )
    said = {wid: e.message for wid, e in decide(scenario.snapshot, scenario.now).explanations.items()}
    assert said[10] == "needs 2 GPUs; 1 GPU free in the pool", said
    assert said[11] == "needs 2 CPUs on a node with 1 GPU free; those nodes have at most 1 CPU free (n1)"
    from gpupool.scheduler import NodeView, WorkloadView, explain

    one = WorkloadView(20, "a", 50, 0.0, nodes=1)
    lost = (NodeView("n1", schedulable=False, gpus=(), state="lost"),)
    assert (
        explain.unschedulable_nodes(one, lost).message
        == "needs 1 schedulable node; 0 can take work now (n1 lost)"
    )
    assert explain.named_nodes(one, "n9", "n9 is not in the pool").message == (
        "needs 1 schedulable node among its placement.nodes (n9): n9 is not in the pool"
    )
    assert explain.fragmented(replace(one, nodes=2), 1, "n1").message.endswith(
        "largest free block is 1 GPU on n1"
    )
    assert explain.queue_limit("q", "gpu", 1, 1, 1).message == "queue q is at its limit (1/1 GPU)"
    assert explain.queue_limit("q", "cpu", 0, 1, 2).message.startswith("needs 2 CPUs, more than queue q's")
    assert explain.stopping_limit(4, 1, 0).message.startswith("1 GPU is being released")
    assert explain.waiting_for_release(replace(one, gpus=replace(one.gpus, count=1))).message == (
        "waiting for 1 GPU being released by stopping work"
    )
