"""whatif's pure half: the API's history becomes trace jobs; changes to nodes and quotas are checked."""

from __future__ import annotations

import pytest

from gpupool.scheduler import QueueView, Share
from gpupool.sim.cluster import parse_groups
from gpupool.sim.errors import SimError
from gpupool.sim.policies import BY_NAME
from gpupool.sim.trace import TraceJob
from gpupool.sim.whatif import (
    changed,
    check_changes,
    check_models,
    check_replays,
    cluster_from_nodes,
    compare,
    history_jobs,
    measured_jcts,
    unfinished_note,
)

T0 = "2026-11-30T10:00:00+00:00"


def workload(
    state: str, gpus: str, started: str | None, finished: str | None, nodes: int = 1
) -> dict[str, object]:
    return {"kind": "job", "queue": "nlp", "state": state, "gpus": gpus, "nodes": nodes, "created_at": T0,
            "started_at": started, "finished_at": finished}  # fmt: skip


def test_history_keeps_jobs_that_ran_with_their_run_time_and_gpus() -> None:
    rows = [
        workload("succeeded", "H100:2", "2026-11-30T10:00:10+00:00", "2026-11-30T11:00:10+00:00"),
        workload("running", "4", "2026-11-30T10:30:00+00:00", None, nodes=2),
        workload("pending", "1", None, None),
        workload("succeeded", "0", "2026-11-30T10:00:10+00:00", "2026-11-30T10:10:00+00:00"),
    ]
    assert history_jobs([], 0, 0) == []
    jobs = history_jobs(rows, since=0.0, now=1_796_036_400.0)  # later than every row
    assert len(jobs) == 2
    done, running = jobs
    assert (done.gpus, done.duration, done.gpu_models) == (2.0, 3600.0, ("H100",))
    assert running.gpus == 8.0 and running.nodes == 2 and running.duration > 0


def test_a_preempted_job_is_replayed_for_the_time_its_attempts_ran_not_its_wait_between_them() -> None:
    # first started 10:00, preempted at 10:20, pending for an hour, then ran 11:20 to 12:00: 60 minutes of
    # work, not the 120 from its first start to its end
    row = {
        **workload("succeeded", "1", "2026-11-30T10:00:00+00:00", "2026-11-30T12:00:00+00:00"),
        "run_seconds": 3600.0,
    }
    (job,) = history_jobs([row], since=0.0, now=1_796_036_400.0)
    assert job.duration == 3600.0
    never_ran = {**row, "run_seconds": 0.0}  # its only attempt never started
    assert history_jobs([never_ran], since=0.0, now=1_796_036_400.0) == []


def test_work_an_eviction_made_a_job_do_again_is_replayed_once() -> None:
    # as above, but it declares no checkpoint: its second attempt did the first 20 minutes again, so the
    # head says 40 minutes of work (`work_seconds`), and the replay preempts it on its own terms
    row = {
        **workload("succeeded", "1", "2026-11-30T10:00:00+00:00", "2026-11-30T12:00:00+00:00"),
        "run_seconds": 3600.0,
        "work_seconds": 2400.0,
    }
    (job,) = history_jobs([row], since=0.0, now=1_796_036_400.0)
    assert job.duration == 2400.0


def test_work_pending_again_after_it_ran_is_replayed_and_gpupools_own_checks_are_not() -> None:
    evicted = {**workload("pending", "2", "2026-11-30T10:00:00+00:00", None), "work_seconds": 600.0}
    check = {**workload("succeeded", "8", "2026-11-30T10:00:00+00:00", "2026-11-30T10:00:01+00:00"),
             "queue": "gpupool-system", "work_seconds": 1.0}  # fmt: skip
    (job,) = history_jobs([evicted, check], since=0.0, now=1_796_036_400.0)
    assert (job.gpus, job.duration, job.queue) == (2.0, 600.0, "nlp")
    # evicted with no checkpoint, it kept no work: it needs about as long as its attempts ran, again
    lost = {**evicted, "work_seconds": 0.0, "run_seconds": 300.0}
    assert [j.duration for j in history_jobs([lost], since=0.0, now=1_796_036_400.0)] == [300.0]
    assert measured_jcts([evicted, check], 0.0, 1_796_036_400.0) == {}  # neither ended as a job to compare


def test_changes_add_and_remove_nodes_and_set_quotas() -> None:
    nodes = parse_groups("2x8", "--cluster")
    queues = [QueueView("nlp", gpu=Share(quota=4.0, limit=6.0))]
    new_nodes, new_queues = changed(nodes, queues, add=["1x8:H100"], remove=["node-0"], quotas=["nlp=8"])
    assert [n.name for n in new_nodes] == ["node-1", "added-1"]
    assert new_queues[0].gpu.quota == 8.0 and new_queues[0].gpu.limit == 8.0
    with pytest.raises(SimError, match=r"--remove: no node named 'node-9'"):
        changed(nodes, queues, remove=["node-9"])
    with pytest.raises(SimError, match=r"--quota: no queue named 'cv'"):
        changed(nodes, queues, quotas=["cv=4"])
    with pytest.raises(SimError, match=r"--quota: 'nlp' is not QUEUE=GPUS"):
        changed(nodes, queues, quotas=["nlp"])


@pytest.mark.parametrize(
    ("add", "quotas", "message"),
    [
        (["4x8:H100", "2by8"], [], r"--add: '2by8' is not NODESxGPUS"),
        (["0x8"], [], r"--add: '0x8': nodes and GPUs per node must be at least 1"),
        ([], ["nlp"], r"--quota: 'nlp' is not QUEUE=GPUS"),
        ([], ["=4"], r"--quota: '=4' is not QUEUE=GPUS"),
        ([], ["nlp=many"], r"--quota: 'many' is not a number of GPUs"),
        ([], ["nlp=-1"], r"--quota: 'nlp=-1': a quota is a number of GPUs, 0 or more"),
        ([], ["nlp=nan"], r"--quota: 'nlp=nan': a quota is a number of GPUs, 0 or more"),
    ],
)
def test_a_malformed_change_is_refused_without_the_live_cluster(
    add: list[str], quotas: list[str], message: str
) -> None:
    with pytest.raises(SimError, match=message):
        check_changes(add, quotas)
    with pytest.raises(SimError, match=message):  # and the same words once the cluster is known
        changed(parse_groups("2x8", "--cluster"), [QueueView("nlp")], add=add, quotas=quotas)


def test_well_formed_changes_pass_the_check_whatever_they_name() -> None:
    check_changes(["4x8:H100", "1x8,2x4:A100"], ["nlp=16", "cv=0", "ghost=2.5"])


def test_more_gpus_never_make_the_replayed_history_wait_longer() -> None:
    api_nodes = [{"name": "n0", "state": "ready", "gpus": [{"index": i, "model": "H100"} for i in range(8)]}]
    nodes = cluster_from_nodes(api_nodes)
    queues = [QueueView("nlp", gpu=Share(quota=8.0))]
    rows = [
        workload("succeeded", "8", f"2026-11-30T10:0{i}:00+00:00", f"2026-11-30T11:0{i}:00+00:00")
        for i in range(4)
    ]
    jobs = history_jobs(rows, 0.0, 2e9)
    result = compare(jobs, (nodes, queues), changed(nodes, queues, add=["1x8:H100"]), BY_NAME["gpupool"])
    assert result["before"]["gpus"] == 8 and result["after"]["gpus"] == 16
    assert result["after"]["avg_queue_s"] < result["before"]["avg_queue_s"]
    assert result["queues"]["nlp"]["jobs"] == 4


def test_an_added_gpu_model_must_be_in_the_pool_or_known() -> None:
    """A typo in `--add 4x8:H10O` is refused with the models to choose from; the pool's own models (one the
    catalog lacks too) and the catalog's, in any case or with a memory size, pass."""
    pool = parse_groups("1x4:L4,1x2:MI300X", "--cluster")
    check_models(
        ["4x8:H100", "2x8:h200", "1x8:A100-80GB", "1x8:mi300x", "2x8", "2x8:gpu"],
        pool,
        ["H100", "H200", "A100"],
    )
    with pytest.raises(SimError) as raised:
        check_models(["1x8:H100", "4x8:H10O"], pool, ["H100", "H200", "A100"])
    assert str(raised.value) == (
        "--add: unknown GPU model 'H10O' in '4x8:H10O'; models in this pool: L4, MI300X; "
        "known models: A100, H100, H200, L4, MI300X"
    )


def test_the_replay_of_the_cluster_as_it_is_is_set_beside_what_the_live_cluster_measured() -> None:
    """Four 1-hour jobs on 8 GPUs, one after the other: the live cluster gave them 1, 2, 3 and 4 hours
    (each waited for the one before); the replay of the same cluster should too, and says so beside it."""
    api_nodes = [{"name": "n0", "state": "ready", "gpus": [{"index": i, "model": "H100"} for i in range(8)]}]
    nodes = cluster_from_nodes(api_nodes)
    queues = [QueueView("nlp", gpu=Share(quota=8.0))]
    rows = [
        {**workload("succeeded", "8", f"2026-11-30T1{i}:00:00+00:00", f"2026-11-30T1{i + 1}:00:00+00:00"),
         "preemptible": False}
        for i in range(4)
    ]  # fmt: skip
    jobs = history_jobs(rows, 0.0, 2e9)
    assert not any(job.preemptible for job in jobs)
    measured = measured_jcts(rows, 0.0, 2e9)
    assert sorted(measured.values()) == [3600.0, 7200.0, 10_800.0, 14_400.0]
    result = compare(jobs, (nodes, queues), changed(nodes, queues, add=["1x8:H100"]), BY_NAME["gpupool"],
                     measured=measured)  # fmt: skip
    assert result["live"] == {"jobs": 4, "avg_jct_s": 9000.0, "replayed_avg_jct_s": 9000.0}
    assert result["before"]["preemptions"] == 0 and result["before"]["unfinished"] == 0


def test_a_node_out_of_service_now_counts_in_the_replays_as_the_history_ran_on_it() -> None:
    """A cordoned node left the replay of the cluster as it is with no GPUs: no job ran, and every figure
    read 0 with the exit status 0."""
    api_nodes = [
        {"name": f"n{k}", "state": state, "gpus": [{"index": i, "model": "H100"} for i in range(8)]}
        for k, state in enumerate(("cordoned", "lost"))
    ]
    nodes = cluster_from_nodes(api_nodes)
    assert [(n.name, n.schedulable) for n in nodes] == [("n0", True), ("n1", True)]
    queues = [QueueView("nlp", gpu=Share(quota=8.0))]
    jobs = history_jobs([workload("succeeded", "8", T0, "2026-11-30T11:00:00+00:00")], 0.0, 2e9)
    result = compare(jobs, (nodes, queues), changed(nodes, queues, remove=["n1"]), BY_NAME["gpupool"])
    assert result["before"]["avg_jct_s"] == 3600.0 and result["after"]["avg_jct_s"] == 3600.0
    assert result["queues"]["nlp"]["jobs"] == 1


def test_a_change_that_leaves_nothing_to_replay_is_refused_before_the_replays_are_announced() -> None:
    """`--remove` of the only node was refused only once "replaying 10 jobs..." had been printed."""
    nodes = parse_groups("1x8", "--cluster")
    jobs = history_jobs([workload("succeeded", "8", T0, "2026-11-30T11:00:00+00:00")], 0.0, 2e9)
    after, _ = changed(nodes, [QueueView("nlp")], remove=["node-0"])
    with pytest.raises(
        SimError, match=r"^--remove: the changed cluster has no GPUs left; remove fewer nodes"
    ):
        check_replays(jobs, nodes, after)
    with pytest.raises(SimError, match=r"^--since: no finished or running jobs in that period"):
        check_replays([], nodes, nodes)
    check_replays(jobs, nodes, nodes)


def eight_gpu_history(preemptible: bool) -> list[TraceJob]:
    rows = [
        {**workload("succeeded", "8", f"2026-11-30T1{i}:00:00+00:00", f"2026-11-30T1{i + 1}:00:00+00:00"),
         "preemptible": preemptible}
        for i in range(2)
    ]  # fmt: skip
    return history_jobs(rows, 0.0, 2e9)


def test_jobs_a_replay_never_finishes_are_said_with_their_cause_only_where_it_is_known() -> None:
    """Non-preemptible work runs only within quota: with `--quota nlp=2` its 8-GPU jobs never start, and
    that is the reason given. A job larger than its queue's limit is told so; else no cause is guessed."""
    nodes = parse_groups("1x8", "--cluster")
    queues = [QueueView("nlp", gpu=Share(quota=8.0))]
    result = compare(eight_gpu_history(False), (nodes, queues), changed(nodes, queues, quotas=["nlp=2"]),
                     BY_NAME["gpupool"])  # fmt: skip
    after = result["after"]
    assert (after["unfinished"], after["unfinished_nonpreemptible_over_quota"]) == (2, 2)
    assert after["unfinished_by_queue"] == {"nlp": 2} and result["before"]["unfinished"] == 0
    assert unfinished_note("before", result["before"]) is None
    assert unfinished_note("after", after) == (
        "the after replay never finished 2 jobs (in queue nlp), non-preemptible and asking for more GPUs "
        "than its queue's quota: non-preemptible work runs only within quota; its figures leave them out "
        "(after.unfinished in --json)"
    )
    limited = [QueueView("nlp", gpu=Share(quota=0.0, limit=4.0))]
    result = compare(eight_gpu_history(True), (nodes, queues), (nodes, limited), BY_NAME["gpupool"])
    assert result["after"]["unfinished_over_limit"] == 2
    said = unfinished_note("after", result["after"])
    assert said is not None and "asking for more GPUs than its queue's limit" in said
    assert "non-preemptible" not in said
    unknown = {"unfinished": 3, "unfinished_by_queue": {"nlp": 2, "cv": 1}}
    assert unfinished_note("before", unknown) == (
        "the before replay never finished 3 jobs (in queues nlp 2, cv 1), still pending or running when the "
        "replay ended; its figures leave them out (before.unfinished in --json)"
    )
