"""/api/v1/nodes: list, cordon, uncordon."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request

from gpupool.api.body import fields, text
from gpupool.control import service

router = APIRouter(prefix="/nodes", tags=["nodes"])


@router.get("", summary="Nodes with their GPUs, allocations and latest telemetry")
def list_nodes(request: Request) -> list[dict[str, Any]]:
    runtime = request.app.state.runtime
    return service.list_nodes(runtime.store, runtime.telemetry, runtime.health.views())


@router.post("/{name}/cordon", summary="Take no new work on this node (running work continues)")
def cordon(request: Request, name: str, body: dict[str, Any] | None = Body(None)) -> dict[str, Any]:
    reason = text(fields(body, ("reason",)), "reason", example="bad fan") or "cordoned by admin"
    return service.set_node_state(request.app.state.runtime.store, name, "cordoned", reason)


@router.post("/{name}/uncordon", summary="Return a cordoned node to service")
def uncordon(request: Request, name: str) -> dict[str, Any]:
    runtime = request.app.state.runtime
    result = service.set_node_state(runtime.store, name, "ready", "uncordoned by admin")
    runtime.wake()
    return result
