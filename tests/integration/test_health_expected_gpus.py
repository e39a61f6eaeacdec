"""The GPUs each node is expected to have, on real SQLite and real PostgreSQL: a store upgraded from 0006
expects each node's GPUs as registered then (migration 0007), the health loop counts them in the database
each pass (json_array_length on both), and a node registered again with a GPU fewer is unhealthy, naming
the missing GPU, until an admin accepts it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import select, text

from gpupool.control.health import HealthMonitor
from gpupool.control.telemetry import TelemetryCache
from gpupool.gpu.simulated import SimulatedProvider
from gpupool.health.thresholds import HealthConfig
from gpupool.store.db import Store, alembic_config
from gpupool.store.models import Gpu, Node
from tests.support.postgres import database_url


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield database_url(request, tmp_path)


def test_a_node_upgraded_from_0006_expects_its_gpus_and_one_registered_short_of_a_gpu_is_unhealthy(
    url: str,
) -> None:
    gpus = SimulatedProvider("sim:2xH100", seed="n1")
    old = Store(url, run_migrations=False)
    command.upgrade(alembic_config(old.engine), "0006")
    with old.engine.begin() as conn:
        conn.execute(text("INSERT INTO nodes (id, name, state, state_reason, address, backend, cpus, "
                          "memory_bytes, labels, created_at) VALUES (1, 'n1', 'ready', '', '127.0.0.1', "
                          "'agent', 8, 1024, '{}', '2026-01-01')"))  # fmt: skip
        for d in gpus.devices():
            conn.execute(
                text('INSERT INTO gpus (node_id, "index", uuid, model, product_name, memory_bytes, '
                     "nvlink_island, simulated, last_sample) VALUES (1, :i, :u, 'H100', 'H100', 0, 0, "
                     "true, '{}')"),
                {"i": d.index, "u": d.uuid},
            )  # fmt: skip
    old.close()

    store = Store(url)
    try:
        telemetry = TelemetryCache()
        monitor = HealthMonitor(
            store, telemetry, HealthConfig(overrides={}), local_node="head", local_gpus=None
        )
        telemetry.put("n1", [s.to_dict() for s in gpus.sample()])
        monitor.tick()
        assert monitor.views()["n1"]["health"] == "healthy"
        assert monitor._expected_now == {"n1": 2}

        with store.session() as s:  # registered again: the driver lists GPU 0 only
            node = s.scalars(select(Node).where(Node.name == "n1")).one()
            node.gpus.remove(next(g for g in node.gpus if g.index == 1))
        telemetry.put("n1", [s.to_dict() for s in gpus.sample()][:1])
        monitor.tick()
        gone = gpus.devices()[1].uuid
        with store.read() as s:
            node = s.scalars(select(Node).where(Node.name == "n1")).one()
            assert node.state == "unhealthy"
            assert node.state_reason == (
                f"health: 1 of 2 expected GPUs answer; missing: GPU 1 {gone} (not listed by the driver)"
            )
            assert [g.index for g in s.scalars(select(Gpu))] == [0]
        assert (
            monitor.accept_gpus("n1")["result"] == f"expected GPUs 2 -> 1; no longer expected: GPU 1 {gone}"
        )
        monitor.tick()
        assert monitor._expected_now == {"n1": 1}
        assert monitor.views()["n1"]["findings"] == []  # it stays out until it passes its active checks
    finally:
        store.close()
