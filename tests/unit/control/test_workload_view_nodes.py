"""A workload's view names every node its work runs on (`node_list`, Slurm's NodeList): a gang's each
rank's node, and, once the work has ended, where its last attempt ran; `node` stays rank 0's while it runs."""

from __future__ import annotations

from sqlalchemy import select

from gpupool.control import workloads
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Workload
from tests.support.store import submit_running

GANG = {"commands": ["train"], "resources": {"gpu": 4}, "nodes": 2}
PODS = [{"node": "node-1", "gpu_indices": [0, 1, 2, 3]}, {"node": "node-2", "gpu_indices": [4, 5, 6, 7]}]


def _view(store: Store, wid: int) -> dict[str, object]:
    (listed,) = workloads.list_workloads(store, ids=[wid], include_finished=True)
    shown = workloads.get_workload(store, wid)  # `gpupool show`'s: the same
    assert (shown["node"], shown["node_list"]) == (listed["node"], listed["node_list"])
    return listed


def test_a_running_gang_lists_the_node_of_each_rank(store: Store) -> None:
    wid = submit_running(store, GANG, gpu_indices=[0, 1, 2, 3], pods=PODS)
    view = _view(store, wid)
    assert view["node"] == "node-1" and view["gpu_indices"] == [0, 1, 2, 3]  # as before: rank 0's
    assert view["node_list"] == ["node-1", "node-2"]


def test_finished_work_lists_where_its_last_attempt_ran_and_waiting_work_none(store: Store) -> None:
    wid = submit_running(store, GANG, gpu_indices=[0, 1, 2, 3], pods=PODS)
    single = submit_running(store, {"commands": ["eval"], "resources": {"gpu": 1}}, node="node-3")  # no ranks
    with store.session() as s:
        for workload in s.scalars(select(Workload).where(Workload.id.in_([wid, single]))):
            workload.state = "succeeded"
        for attempt in s.scalars(select(Attempt)):
            attempt.state = "succeeded"
    assert _view(store, wid)["node"] is None and _view(store, wid)["node_list"] == ["node-1", "node-2"]
    assert _view(store, single)["node_list"] == ["node-3"]
    with store.session() as s:  # requeued: waiting again, its earlier attempt named nowhere
        workload = s.get(Workload, wid)
        assert workload is not None
        workload.state = "pending"
    assert _view(store, wid)["node_list"] == []
