"""A node's verdict changes when what is wrong changes, not when a reading moves: the health loop on a real
SQLite store, fed samples as the telemetry cache takes them, one pass per sample."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from gpupool.control.health import HealthMonitor
from gpupool.control.telemetry import TelemetryCache
from gpupool.gpu.simulated import SimulatedProvider
from gpupool.health.thresholds import HealthConfig
from gpupool.store.db import Store
from gpupool.store.models import Event, Gpu, Node


def test_a_gpu_hovering_above_its_warning_temperature_is_one_warning_and_its_end_is_an_event(
    tmp_path: Path,
) -> None:
    store = Store(f"sqlite:///{tmp_path}/gpupool.db")
    gpus = SimulatedProvider("sim:2xH100", seed="t")
    with store.session() as s:
        node = Node(name="node-1", state="ready", state_reason="", labels={}, backend="agent")
        node.gpus = [
            Gpu(index=d.index, uuid=d.uuid, model=d.model, product_name=d.name, memory_bytes=d.memory_bytes)
            for d in gpus.devices()
        ]
        s.add(node)
    telemetry = TelemetryCache()
    monitor = HealthMonitor(store, telemetry, HealthConfig({}), local_node="head", local_gpus=None)
    cool = [s.to_dict() for s in gpus.sample()]

    def tick(*temperatures: float) -> dict[str, Any]:
        now = time.time()
        telemetry.put(
            "node-1", [{**s, "at": now, "temperature_c": t} for s, t in zip(cool, temperatures, strict=True)]
        )
        monitor.tick(now)
        return monitor.view("node-1", "ready", "")

    tick(60.0, 60.0)
    for reading in (86.0, 87.0, 86.0, 88.0, 87.0):  # GPU 0 hovers above 85 C
        shown = tick(reading, 60.0)
        assert shown["health"] == "warning" and shown["evidence"] == f"GPU 0: {reading:.0f} C > 85 C"
    tick(87.0, 89.0)  # GPU 1 too: another condition
    tick(60.0, 60.0)  # both cool down

    with store.read() as s:
        reasons = [e.reason for e in s.scalars(select(Event).where(Event.object_kind == "node"))]
    assert reasons == [
        "health warning: GPU 0: 86 C > 85 C",
        "health warning: GPU 0: 87 C > 85 C; GPU 1: 89 C > 85 C",
        "health healthy: all checks passed",
    ]
    assert monitor.verdicts_total[("node-1", "warning")] == 2
    assert monitor.failed_checks_total["temperature"] == 3  # GPU 0 once, then GPU 0 and GPU 1
    store.close()
