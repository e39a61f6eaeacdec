"""`gpupool nodes` judges each node's health with the state it reads for that node, in the same read: a
verdict taken from a read of its own said `unhealthy` of a node that the listing, a moment later, showed
back in service (seen in CI, right after `gpupool node accept-gpus`)."""

from __future__ import annotations

from typing import Any

from gpupool.control import nodes
from gpupool.control.telemetry import TelemetryCache
from gpupool.store.db import Store
from gpupool.store.models import Node


def test_each_nodes_health_is_judged_with_the_state_the_listing_shows(store: Store) -> None:
    with store.session() as s:
        s.add(Node(name="a", state="ready", state_reason="", labels={}))
        s.add(Node(name="b", state="unhealthy", state_reason="health: GPU 1 fell off the bus", labels={}))
    asked: list[tuple[str, str, str]] = []

    def view(name: str, state: str, reason: str) -> dict[str, Any]:
        asked.append((name, state, reason))
        return {"health": "unhealthy" if state == "unhealthy" else "healthy", "evidence": reason}

    listed = nodes.list_nodes(store, TelemetryCache(), view)
    assert [(n["name"], n["state"], n["health"], n["health_evidence"]) for n in listed] == [
        ("a", "ready", "healthy", ""),
        ("b", "unhealthy", "unhealthy", "health: GPU 1 fell off the bus"),
    ]
    assert asked == [(n["name"], n["state"], n["state_reason"]) for n in listed]
    assert [n["health"] for n in nodes.list_nodes(store, TelemetryCache())] == ["unknown", "unknown"]
