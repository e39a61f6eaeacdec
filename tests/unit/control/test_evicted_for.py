"""An eviction's gainer is remembered on the stopping attempt (`stop_for_workload`) and reaches the
scheduler as the running view's `evicted_for`, so that the next passes serve that workload first while
the victim stops (docs/scheduler.md)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from gpupool.backends.agent import AgentBackend
from gpupool.control import service
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.scheduler import Eviction
from gpupool.spec import parse_workload_spec
from gpupool.store.db import Store
from gpupool.store.models import Attempt
from gpupool.timeutil import utcnow
from tests.support.store import run_attempt


def _submit(store: Store) -> int:
    spec = parse_workload_spec({"commands": ["sleep 60"], "resources": {"gpu": 1}})
    return int(service.submit(store, spec)["id"])


def test_a_stopping_attempt_tells_the_scheduler_which_workload_it_was_evicted_for(
    tmp_path: Path, store: Store
) -> None:
    victim, drained, gainer = _submit(store), _submit(store), _submit(store)
    run_attempt(store, victim, "n1", [0])
    run_attempt(store, drained, "n1", [1])
    reconciler = Reconciler(store, AgentBackend(lease=10.0), None, ControlSettings(home=tmp_path))
    with store.read() as s:
        before = {w.id: w for w in reconciler._snapshot(s, 0.0).running}
    assert not before[victim].stopping and before[victim].evicted_for is None

    reconciler._evict([Eviction(victim, "preempt", "preempted by workload 3", for_workload=gainer)])
    with store.session() as s:  # stopping too, as the health checks' drain stops it: for no one
        attempt = s.scalar(select(Attempt).where(Attempt.workload_id == drained))
        assert attempt is not None
        attempt.stop_requested_at, attempt.stop_reason = utcnow(), "drain"
    with store.read() as s:
        snapshot = reconciler._snapshot(s, 0.0)
    running = {w.id: w for w in snapshot.running}
    assert running[victim].stopping and running[victim].evicted_for == gainer
    assert [w.id for w in snapshot.pending] == [gainer]
    assert running[drained].stopping and running[drained].evicted_for is None
