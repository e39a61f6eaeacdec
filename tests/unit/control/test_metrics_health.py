"""`/metrics` judges each node's health with the state it reads for that node, in the same read, as
`gpupool nodes` does (test_list_nodes.py): verdicts from a read of their own could disagree with the
`gpupool_node_state` series of the same scrape."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from gpupool.control.health import HealthMonitor
from gpupool.control.metrics import PoolCollector
from gpupool.control.telemetry import TelemetryCache
from gpupool.health.thresholds import HealthConfig
from gpupool.store.db import Store
from gpupool.store.models import Node


def test_each_nodes_health_series_is_judged_with_the_state_its_state_series_shows(store: Store) -> None:
    with store.session() as s:
        s.add(Node(name="a", state="ready", state_reason="", labels={}))
        s.add(Node(name="b", state="unhealthy", state_reason="health: GPU 1 fell off the bus", labels={}))
    telemetry = TelemetryCache()
    monitor = HealthMonitor(store, telemetry, HealthConfig({}), local_node="head", local_gpus=None)
    read_nodes = monitor._read_nodes

    def a_read_later(*args: Any) -> Any:  # by then the health loop has returned b to service
        with store.session() as s:
            node = s.scalars(select(Node).where(Node.name == "b")).one()
            node.state, node.state_reason = "ready", ""
        return read_nodes(*args)

    monitor._read_nodes = a_read_later  # type: ignore[method-assign]
    series = {metric.name: metric for metric in PoolCollector(store, telemetry, monitor, dict).collect()}
    health = {
        sample.labels["node"]: sample.labels["health"] for sample in series["gpupool_node_health"].samples
    }
    state = {sample.labels["node"]: sample.labels["state"] for sample in series["gpupool_node_state"].samples}
    assert state == {"a": "ready", "b": "unhealthy"}
    assert health == {"a": "unknown", "b": "unhealthy"}  # a: no telemetry yet; b: as the scrape read it
