"""A stop is on record before the work hears of it: the SIGTERM of an eviction or a cancel goes out once the
stop is committed, so a head that dies in between finds the stop at its restart and sends it again, instead
of taking work that ended with 143 for work that failed on its own (a preempted job failed, not requeued).
Real processes (the local backend), a real store."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from gpupool.backends.base import Handle, Launch
from gpupool.backends.local import LocalBackend
from gpupool.control import changes
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.scheduler import Eviction
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Workload
from gpupool.timeutil import utcnow
from tests.support.store import submit_running

NODE = "head"


class Recording(LocalBackend):
    """The local backend, noting for each signal whether the attempt's stop was committed when it went out
    (read from the store in a session of its own, as another head would see it)."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.seen: list[tuple[int, bool]] = []

    def signal(self, handle: Handle, signum: int) -> None:
        with self.store.read() as s:
            committed = s.scalar(select(Attempt.stop_requested_at).where(Attempt.pid == handle.pid))
        self.seen.append((signum, committed is not None))
        super().signal(handle, signum)


def _running(
    store: Store, backend: LocalBackend, tmp_path: Path, spec: dict[str, object], script: str = "sleep 60"
) -> tuple[int, Handle]:
    """A workload running `script` as a real process, recorded as the head records it."""
    run_dir = tmp_path / "run"
    handle = backend.start(
        Launch(
            attempt_id=1, workload_id=1, attempt_number=0, script=script + "\n", env=dict(os.environ),
            workdir=tmp_path, run_dir=run_dir, log_path=tmp_path / "attempt.log",
        )
    )  # fmt: skip
    wid = submit_running(
        store, {"commands": ["sleep 60"], "resources": {"gpu": 1}, **spec}, node=NODE, gpu_indices=[0],
        run_dir=str(run_dir), pid=handle.pid, pid_start_time=handle.start_time, pid_boot_id=handle.boot,
    )  # fmt: skip
    return wid, handle


def _exit_code(backend: LocalBackend, handle: Handle, run_dir: Path) -> int | None:
    deadline = time.time() + 10
    while (state := backend.status(handle, run_dir)).exit_code is None:
        assert time.time() < deadline, f"the attempt did not end: {state}"
        time.sleep(0.05)
    return state.exit_code


def test_an_evictions_sigterm_goes_out_once_the_eviction_is_committed(tmp_path: Path, store: Store) -> None:
    backend = Recording(store)
    wid, handle = _running(store, backend, tmp_path, {})
    reconciler = Reconciler(store, backend, None, ControlSettings(home=tmp_path, node_name=NODE))
    reconciler._evict([Eviction(wid, "preempt", "preempted by workload 2")])
    assert backend.seen == [(signal.SIGTERM, True)]
    assert _exit_code(backend, handle, tmp_path / "run") == 143


def test_a_cancels_sigterm_and_the_grace_periods_sigkill_go_out_once_committed(
    tmp_path: Path, store: Store
) -> None:
    backend = Recording(store)
    # a job that ignores SIGTERM (its children too), so that the grace period's SIGKILL is needed
    wid, handle = _running(store, backend, tmp_path, {"grace_period": 0}, script="trap '' TERM; sleep 60")
    changes.cancel(store, wid)
    reconciler = Reconciler(store, backend, None, ControlSettings(home=tmp_path, node_name=NODE))
    reconciler.observe(time.time())
    assert backend.seen == [(signal.SIGTERM, True)]
    time.sleep(0.2)
    assert backend.status(handle, tmp_path / "run").exit_code is None, "it ignores SIGTERM"
    reconciler.observe(time.time())
    assert backend.seen == [(signal.SIGTERM, True), (signal.SIGKILL, True)]
    assert _exit_code(backend, handle, tmp_path / "run") == 137
    reconciler.observe(time.time())
    with store.read() as s:
        workload = s.get(Workload, wid)
        assert workload is not None and workload.state == "cancelled"


def test_a_restarted_head_sends_a_recorded_stop_again(tmp_path: Path, store: Store) -> None:
    """The head died after recording the eviction and before its SIGTERM: the next head sends it."""
    first = LocalBackend()
    wid, handle = _running(store, first, tmp_path, {})
    with store.session() as s:
        attempt = s.scalar(select(Attempt).where(Attempt.workload_id == wid))
        assert attempt is not None
        attempt.stop_requested_at, attempt.stop_reason = utcnow() - timedelta(seconds=1), "preempt"
        attempt.reason = "preempted by workload 2"
    backend = Recording(store)  # a new head: it never started the attempt
    Reconciler(store, backend, None, ControlSettings(home=tmp_path, node_name=NODE)).recover()
    assert backend.seen == [(signal.SIGTERM, True)]
    assert _exit_code(backend, handle, tmp_path / "run") == 143
    reconciler = Reconciler(store, backend, None, ControlSettings(home=tmp_path, node_name=NODE))
    reconciler.observe(time.time())
    with store.read() as s:
        workload = s.get(Workload, wid)
        assert workload is not None
        assert workload.state == "pending", "a preempted job is requeued, not failed with code 143"


def test_requeued_work_is_told_whether_it_resumes_from_a_checkpoint(tmp_path: Path, store: Store) -> None:
    """A hold says "it resumes from its checkpoint" only of work whose spec declares one: of work that
    declares none it says that it starts over (unless its program saved one where the contract says)."""
    said = {}
    for name, spec in (("plain", {}), ("declared", {"checkpoint": {"dir": "./ckpt"}})):
        backend = LocalBackend()
        (tmp_path / name).mkdir()
        wid, handle = _running(store, backend, tmp_path / name, spec)
        changes.hold(store, wid)
        reconciler = Reconciler(store, backend, None, ControlSettings(home=tmp_path, node_name=NODE))
        reconciler.observe(time.time())
        assert _exit_code(backend, handle, tmp_path / name / "run") == 143
        reconciler.observe(time.time())
        with store.read() as s:
            workload = s.get(Workload, wid)
            assert workload is not None and workload.state == "pending"
            said[name] = workload.reason
    assert said["plain"].endswith("(it starts over, unless it saved a checkpoint in $GPUPOOL_CHECKPOINT_DIR)")
    assert said["declared"].endswith("(it resumes from its checkpoint)"), said["declared"]
