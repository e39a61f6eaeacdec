"""Check jobs (control/health_jobs.py): what they ask for, that the control loop starts them only on a node
with nothing running, that the scheduler neither places nor evicts them, and what a stopped head leaves."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from gpupool import scheduler
from gpupool.control.errors import Conflict
from gpupool.control.health import RECHECKING, HealthMonitor
from gpupool.control.health_jobs import CheckInterrupted, CheckJobs, job_spec
from gpupool.control.telemetry import TelemetryCache
from gpupool.health import checks
from gpupool.health.thresholds import HealthConfig, Schedule
from gpupool.spec import WorkloadSpec
from gpupool.spec.queue import SYSTEM_QUEUE
from gpupool.spec.views import queue_view
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Event, Gpu, Node, Queue, Workload
from gpupool.timeutil import utcnow


def _store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path}/gpupool.db")
    with store.session() as s:
        for name in ("node-1", "node-2"):
            node = Node(name=name, state="ready", state_reason="", labels={}, backend="local")
            node.gpus = [
                Gpu(index=i, uuid=f"GPU-{name}-{i}", model="H100", product_name="H100", memory_bytes=80 << 30,
                    simulated=True)
                for i in range(2)
            ]  # fmt: skip
            s.add(node)
    return store


def test_a_check_job_is_a_pinned_non_preemptible_job_of_the_system_queue_holding_every_gpu() -> None:
    spec = WorkloadSpec.model_validate(
        job_spec("node-1", "full", 8, simulated=True, python="/usr/bin/python3")
    )
    assert (spec.queue, spec.preemptible, spec.nodes, spec.placement.nodes) == (
        SYSTEM_QUEUE,
        False,
        1,
        ["node-1"],
    )
    assert spec.resources.gpu.count == 8 and spec.max_duration == 900.0
    assert spec.commands == ["/usr/bin/python3 -m gpupool.health.check_job --level full --simulated node-1"]
    real = job_spec("node-1", "quick", 8, simulated=False, python="/usr/bin/python3")
    assert real["commands"] == ["/usr/bin/python3 -m gpupool.health.check_job --level quick"]
    dotted = WorkloadSpec.model_validate(job_spec("GPU01.rack_2", "quick", 8, simulated=True, python="py"))
    assert dotted.name == "health-quick-gpu01-rack-2" and dotted.placement.nodes == ["GPU01.rack_2"]


def test_the_control_loop_starts_a_check_job_only_on_a_node_with_nothing_running(tmp_path: Path) -> None:
    store = _store(tmp_path)
    jobs = CheckJobs(store)
    with store.session() as s:
        user = Workload(name="train", queue="default", spec={}, state="running")
        s.add(user)
        s.flush()
        s.add(
            Attempt(
                workload_id=user.id,
                queue="default",
                number=0,
                state="running",
                node_name="node-2",
                gpu_indices=[0],
            )
        )
    refused: list[Exception] = []

    def ask(node: str) -> threading.Thread:
        def run() -> None:
            try:
                jobs.run(node, "quick")
            except Exception as exc:
                refused.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    asking = ask("node-2")
    binds: list[scheduler.Bind] = []
    while asking.is_alive():
        binds += jobs.binds()
        asking.join(0.05)
    assert binds == []
    (busy,) = refused
    assert isinstance(busy, Conflict)
    assert f"node node-2 runs workload {user.id} (train)" in busy.message
    assert "gpupool node drain node-2" in busy.message

    ask("node-1")
    while not binds:
        binds += jobs.binds()
    (bind,) = binds
    assert (bind.node, bind.gpu_indices) == ("node-1", (0, 1))
    with store.read() as s:
        job = s.get(Workload, bind.workload_id)
        assert job is not None
        assert (job.queue, job.user, job.state, job.preemptible) == (SYSTEM_QUEUE, "health", "pending", False)
        queue = s.query(Queue).filter_by(name=SYSTEM_QUEUE).one()
        assert queue.spec["resources"]["gpu"]["quota"] == 0
    store.close()


def _system_queue() -> scheduler.QueueView:
    spec = {"name": SYSTEM_QUEUE, "resources": {"gpu": {"quota": 0, "over_quota_weight": 0}}}
    return queue_view(spec)


def _check_view(state: str = "pending") -> scheduler.WorkloadView:
    view = scheduler.WorkloadView(
        id=1, queue=SYSTEM_QUEUE, priority=100, submit_time=0.0, gpus=scheduler.GpuDemand(2.0),
        preemptible=False, node_names=frozenset({"node-1"}), max_duration=300.0,
    )  # fmt: skip
    if state == "running":
        view = replace(view, placement=(scheduler.PodPlacement("node-1", (0, 1)),), start_time=0.0)
    return view


NODE = scheduler.NodeView(
    "node-1",
    True,
    tuple(scheduler.GpuView(i, "H100", 80 << 30) for i in range(2)),
    cpus=8,
    memory_bytes=1 << 36,
)


def test_the_scheduler_never_places_a_check_job_itself() -> None:
    snapshot = scheduler.Snapshot((NODE,), (_check_view(),), (_system_queue(),))
    decisions = scheduler.decide(snapshot, 1.0)
    assert decisions.binds == []
    assert decisions.explanations[1].code == "over-quota-nonpreemptible"


@pytest.mark.parametrize("node_state", ["ready", "cordoned"])
def test_a_running_check_job_keeps_its_gpus_from_a_team_with_quota(node_state: str) -> None:
    team = queue_view({"name": "nlp", "resources": {"gpu": {"quota": 2}}})
    wants = scheduler.WorkloadView(
        id=2, queue="nlp", priority=50, submit_time=1.0, gpus=scheduler.GpuDemand(2.0)
    )
    node = scheduler.NodeView(
        NODE.name, node_state == "ready", NODE.gpus, cpus=8, memory_bytes=1 << 36, state=node_state
    )
    snapshot = scheduler.Snapshot((node,), (wants,), (_system_queue(), team), (_check_view("running"),))
    decisions = scheduler.decide(snapshot, 10.0)
    assert decisions.evictions == [] and decisions.binds == []


def test_a_pending_check_job_nobody_waits_for_is_cancelled(tmp_path: Path) -> None:
    """Left by a head that stopped while it ran, then requeued by a drain: the scheduler would never place
    it, so it would wait forever."""
    store = _store(tmp_path)
    jobs = CheckJobs(store)
    long_ago = utcnow() - timedelta(minutes=5)
    with store.session() as s:
        for name in ("left", "fresh"):
            s.add(Workload(name=name, queue=SYSTEM_QUEUE, spec={}, state="pending", updated_at=long_ago))
    with jobs._lock:
        jobs._waited.add(2)  # "fresh": a thread of this head waits for it
    jobs.sweep(time.time())
    with store.read() as s:
        states = dict(s.execute(select(Workload.name, Workload.state)).all())
    assert states == {"left": "cancelled", "fresh": "pending"}
    store.close()


def test_a_node_left_cordoned_for_its_recheck_by_an_older_head_goes_back_to_unhealthy(
    tmp_path: Path,
) -> None:
    """Heads before the scheduler left single-pod work on unhealthy nodes alone cordoned an unhealthy node
    while its check job ran; one they left so (stopped meanwhile) is unhealthy again at the first pass."""
    store = _store(tmp_path)
    with store.session() as s:
        node = s.query(Node).filter_by(name="node-1").one()
        node.state, node.state_reason = "cordoned", f"{RECHECKING}; health: GPU 3: Xid 79 (hardware)"
    monitor = HealthMonitor(
        store, TelemetryCache(), HealthConfig(overrides={}), local_node="head", local_gpus=None
    )
    monitor.tick()
    with store.read() as s:
        node = s.query(Node).filter_by(name="node-1").one()
        assert (node.state, node.state_reason) == ("unhealthy", "health: GPU 3: Xid 79 (hardware)")
    assert monitor.view("node-1", "unhealthy", node.state_reason)["health"] == "unhealthy"
    store.close()


def test_rechecks_of_a_node_that_keeps_failing_back_off_to_the_longest_interval(tmp_path: Path) -> None:
    store = _store(tmp_path)
    config = HealthConfig(overrides={}, schedule=Schedule(recheck_interval=60.0, recheck_max_interval=300.0))
    monitor = HealthMonitor(store, TelemetryCache(), config, local_node="head", local_gpus=None)
    waits = []
    for failed in range(5):
        monitor._failed_rechecks["node-1"] = failed
        waits.append(monitor._recheck_interval("node-1"))
    assert waits == [60.0, 120.0, 240.0, 300.0, 300.0]
    assert monitor._recheck_interval("node-2") == 60.0  # per node
    store.close()


def test_a_pass_leaves_an_unhealthy_node_to_checks_that_run_or_ended_since_it_began(tmp_path: Path) -> None:
    """The node's state as the pass read it may be stale (a passing check returns it to ready) and its
    passive verdict is judged against the baseline a passing check replaces: the pass must not act on it."""
    store = _store(tmp_path)
    monitor = HealthMonitor(
        store, TelemetryCache(), HealthConfig(overrides={}), local_node="head", local_gpus=None
    )
    began = monitor._checks_now()
    assert not monitor._left_to_its_checks("node-1", began)
    with pytest.raises(Conflict):  # no check job can run there (no agent), but a check began and ended
        monitor.check("node-1", "quick")
    assert monitor._left_to_its_checks("node-1", began)
    assert not monitor._left_to_its_checks("node-2", began)
    lock = monitor._running.setdefault("node-2", threading.Lock())
    with lock:  # as a scheduled check's thread holds it while the check job runs
        assert monitor._left_to_its_checks("node-2", monitor._checks_now())
    assert not monitor._left_to_its_checks("node-1", monitor._checks_now())  # a later pass acts
    store.close()


def test_a_node_an_earlier_head_took_out_stays_out_after_a_restart_until_it_passes_its_checks(
    tmp_path: Path,
) -> None:
    """node-1 was taken out, then lost, and its agent came back (state ready) while the head was down: the
    restarted head takes it out again. node-2 passed its checks before the restart: it stays in service."""
    store = _store(tmp_path)
    xid = "GPU 3: Xid 79 (hardware): GPU has fallen off the bus"
    history = [
        ("node-1", "ready", "unhealthy", f"health: {xid}", "health"),
        ("node-1", "unhealthy", "unhealthy", "health warning: GPU 1: thermal throttling", "health"),
        ("node-1", "unhealthy", "lost", "no heartbeat for 10s", "system"),
        ("node-1", "lost", "ready", "agent reconnected", "system"),
        ("node-2", "ready", "unhealthy", "health: GPU 0: BF16 GEMM 396 TFLOPS < 593", "health"),
        ("node-2", "unhealthy", "ready", "health: passed the quick active checks (healthy)", "health"),
    ]
    with store.session() as s:
        for node, before, after, reason, actor in history:
            s.add(Event(object_kind="node", object_id=node, from_state=before, to_state=after, reason=reason,
                        actor=actor))  # fmt: skip
    for restart in range(2):  # a second restart finds the evidence as the first left it, not nested
        monitor = HealthMonitor(
            store, TelemetryCache(), HealthConfig(overrides={}), local_node="head", local_gpus=None
        )
        monitor.tick()
        with store.read() as s:
            states = {n.name: (n.state, n.state_reason) for n in s.scalars(select(Node))}
        assert states == {
            "node-1": ("unhealthy", f"health: {xid} (not back in service until it passes the active checks)"),
            "node-2": ("ready", ""),
        }, restart
        with store.session() as s:  # lost and back again while the head is down
            s.query(Node).filter_by(name="node-1").one().state = "ready"
    store.close()


def test_a_check_job_whose_node_was_lost_gives_no_verdict_and_a_lost_node_keeps_its_state(
    tmp_path: Path,
) -> None:
    """Its agent stopped answering while the job ran: that says nothing of the GPUs (the node is checked
    when it is back), and the health loop never moves a lost node (its backend lifts `lost`)."""
    store = _store(tmp_path)
    lost = "lost: node-lost: rank 0's node node-1 sent no heartbeat for 3.4s (node lease 3s)"
    with store.session() as s:
        job = Workload(name="health-quick-node-1", queue=SYSTEM_QUEUE, spec={}, state="failed", reason=lost,
                       started_at=utcnow())  # fmt: skip
        s.add(job)
        s.flush()
        s.add(Attempt(workload_id=job.id, queue=SYSTEM_QUEUE, number=0, state="failed", node_name="node-1",
                      gpu_indices=[0, 1], reason=lost, log_path=str(tmp_path / "none.log")))  # fmt: skip
        job_id = job.id
        s.query(Node).filter_by(name="node-2").one().state = "lost"
    with pytest.raises(CheckInterrupted, match="was stopped before it reported \\(lost: node-lost: rank 0"):
        CheckJobs(store)._outcome(job_id, "node-1", "quick")
    monitor = HealthMonitor(
        store, TelemetryCache(), HealthConfig(overrides={}), local_node="head", local_gpus=None
    )
    monitor._mark_unhealthy("node-2", checks.verdict([checks.Finding("gemm", "unhealthy", "slow")], []))
    with store.read() as s:
        assert s.query(Node).filter_by(name="node-2").one().state == "lost"
    assert monitor._held_out == {"node-2": "slow"}  # taken out again when it is back
    store.close()
