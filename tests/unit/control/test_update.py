"""`gpupool update` changes what the next pass schedules by: the control loop keeps each workload's view
from pass to pass, and must see a new queue or time limit of pending and running work (the scheduler
orders, limits and backfills by them)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from gpupool.backends.agent import AgentBackend
from gpupool.control import service
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.scheduler import WorkloadView
from gpupool.spec import parse_queue_spec, parse_workload_spec
from gpupool.store.db import Store
from tests.support.store import run_attempt

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _views(reconciler: Reconciler, store: Store) -> dict[int, WorkloadView]:
    with store.read() as s:
        snapshot = reconciler._snapshot(s, T0.timestamp())
    return {w.id: w for w in (*snapshot.pending, *snapshot.running)}


def test_the_next_pass_sees_a_new_queue_and_time_limit(store: Store, tmp_path: Path) -> None:
    service.create_queue(store, parse_queue_spec({"name": "nlp"}))
    waiting, running = (
        int(service.submit(store, parse_workload_spec({"commands": ["x"], "max_duration": "1h"}))["id"])
        for _ in range(2)
    )
    run_attempt(store, running, "a", [0], T0)
    reconciler = Reconciler(
        store, AgentBackend(lease=10.0), None, ControlSettings(home=tmp_path, node_name="h")
    )
    views = _views(reconciler, store)
    assert (views[waiting].queue, views[waiting].max_duration) == ("default", 3600.0)
    assert views[running].max_duration == 3600.0

    service.update(store, waiting, queue="nlp", limit=service.TimeLimit(7200.0))
    service.update(store, running, limit=service.TimeLimit(None))
    views = _views(reconciler, store)  # the same reconciler: its cached views
    assert (views[waiting].queue, views[waiting].max_duration) == ("nlp", 7200.0)
    assert views[running].max_duration is None and views[running].queue == "default"
