"""The nodes as the API shows them, and an operator's cordon, uncordon and drain. No HTTP here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import select

from gpupool.control.errors import Conflict, NotFound
from gpupool.control.lifecycle import RUNNING
from gpupool.control.telemetry import TelemetryCache
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Node
from gpupool.timeutil import iso


def node_view(
    node: Node, allocated: dict[tuple[str, int], list[int]], telemetry: TelemetryCache
) -> dict[str, Any]:
    gpus = []
    for gpu in node.gpus:
        holders = allocated.get((node.name, gpu.index), [])
        gpus.append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "model": gpu.model,
                "name": gpu.product_name,
                "memory_bytes": gpu.memory_bytes,
                "nvlink_island": gpu.nvlink_island,
                "simulated": gpu.simulated,
                "workloads": holders,
                "sample": telemetry.get(node.name, gpu.index),
            }
        )
    models = sorted({g.model for g in node.gpus})
    return {
        "name": node.name,
        "state": node.state,
        "state_reason": node.state_reason,
        "address": node.address,
        "backend": node.backend,
        "cpus": node.cpus,
        "memory_bytes": node.memory_bytes,
        "labels": node.labels,
        "gpu_models": models,
        "gpus_total": len(node.gpus),
        "gpus_allocated": sum(1 for g in gpus if g["workloads"]),
        "last_heartbeat": iso(node.last_heartbeat),
        "gpus": gpus,
    }


# The health loop's view of one node (name, state, state reason) -> its verdict and evidence
HealthView = Callable[[str, str, str], Mapping[str, Any]]


def list_nodes(
    store: Store, telemetry: TelemetryCache, health: HealthView | None = None
) -> list[dict[str, Any]]:
    """Every node; `health` (the health loop's `view`) adds its verdict and evidence, judged with the state
    read here: a verdict taken from a read of its own could say `unhealthy` of a node this read finds
    returned to service a moment later."""
    with store.read() as s:
        allocated: dict[tuple[str, int], list[int]] = {}
        workloads: dict[str, list[int]] = {}
        for attempt in s.scalars(select(Attempt).where(Attempt.state == RUNNING)):
            pods = attempt.pods or [{"node": attempt.node_name, "gpu_indices": attempt.gpu_indices}]
            for pod in pods:
                workloads.setdefault(pod["node"], []).append(attempt.workload_id)
                for index in pod["gpu_indices"]:
                    allocated.setdefault((pod["node"], int(index)), []).append(attempt.workload_id)
        nodes = []
        for n in s.scalars(select(Node).order_by(Node.name)):
            verdict = health(n.name, n.state, n.state_reason) if health is not None else {}
            nodes.append(
                {
                    **node_view(n, allocated, telemetry),
                    "workloads": sorted(workloads.get(n.name, [])),
                    # a drain is done: nothing runs there any more (Slurm's DRAINED, after DRAINING)
                    "drained": n.state == "draining" and not workloads.get(n.name),
                    "health": verdict.get("health", "unknown"),
                    "health_evidence": verdict.get("evidence", ""),
                }
            )
        return nodes


def drain_node(store: Store, name: str, reason: str, *, actor: str = "admin") -> dict[str, Any]:
    """Take no new work on the node and stop its work (SIGTERM, SIGKILL after the grace period); the control
    loop requeues each stopped workload to resume from its checkpoint elsewhere. Undone by uncordon."""
    with store.session() as s:
        node = s.scalar(select(Node).where(Node.name == name))
        if node is None:
            names = ", ".join(s.scalars(select(Node.name).order_by(Node.name))) or "none"
            raise NotFound(f"no node named {name!r} (nodes: {names})")
        if node.state != "draining":
            node.change_state("draining", reason, actor)
        for attempt in s.scalars(select(Attempt).where(Attempt.state == RUNNING)):
            pods = attempt.pods or [{"node": attempt.node_name}]
            if attempt.stop_requested_at is None and any(p["node"] == name for p in pods):
                # the control loop stops it (observe.STOP_DRAIN); its history says who drained the node
                attempt.stop_reason = "drain"
                said = (
                    "" if not reason or reason == f"drained by {actor}" else f": {reason}"
                )  # the API's default
                attempt.reason = f"node {name} drained by {actor}{said}"
    return next(n for n in list_nodes(store, TelemetryCache()) if n["name"] == name)


def set_node_state(
    store: Store, name: str, state: str, reason: str, *, actor: str = "admin"
) -> dict[str, Any]:
    with store.session() as s:
        node = s.scalar(select(Node).where(Node.name == name))
        if node is None:
            names = ", ".join(s.scalars(select(Node.name).order_by(Node.name))) or "none"
            raise NotFound(f"no node named {name!r} (nodes: {names})")
        if node.state in ("lost", "unhealthy") and state == "ready":
            raise Conflict(f"node {name} is {node.state}; it returns to service when it is healthy again")
        if node.state != state:
            node.change_state(state, reason, actor)
    return next(n for n in list_nodes(store, TelemetryCache()) if n["name"] == name)
