"""Finished check jobs past their retention leave the store (control/health_jobs.py `CheckJobs.prune`,
control/retention.py), on real SQLite and real PostgreSQL: with their attempts, events and logs, while the
newest of each node, young ones, running ones, ones a node's health view names and every other queue's
work stay, and the system queue's GPU-hours counter does not go down."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from gpupool.control import health_jobs, queues, workloads
from gpupool.control.errors import NotFound
from gpupool.control.health import HealthMonitor
from gpupool.control.health_jobs import CheckJobs, ensure_system_queue
from gpupool.control.health_state import NodeHealth
from gpupool.control.metrics import PoolCollector
from gpupool.control.telemetry import TelemetryCache
from gpupool.health.checks import verdict
from gpupool.health.thresholds import CheckJobRetention, HealthConfig
from gpupool.spec.queue import SYSTEM_QUEUE
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Event, RetiredUsage, Workload
from tests.support.postgres import database_url

NOW = time.time()
DAY = 86400.0


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = Store(database_url(request, tmp_path))
    queues.ensure_default_queue(s)
    ensure_system_queue(s)
    try:
        yield s
    finally:
        s.close()


def _at(days_ago: float) -> datetime:
    return datetime.fromtimestamp(NOW - days_ago * DAY, UTC)


def _job(
    store: Store,
    home: Path,
    node: str | None,
    finished_days_ago: float | None,
    *,
    queue: str = SYSTEM_QUEUE,
    gpus: int = 8,
) -> int:
    """A workload as the control loop leaves one: an attempt that held `gpus` GPUs of `node` for an hour
    (none if `node` is None), its events, its log and run directories under `home`; running if
    `finished_days_ago` is None."""
    state = "running" if finished_days_ago is None else "succeeded" if node else "cancelled"
    end = None if finished_days_ago is None else _at(finished_days_ago)
    with store.session() as s:
        w = Workload(
            name="health-quick-x", queue=queue, user="health", spec={}, state=state,
            created_at=_at((finished_days_ago or 0) + 0.1), finished_at=end, updated_at=end or _at(0),
        )  # fmt: skip
        s.add(w)
        s.flush()
        wid = w.id
        for to in ("running", state) if node else (state,):
            s.add(Event(object_kind="workload", object_id=str(wid), from_state="pending", to_state=to))
        if node is not None:
            log = home / "logs" / str(wid) / "attempt-0.log"
            run_dir = home / "runs" / str(wid) / "0"
            log.parent.mkdir(parents=True)
            log.write_text("# gpupool-bench-result {}\n")
            run_dir.mkdir(parents=True)
            (run_dir / "exit_code").write_text("0\n")
            started = (end or _at(0)) - timedelta(hours=1)
            pods = [{"node": node, "gpu_indices": list(range(gpus)), "gpu_fraction": 1.0}]
            s.add(
                Attempt(
                    workload_id=wid, queue=queue, number=0, state="running" if end is None else "succeeded",
                    node_name=node, gpu_indices=list(range(gpus)), pods=pods, started_at=started,
                    finished_at=end, log_path=str(log), run_dir=str(run_dir),
                )
            )  # fmt: skip
    return wid


def _ids(store: Store) -> set[int]:
    with store.read() as s:
        return set(s.scalars(select(Workload.id)))


def _system_gpu_hours(store: Store) -> float:
    collector = PoolCollector(store, TelemetryCache(), None, dict)
    return collector._hours().get(SYSTEM_QUEUE, 0.0)


def test_check_jobs_past_their_retention_leave_the_store_with_their_attempts_events_and_logs(
    store: Store, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    old_node1 = [_job(store, home, "node-1", 30 - i) for i in range(5)]  # finished 30 .. 26 days ago
    old_node2 = _job(store, home, "node-2", 20)  # its node's only one: kept, however old
    never_started = _job(store, home, None, 20)  # cancelled while pending: no node, no result
    young = _job(store, home, "node-1", 0.5)
    running = _job(store, home, "node-1", None)
    team = _job(store, home, "node-1", 40, queue="default")  # a team's job: never pruned here
    hours_before = _system_gpu_hours(store)
    assert hours_before > 6 * 8  # six finished hour-long jobs on 8 GPUs, and the running one

    jobs = CheckJobs(store)
    retention = CheckJobRetention(keep_per_node=2, max_age=7 * DAY)
    assert jobs.prune(NOW, retention) == 5

    # node-1 keeps its two newest finished jobs (the young one and the newest old one); the running one
    # is not finished; node-2's only job stays; the never-started one goes.
    gone = set(old_node1[:4]) | {never_started}
    kept = {old_node1[4], old_node2, young, running, team}
    assert _ids(store) == kept
    listed = workloads.list_workloads(store, include_finished=True, queue=SYSTEM_QUEUE)
    assert {row["id"] for row in listed} == kept - {team}
    for wid in gone:
        with pytest.raises(NotFound):
            workloads.get_workload(store, wid)
        assert not (home / "logs" / str(wid)).exists() and not (home / "runs" / str(wid)).exists()
    for wid in kept - {never_started}:
        assert (home / "logs" / str(wid) / "attempt-0.log").exists()
    with store.read() as s:
        assert set(s.scalars(select(Attempt.workload_id))) == kept
        assert {int(i) for i in s.scalars(select(Event.object_id))} == kept
        retired = s.get(RetiredUsage, SYSTEM_QUEUE)
        assert retired is not None and retired.workloads == 5
        assert retired.gpu_hours == pytest.approx(4 * 8.0)
    # The GPU-hours counter of the system queue counts the deleted jobs' hours still (it never goes down).
    assert _system_gpu_hours(store) == pytest.approx(hours_before, abs=0.05)

    assert jobs.prune(NOW + 1, retention) == 0  # once a minute at most
    assert jobs.prune(NOW + health_jobs.PRUNE_INTERVAL, retention) == 0  # nothing more is past retention


def test_a_check_job_a_nodes_health_view_names_is_kept_and_max_age_0_keeps_all(
    store: Store, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    named, newest = _job(store, home, "node-1", 10), _job(store, home, "node-1", 9)
    jobs = CheckJobs(store)
    assert jobs.prune(NOW, CheckJobRetention(keep_per_node=1, max_age=0)) == 0
    assert _ids(store) == {named, newest}

    monitor = HealthMonitor(
        store, TelemetryCache(), HealthConfig({}, check_jobs=CheckJobRetention(keep_per_node=1, max_age=DAY)),
        local_node="head", local_gpus=None, jobs=jobs,
    )  # fmt: skip
    # `gpupool node show node-1` names job `named` as its last active checks (a newer one was interrupted).
    monitor._nodes["node-1"] = NodeHealth(verdict([], []), NOW, active={"job": named}, active_at=NOW)
    monitor.tick(NOW + health_jobs.PRUNE_INTERVAL)
    assert _ids(store) == {named, newest}
    monitor._nodes.clear()
    monitor.tick(NOW + 2 * health_jobs.PRUNE_INTERVAL)
    assert _ids(store) == {newest}


def test_a_backlog_is_deleted_in_bounded_rounds_and_batches(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    backlog = [_job(store, home, "node-1", 30 + i / 10, gpus=1) for i in range(8)]
    monkeypatch.setattr(health_jobs, "PRUNE_LIMIT", 3)
    monkeypatch.setattr(health_jobs, "PRUNE_BATCH", 2)
    jobs = CheckJobs(store)
    retention = CheckJobRetention(keep_per_node=1, max_age=DAY)
    rounds = [jobs.prune(NOW + i * health_jobs.PRUNE_INTERVAL, retention) for i in range(4)]
    assert rounds == [3, 3, 1, 0]
    assert _ids(store) == {max(backlog)}  # the newest of the node
    with store.read() as s:
        retired = s.get(RetiredUsage, SYSTEM_QUEUE)
        assert retired is not None and retired.workloads == 7 and retired.gpu_hours == pytest.approx(7.0)


def test_the_newest_workload_is_never_deleted_so_sqlite_never_gives_its_id_again(
    store: Store, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    ran, never_started = _job(store, home, "node-1", 20), _job(store, home, None, 20)
    assert CheckJobs(store).prune(NOW, CheckJobRetention(keep_per_node=1, max_age=DAY)) == 0
    assert _ids(store) == {ran, never_started}


def test_a_finished_check_job_whose_attempt_is_not_settled_yet_is_not_deleted(
    store: Store, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    unsettled, newest = _job(store, home, "node-1", 20), _job(store, home, "node-1", 19)
    with store.session() as s:  # the workload ended, its attempt's end not yet recorded
        s.execute(update(Attempt).where(Attempt.workload_id == unsettled).values(state="running"))
    jobs = CheckJobs(store)
    assert jobs.prune(NOW, CheckJobRetention(keep_per_node=1, max_age=DAY)) == 0
    assert _ids(store) == {unsettled, newest}
    assert (home / "logs" / str(unsettled) / "attempt-0.log").exists()
