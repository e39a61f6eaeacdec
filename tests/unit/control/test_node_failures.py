"""A job whose node is lost goes back to pending, as after a preemption, without using a restart: up to
`retry.max_node_failures` times (5 by default, Slurm's MaxBatchRequeue), then as its `max_restarts` say."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from gpupool.backends.agent import AgentBackend
from gpupool.backends.base import BackendUnavailable, Handle, Launch
from gpupool.control import carry_out, submission
from gpupool.control.loop import Reconciler
from gpupool.spec import parse_workload_spec
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Event, Workload
from tests.support.agent import in_process_head
from tests.support.process import Clock

LEASE = 10.0
NODES = ("a", "b", "c")


def _submit(store: Store, **spec: object) -> int:
    created = submission.submit(
        store, parse_workload_spec({"commands": ["sleep 600"], "resources": {"gpu": 1}, **spec})
    )
    return int(created["id"])


def _running_on(store: Store, workload_id: int) -> str:
    with store.read() as s:
        attempt = s.scalars(
            select(Attempt).where(Attempt.workload_id == workload_id).order_by(Attempt.number.desc())
        ).first()
        assert attempt is not None and attempt.state == "running", attempt
        return attempt.node_name


def _lose(reconciler: Reconciler, backend: AgentBackend, clock: Clock, node: str, alive: set[str]) -> None:
    """`node` falls silent past its lease while `alive` keep heartbeating; two passes see it and requeue."""
    clock.now += LEASE + 1
    for name in alive:
        backend.heartbeat(name, {"attempts": []})
    reconciler.tick()
    reconciler.tick()


def _workload(store: Store, workload_id: int) -> Workload:
    with store.read() as s:
        workload = s.get(Workload, workload_id)
        assert workload is not None
        s.expunge(workload)
        return workload


def _said(store: Store, workload_id: int) -> list[str]:
    with store.read() as s:
        return list(
            s.scalars(select(Event.reason).where(Event.object_id == str(workload_id)).order_by(Event.id))
        )


def test_a_job_whose_node_is_lost_runs_again_elsewhere_by_default(store: Store, tmp_path: Path) -> None:
    clock = Clock()
    reconciler, backend = in_process_head(store, tmp_path, clock, LEASE, NODES)
    reconciler.tick()
    job = _submit(store)  # no retry policy: the default's
    reconciler.tick()
    first = _running_on(store, job)

    _lose(reconciler, backend, clock, first, set(NODES) - {first})

    second = _running_on(store, job)
    assert second != first
    workload = _workload(store, job)
    assert (workload.state, workload.restarts, workload.node_failures) == ("running", 0, 1)
    requeued = [r for r in _said(store, job) if "requeued after node failure" in r]
    assert len(requeued) == 1, _said(store, job)
    assert requeued[0].startswith(f"lost: node-lost: rank 0's node {first} sent no heartbeat"), requeued
    assert "requeued after node failure 1 of 5 (it starts over" in requeued[0], requeued


def test_node_failures_past_the_limit_use_restarts_then_fail(store: Store, tmp_path: Path) -> None:
    clock = Clock()
    reconciler, backend = in_process_head(store, tmp_path, clock, LEASE, NODES)
    reconciler.tick()
    job = _submit(store, retry={"max_node_failures": 1, "max_restarts": 1})
    reconciler.tick()
    alive = set(NODES)
    for _ in range(2):  # the first loss is a node failure, the second uses the restart
        node = _running_on(store, job)
        alive.discard(node)
        _lose(reconciler, backend, clock, node, alive)
    assert (_workload(store, job).node_failures, _workload(store, job).restarts) == (1, 1)

    (last,) = alive
    _lose(reconciler, backend, clock, _running_on(store, job), set())
    workload = _workload(store, job)
    assert workload.state == "failed", workload.reason
    assert workload.reason.startswith(f"lost: node-lost: rank 0's node {last}"), workload.reason


def test_a_job_that_leaves_node_failure_out_of_its_retry_fails_with_its_node(
    store: Store, tmp_path: Path
) -> None:
    """`retry: {on: [failure]}` says what to retry: a lost node is not in it (Slurm's --no-requeue)."""
    clock = Clock()
    reconciler, backend = in_process_head(store, tmp_path, clock, LEASE, NODES)
    reconciler.tick()
    job = _submit(store, retry={"on": ["failure"], "max_restarts": 3})
    reconciler.tick()
    node = _running_on(store, job)
    _lose(reconciler, backend, clock, node, set(NODES) - {node})
    workload = _workload(store, job)
    assert (workload.state, workload.restarts, workload.node_failures) == ("failed", 0, 0), workload.reason


def test_a_backend_that_cannot_take_work_leaves_it_pending_at_no_cost(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm's controller unreachable is no node failure: the work waits pending, uses no restart and no
    node failure, is charged nothing, says why, and starts once the backend answers."""
    monkeypatch.setattr(carry_out, "BACKEND_RETRY", 0.3)
    clock = Clock()
    reconciler, backend = in_process_head(store, tmp_path, clock, LEASE, NODES)
    reconciler.tick()
    start = backend.start
    refusals = []

    def unreachable(launch: Launch) -> Handle:
        if not refusals:
            refusals.append(launch.attempt_id)
            raise BackendUnavailable("sbatch: error: Unable to contact slurm controller (connect failure)")
        return start(launch)

    monkeypatch.setattr(backend, "start", unreachable)
    job = _submit(store)
    other = _submit(store)
    reconciler.tick()  # the first start fails: the second bind of the pass is not tried
    with store.read() as s:
        (attempt,) = s.scalars(select(Attempt).where(Attempt.workload_id == job)).all()
        assert attempt.state == "evicted" and attempt.finished_at == attempt.started_at, attempt.reason
        assert "could not take it (sbatch: error: Unable to contact slurm controller" in attempt.reason
        assert s.scalars(select(Attempt).where(Attempt.workload_id == other)).all() == []
    workload = _workload(store, job)
    assert (workload.state, workload.restarts, workload.node_failures) == ("pending", 0, 0)
    reconciler.tick()  # within the wait: nothing starts, and both say why
    for wid in (job, other):
        why = reconciler.explanations[wid]
        assert why.code == "backend-unavailable" and "the agent backend could not take work" in why.message
    time.sleep(0.35)
    reconciler.tick()
    assert _workload(store, job).state == "running" and _workload(store, other).state == "running"
