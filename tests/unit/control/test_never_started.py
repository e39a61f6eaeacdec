"""An attempt the store records as running but that was never launched (the head died between writing
it down and starting its process) is requeued without using a restart, and costs nothing; launches that
keep vanishing fail the workload after a few, and a run dir with an exit code says it ran after all."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from gpupool.backends.local import LocalBackend
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.control.observe import PID_GRACE
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Event, Workload
from gpupool.timeutil import utcnow
from tests.support.store import submit_running

NODE = "head"


def _reconciler(store: Store, home: Path) -> Reconciler:
    return Reconciler(store, LocalBackend(), None, ControlSettings(home=home, node_name=NODE))


def _unlaunched(store: Store, home: Path, wid: int, *, age: float = PID_GRACE + 5) -> Path:
    """Record attempt N of `wid` as the head does just before launching it, `age` seconds ago."""
    with store.session() as s:
        workload = s.get(Workload, wid)
        assert workload is not None
        number = len(workload.attempts)
        run_dir = home / "runs" / str(wid) / str(number)
        run_dir.mkdir(parents=True)
        if workload.state != "running":
            workload.state = "running"
        s.add(
            Attempt(
                workload_id=wid, queue=workload.queue, number=number, state="running", node_name=NODE,
                gpu_indices=[0], run_dir=str(run_dir), started_at=utcnow() - timedelta(seconds=age),
            )
        )  # fmt: skip
    return run_dir


def _first(store: Store, tmp_path: Path, spec: dict[str, object] | None = None) -> int:
    wid = submit_running(
        store,
        spec or {"commands": ["true"], "resources": {"gpu": 1}},
        node=NODE,
        gpu_indices=[0],
        run_dir=str(tmp_path / "runs" / "1" / "0"),
        started_at=utcnow() - timedelta(seconds=PID_GRACE + 5),
    )
    (tmp_path / "runs" / "1" / "0").mkdir(parents=True)
    return wid


def _state(store: Store, wid: int) -> tuple[str, int, list[tuple[str, str]]]:
    with store.read() as s:
        workload = s.get(Workload, wid)
        assert workload is not None
        attempts = s.scalars(select(Attempt).where(Attempt.workload_id == wid).order_by(Attempt.number))
        return workload.state, workload.restarts, [(a.state, a.reason or "") for a in attempts]


def test_an_attempt_that_never_started_is_requeued_without_using_a_restart(
    tmp_path: Path, store: Store
) -> None:
    wid = _first(store, tmp_path)
    reconciler = _reconciler(store, tmp_path)
    reconciler.observe(time.time())

    state, restarts, attempts = _state(store, wid)
    assert state == "pending" and restarts == 0
    assert attempts == [("evicted", f"never started: no process after {PID_GRACE:g}s; requeued")]
    with store.read() as s:
        attempt = s.scalar(select(Attempt).where(Attempt.workload_id == wid))
        assert attempt is not None and attempt.finished_at == attempt.started_at  # it held GPUs for no time
        said = s.scalars(select(Event.reason).where(Event.object_id == str(wid))).all()
    assert (
        said[-1] == "attempt 0 never started (the head stopped while starting it?); requeued, no restart used"
    )


def test_a_young_pidless_attempt_is_left_to_its_launch(tmp_path: Path, store: Store) -> None:
    wid = _first(store, tmp_path)
    with store.session() as s:  # started a moment ago: its launch may still be under way
        attempt = s.scalar(select(Attempt).where(Attempt.workload_id == wid))
        assert attempt is not None
        attempt.started_at = utcnow()
    _reconciler(store, tmp_path).observe(time.time())
    assert _state(store, wid)[0] == "running"


def test_launches_that_keep_vanishing_fail_the_workload_after_three(tmp_path: Path, store: Store) -> None:
    wid = _first(store, tmp_path)
    reconciler = _reconciler(store, tmp_path)
    reconciler.observe(time.time())
    _unlaunched(store, tmp_path, wid)
    reconciler.observe(time.time())
    assert _state(store, wid)[0] == "pending"
    _unlaunched(store, tmp_path, wid)
    reconciler.observe(time.time())

    state, restarts, attempts = _state(store, wid)
    assert state == "failed" and restarts == 0
    assert [a for a, _ in attempts] == ["evicted", "evicted", "failed"]
    with store.read() as s:
        workload = s.get(Workload, wid)
        assert workload is not None
        assert workload.reason == "lost: the attempt never started (3 attempts in a row)"


def test_an_attempt_whose_run_dir_holds_an_exit_code_ran_and_is_settled_by_it(
    tmp_path: Path, store: Store
) -> None:
    wid = _first(store, tmp_path)
    (tmp_path / "runs" / "1" / "0" / "exit_code").write_text("3\n")
    _reconciler(store, tmp_path).observe(time.time())
    state, _, attempts = _state(store, wid)
    assert state == "failed" and attempts == [("failed", "exit code 3")]


def test_a_cancelled_workload_whose_attempt_never_started_is_cancelled(tmp_path: Path, store: Store) -> None:
    wid = _first(store, tmp_path)
    with store.session() as s:
        workload = s.get(Workload, wid)
        assert workload is not None
        workload.cancel_requested = True
    _reconciler(store, tmp_path).observe(time.time())
    state, _, attempts = _state(store, wid)
    assert state == "cancelled" and attempts == [("cancelled", "never started: cancelled")]
