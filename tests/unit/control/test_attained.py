"""The control loop gives a queue that orders by least attained service (`ordering: las`, the default
policy's) each pending workload's GPU-seconds from its earlier attempts, read from the store
(control/usage.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpupool.backends.agent import AgentBackend
from gpupool.control import queues, submission
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.scheduler import SchedulerConfig, Snapshot
from gpupool.spec import parse_queue_spec, parse_workload_spec
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Workload

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'gpupool.db'}")
    queues.ensure_default_queue(store)
    queues.create_queue(store, parse_queue_spec({"name": "research", "ordering": "las"}))
    yield store
    store.close()


def _submit(store: Store, queue: str) -> int:
    spec = parse_workload_spec({"commands": ["sleep 60"], "queue": queue, "resources": {"gpu": 2}})
    return int(submission.submit(store, spec)["id"])


def _ended_attempt(store: Store, workload_id: int, pods: list[dict[str, object]], seconds: float) -> None:
    with store.session() as s:
        workload = s.get(Workload, workload_id)
        assert workload is not None
        number = len(workload.attempts) + 1
        s.add(
            Attempt(
                workload_id=workload_id, queue=workload.queue, number=number, state="preempted",
                node_name=str(pods[0]["node"]),
                gpu_indices=pods[0]["gpu_indices"], gpu_fraction=1.0, pods=pods,
                started_at=T0, finished_at=T0 + timedelta(seconds=seconds),
            )
        )  # fmt: skip


def _set_state(store: Store, workload_id: int, state: str) -> None:
    with store.session() as s:
        workload = s.get(Workload, workload_id)
        assert workload is not None
        workload.state = state


def _reconciler(store: Store, home: Path, policy: SchedulerConfig | None = None) -> Reconciler:
    settings = ControlSettings(home=home, node_name="head", policy=policy)
    return Reconciler(store, AgentBackend(lease=10.0), None, settings)


def _snapshot(reconciler: Reconciler, store: Store) -> Snapshot:
    with store.read() as s:
        return reconciler._snapshot(s)


def _attained(snapshot: Snapshot) -> dict[int, float]:
    return {w.id: w.attained_service for w in snapshot.pending}


def test_pending_work_carries_the_gpu_seconds_of_its_earlier_attempts(tmp_path: Path, store: Store) -> None:
    reconciler = _reconciler(store, tmp_path)
    ran, fresh, other = _submit(store, "research"), _submit(store, "research"), _submit(store, "default")
    # Two pods of 2 GPUs for 100 s, then one pod of 1 GPU for 30 s: 400 + 30 GPU-seconds.
    two_pods: list[dict[str, object]] = [
        {"node": "a", "gpu_indices": [0, 1]},
        {"node": "b", "gpu_indices": [0, 1]},
    ]
    _ended_attempt(store, ran, two_pods, 100)
    _ended_attempt(store, ran, [{"node": "a", "gpu_indices": [3]}], 30)
    _ended_attempt(store, other, [{"node": "a", "gpu_indices": [0]}], 50)
    first = _snapshot(reconciler, store)
    assert _attained(first)[ran] == pytest.approx(430.0)
    assert _attained(first)[fresh] == 0.0
    assert _attained(first)[other] == pytest.approx(50.0)  # read for every pending workload
    assert _snapshot(reconciler, store) == first  # unchanged: the scheduler can answer from memory

    # It runs again and is preempted again: pending once more, with one more attempt counted.
    _set_state(store, ran, "running")
    assert ran not in _attained(_snapshot(reconciler, store))
    _ended_attempt(store, ran, [{"node": "b", "gpu_indices": [5]}], 70)
    _set_state(store, ran, "pending")
    assert _attained(_snapshot(reconciler, store))[ran] == pytest.approx(500.0)


def test_nothing_is_read_while_nothing_orders_or_weighs_by_attained_service(
    tmp_path: Path, store: Store
) -> None:
    queues.update_queue(store, "research", lambda spec: parse_queue_spec({**spec, "ordering": "fifo"}))
    reconciler = _reconciler(store, tmp_path, SchedulerConfig())  # fifo, no bands, no young-work weights
    ran = _submit(store, "research")
    _ended_attempt(store, ran, [{"node": "a", "gpu_indices": [0]}], 100)
    assert _attained(_snapshot(reconciler, store))[ran] == 0.0
