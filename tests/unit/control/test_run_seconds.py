"""A workload's `run_seconds`: how long its attempts held their GPUs, added up, without the time it waited
between them (what `gpupool sim whatif` replays it for)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from gpupool.control import workloads
from gpupool.store.db import Store
from gpupool.store.models import Attempt
from gpupool.timeutil import utcnow
from tests.support.store import submit_running


def test_run_seconds_adds_up_the_attempts_and_leaves_out_the_wait_between_them(store: Store) -> None:
    now = utcnow()
    wid = submit_running(store, {"commands": ["train"], "resources": {"gpu": 1}})
    with store.session() as s:  # ran 20 minutes, preempted, pending for an hour, running for the last 40
        first = s.scalar(select(Attempt).where(Attempt.workload_id == wid))
        assert first is not None
        first.state, first.started_at = "evicted", now - timedelta(hours=2)
        first.finished_at = now - timedelta(hours=1, minutes=40)
        s.add(Attempt(workload_id=wid, queue="default", number=1, state="running", node_name="node-1",
                      started_at=now - timedelta(minutes=40)))  # fmt: skip
    view = workloads.get_workload(store, wid)
    assert abs(view["run_seconds"] - 3600.0) < 5.0, view["run_seconds"]  # 20 + 40 minutes, not 120
    (listed,) = workloads.list_workloads(store, ids=[wid])
    assert abs(listed["run_seconds"] - 3600.0) < 5.0, listed["run_seconds"]


def test_work_seconds_leaves_out_an_evicted_attempt_whose_work_was_redone(store: Store) -> None:
    """Without a checkpoint the attempt after an eviction starts over: the 20 minutes before it are done
    again, and `work_seconds` (what `sim whatif` replays the job for) counts them once. With a checkpoint
    the next attempt resumes: they are part of the work."""
    now = utcnow()
    plain = submit_running(store, {"commands": ["train"], "resources": {"gpu": 1}})
    resuming = submit_running(
        store, {"commands": ["train"], "resources": {"gpu": 1}, "checkpoint": {"dir": "./ckpt"}}
    )
    for wid in (plain, resuming):
        with store.session() as s:  # ran 20 minutes, preempted, then ran 40 minutes and succeeded
            first = s.scalar(select(Attempt).where(Attempt.workload_id == wid))
            assert first is not None
            first.state, first.started_at = "evicted", now - timedelta(hours=2)
            first.finished_at = now - timedelta(hours=1, minutes=40)
            s.add(Attempt(workload_id=wid, queue="default", number=1, state="succeeded", node_name="node-1",
                          started_at=now - timedelta(minutes=50),
                          finished_at=now - timedelta(minutes=10)))  # fmt: skip
    views = {w["id"]: w for w in workloads.list_workloads(store, ids=[plain, resuming])}
    assert abs(views[plain]["run_seconds"] - 3600.0) < 5.0
    assert abs(views[plain]["work_seconds"] - 2400.0) < 5.0  # the 40 minutes of the attempt that finished
    assert abs(views[resuming]["work_seconds"] - 3600.0) < 5.0  # it resumed: all 60 minutes are work
