"""An eviction's gainer is remembered on the stopping attempt (`stop_for_workload`) and reaches the
scheduler as the running view's `evicted_for`, so that the next passes serve that workload first while
the victim stops (docs/scheduler.md). So is the workload that the GPUs of work stopping for no one
(cancelled, drained) were promised to (`Decisions.released_to`)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from gpupool.backends.agent import AgentBackend
from gpupool.control import agents, changes, submission
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.scheduler import Eviction
from gpupool.spec import parse_workload_spec
from gpupool.store.db import Store
from gpupool.store.models import Attempt
from gpupool.timeutil import utcnow
from tests.support.agent import described
from tests.support.process import Clock
from tests.support.store import run_attempt


def _submit(store: Store, gpus: int = 1) -> int:
    spec = parse_workload_spec({"commands": ["sleep 60"], "resources": {"gpu": gpus}})
    return int(submission.submit(store, spec)["id"])


def _one_agent_node(tmp_path: Path, store: Store) -> Reconciler:
    """A head whose pool is one agent node "a" with two GPUs (no agent process: the agent backend only
    records what it is sent)."""
    backend = AgentBackend(lease=60.0, clock=Clock())
    token = str(agents.create_join_token(store, 3600)["token"])
    joining = described(backend, "a", {"cpus": 8, "memory_bytes": 1 << 34, "gpus": [["H100", 2]]})
    agents.register(store, "a", join_token=token, credential=None, described=joining)
    return Reconciler(store, backend, None, ControlSettings(home=tmp_path, node_name="head"))


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


def test_the_gpus_of_cancelled_work_are_promised_to_the_workload_waiting_for_them(
    tmp_path: Path, store: Store
) -> None:
    reconciler = _one_agent_node(tmp_path, store)
    cancelled = _submit(store, gpus=2)
    reconciler.tick()
    changes.cancel(store, cancelled)  # it stops; its GPUs are held until the agent reports it gone
    waiting = _submit(store, gpus=2)
    reconciler.tick()

    with store.read() as s:
        attempt = s.scalar(select(Attempt).where(Attempt.workload_id == cancelled))
        assert attempt is not None and attempt.stop_requested_at is not None
        assert attempt.stop_for_workload == waiting
        running = {w.id: w for w in reconciler._snapshot(s, 0.0).running}
    assert running[cancelled].stopping and running[cancelled].evicted_for == waiting
    reconciler.tick()  # what `gpupool why` shows (the API reads the loop's latest explanations)
    told = reconciler.explanations[waiting].message
    assert told == f"waiting for 2 GPUs being released by stopping work (workload {cancelled} stops for it)"


def test_the_pass_after_a_victim_stopped_gives_its_gainer_the_room_first(
    tmp_path: Path, store: Store
) -> None:
    victim, gainer = _submit(store), _submit(store)
    run_attempt(store, victim, "n1", [0])
    reconciler = Reconciler(store, AgentBackend(lease=10.0), None, ControlSettings(home=tmp_path))
    reconciler._evict([Eviction(victim, "preempt", "preempted by workload 2", for_workload=gainer)])
    reconciler.schedule(0.0)  # it sees the victim stopping for the gainer

    def pending() -> dict[int, bool]:
        with store.read() as s:
            return {w.id: w.victims_stopped for w in reconciler._pass_snapshot(s, 0.0).pending}

    assert pending() == {gainer: False}  # its victim still stops: it is served first as its gainer
    with store.session() as s:  # the victim has stopped, as observe() records it: requeued
        attempt = s.scalar(select(Attempt).where(Attempt.workload_id == victim))
        assert attempt is not None
        attempt.state, attempt.finished_at = "evicted", utcnow()
        attempt.workload.state = "pending"
    assert pending() == {victim: False, gainer: True}  # the GPUs just released are the gainer's room
    reconciler.schedule(0.0)
    assert pending() == {victim: False, gainer: False}  # for that one pass only


def test_a_gainer_is_given_the_room_its_eviction_was_decided_for(tmp_path: Path, store: Store) -> None:
    # A 1-GPU victim runs on one of the node's two GPUs, and a 2-GPU workload waits for it to stop.
    reconciler = _one_agent_node(tmp_path, store)
    victim = _submit(store, gpus=1)
    reconciler.tick()
    gainer = _submit(store, gpus=2)
    reconciler._evict([Eviction(victim, "preempt", f"preempted by workload {gainer}", for_workload=gainer)])
    reconciler.schedule(0.0)  # the victim stops for it: it waits, its room named
    room = reconciler._nominated[gainer]
    assert [(pod.node, pod.gpu_indices) for pod in room] == [("a", (0, 1))]
    assert reconciler.explanations[gainer].code == "waiting-for-release"

    with store.session() as s:  # the victim has stopped, as observe() records it: requeued
        attempt = s.scalar(select(Attempt).where(Attempt.workload_id == victim))
        assert attempt is not None
        attempt.state, attempt.finished_at = "evicted", utcnow()
        attempt.workload.state = "pending"
    with store.read() as s:
        assert reconciler._pass_snapshot(s, 0.0).nominated == {gainer: room}
    reconciler.schedule(0.0)
    with store.read() as s:
        started = s.scalar(select(Attempt).where(Attempt.workload_id == gainer))
        assert started is not None and (started.node_name, started.gpu_indices) == ("a", [0, 1])
