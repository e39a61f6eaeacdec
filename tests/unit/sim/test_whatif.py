"""whatif's pure half: the API's history becomes trace jobs; changes to nodes and quotas are checked."""

from __future__ import annotations

import pytest

from gpupool.scheduler import QueueView, Share
from gpupool.sim.cluster import parse_groups
from gpupool.sim.errors import SimError
from gpupool.sim.policies import BY_NAME
from gpupool.sim.whatif import changed, cluster_from_nodes, compare, history_jobs

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
