"""Rechecks of an unhealthy node (control/health.py, control/health_judge.py): the first as soon as its work
has left, a check on demand never backing off the loop's schedule, and a failed check's verdict judged
with the baseline the node keeps. The health loop on a real SQLite store, fed simulated GPUs' samples; the
check job is a stand-in that passes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import select

from gpupool.control.health import HealthMonitor
from gpupool.control.health_jobs import CheckJob
from gpupool.control.telemetry import TelemetryCache
from gpupool.gpu.simulated import SimulatedProvider
from gpupool.health.checks import ActiveResult, GpuMeasurement
from gpupool.health.thresholds import HealthConfig, Schedule
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Gpu, Node, Workload

NODE = "node-1"
INTERVAL = 60.0


class _Agents:
    """An agent connected for the node: check jobs can run there."""

    def knows(self, name: str) -> bool:
        return name == NODE

    def ask(self, name: str, instruction: dict[str, Any], timeout: float) -> dict[str, Any]:
        raise AssertionError("no fault goes through the agent here")


@dataclass
class _PassingJobs:
    """Check jobs that pass at once (every GPU measured, nothing below its floor)."""

    gpus: int
    ran: list[str] = field(default_factory=list)

    def run(self, node: str, level: str) -> CheckJob:
        self.ran.append(level)
        measured = tuple(GpuMeasurement(i, "H100", None, memtest_errors=0) for i in range(self.gpus))
        return CheckJob(len(self.ran), node, ActiveResult(level, measured, runner="simulated"))

    def sweep(self, now: float) -> None:
        pass

    def prune(self, now: float, retention: Any, *, named: Any = ()) -> int:
        return 0


@dataclass
class _Node:
    store: Store
    gpus: SimulatedProvider
    telemetry: TelemetryCache
    monitor: HealthMonitor
    jobs: _PassingJobs
    scheduled: list[tuple[str, bool]]  # the checks the loop started: (level, backs_off)

    def sample(self) -> None:
        self.telemetry.put(NODE, [{**s.to_dict(), "at": time.time()} for s in self.gpus.sample()])

    def state(self) -> tuple[str, str]:
        with self.store.read() as s:
            node = s.scalars(select(Node).where(Node.name == NODE)).one()
            return node.state, node.state_reason


@pytest.fixture
def node(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Node]:
    gpus = SimulatedProvider("sim:4xH100", seed="rechecks")
    with store.session() as s:
        row = Node(name=NODE, state="ready", state_reason="", labels={}, backend="agent")
        row.gpus = [
            Gpu(index=d.index, uuid=d.uuid, model=d.model, product_name=d.name, memory_bytes=d.memory_bytes)
            for d in gpus.devices()
        ]
        s.add(row)
    telemetry = TelemetryCache()
    jobs = _PassingJobs(len(gpus.devices()))
    config = HealthConfig({}, schedule=Schedule(recheck_interval=INTERVAL, idle_interval=0))
    stand_in: Any = jobs
    monitor = HealthMonitor(
        store, telemetry, config, local_node="head", local_gpus=None, agents=_Agents(), jobs=stand_in
    )
    scheduled: list[tuple[str, bool]] = []

    def check_later(name: str, level: str, *, backs_off: bool = False) -> None:
        scheduled.append((level, backs_off))  # the loop's start of a check thread, recorded instead

    monkeypatch.setattr(monitor, "_check_later", check_later)
    yield _Node(store, gpus, telemetry, monitor, jobs, scheduled)


def _work_on_the_node(store: Store) -> int:
    with store.session() as s:
        workload = Workload(name="train", queue="default", spec={}, state="running")
        s.add(workload)
        s.flush()
        attempt = Attempt(workload_id=workload.id, queue="default", number=0, state="running",
                          node_name=NODE, gpu_indices=[0])  # fmt: skip
        s.add(attempt)
        s.flush()
        return attempt.id


def _work_leaves(store: Store, attempt_id: int) -> None:
    with store.session() as s:
        attempt = s.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.state = "cancelled"


def test_a_failed_check_reports_every_fault_its_baseline_still_counts_and_a_pass_acknowledges_them(
    node: _Node,
) -> None:
    """An uncorrectable ECC error leaves a row remap pending: the check that fails on the remap names the
    ECC error too (its count is not acknowledged by a check that failed), and once the remap is cleared
    the next check passes and acknowledges it."""
    node.gpus.inject_ecc_errors(2, 1)
    node.sample()
    report = node.monitor.check(NODE, "quick")
    assert report["health"] == "unhealthy"
    assert "GPU 2: 1 new uncorrectable ECC error(s)" in report["evidence"], report["evidence"]
    assert "GPU 2: HBM row remap pending" in report["evidence"], report["evidence"]
    assert node.state()[0] == "unhealthy"
    # What the loop judges meanwhile is what the report said: the same baseline.
    passive = node.monitor._passive(NODE)
    assert passive is not None and passive.evidence == report["evidence"].removesuffix("; active: all passed")

    node.gpus.clear_faults(2)  # repaired: the remap done, the count of the error stays
    node.sample()
    passed = node.monitor.check(NODE, "quick")
    assert passed["health"] == "healthy", passed["evidence"]
    assert node.state() == ("ready", "health: passed the quick active checks (healthy)")
    passive = node.monitor._passive(NODE)
    assert passive is not None and passive.health == "healthy", passive.evidence


def test_an_unhealthy_node_is_rechecked_as_soon_as_its_work_has_left(node: _Node) -> None:
    attempt = _work_on_the_node(node.store)
    node.gpus.inject_ecc_errors(1, 1)
    node.sample()
    now = time.time()
    node.monitor.tick(now)
    assert node.state()[0] == "unhealthy" and node.scheduled == []  # its work is stopped first
    _work_leaves(node.store, attempt)
    node.sample()
    node.monitor.tick(now + 1)
    assert node.scheduled == [("quick", False)]  # at once, not INTERVAL after it fell; no back-off yet


def test_a_check_on_demand_does_not_back_off_the_loops_rechecks(node: _Node) -> None:
    node.gpus.inject_ecc_errors(1, 1)
    node.sample()
    now = time.time()
    node.monitor.tick(now)
    assert node.state()[0] == "unhealthy"
    node.monitor._check_locked(NODE, "quick", backs_off=False)  # its first recheck, as its thread runs it
    assert node.monitor._recheck_interval(NODE) == INTERVAL  # failed; the first recheck does not back off
    node.scheduled.clear()

    manual = node.monitor.check(NODE, "quick")  # `gpupool health run` a little later: fails again
    assert manual["health"] == "unhealthy"
    checked = time.time()
    assert node.monitor._recheck_interval(NODE) == INTERVAL  # not doubled by a check on demand
    node.sample()
    node.monitor.tick(checked + INTERVAL - 5)
    assert node.scheduled == []  # not before INTERVAL after the last check
    node.monitor.tick(checked + INTERVAL + 1)
    assert node.scheduled == [("quick", True)]  # INTERVAL after it, not twice that; this one backs off
    node.monitor._check_locked(NODE, "quick", backs_off=True)  # and fails
    assert node.monitor._recheck_interval(NODE) == 2 * INTERVAL
