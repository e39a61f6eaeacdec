"""/api/v1/nodes: list, cordon, uncordon, delete."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Request

from gpupool.api.auth import admin_only
from gpupool.api.body import fields, text
from gpupool.api.routes.agents import NodeCredentials
from gpupool.control import inventory, nodes
from gpupool.control.tokens import Caller

router = APIRouter(prefix="/nodes", tags=["nodes"])


@router.get("", summary="Nodes with their GPUs, allocations and latest telemetry")
def list_nodes(request: Request) -> list[dict[str, Any]]:
    runtime = request.app.state.runtime
    return nodes.list_nodes(runtime.store, runtime.telemetry, runtime.health.view)


@router.post("/{name}/cordon", summary="Take no new work on this node (running work continues) (admin)")
def cordon(
    request: Request,
    name: str,
    body: dict[str, Any] | None = Body(None),
    caller: Caller = Depends(admin_only),
) -> dict[str, Any]:
    reason = text(fields(body, ("reason",)), "reason", example="bad fan") or f"cordoned by {caller.name}"
    return nodes.set_node_state(request.app.state.runtime.store, name, "cordoned", reason, actor=caller.name)


@router.post("/{name}/uncordon", summary="Return a cordoned node to service (admin)")
def uncordon(request: Request, name: str, caller: Caller = Depends(admin_only)) -> dict[str, Any]:
    runtime = request.app.state.runtime
    result = nodes.set_node_state(
        runtime.store, name, "ready", f"uncordoned by {caller.name}", actor=caller.name
    )
    runtime.wake()
    return result


@router.delete("/{name}", summary="Remove a node that runs nothing, and void its agent's credential (admin)")
def delete(request: Request, name: str, caller: Caller = Depends(admin_only)) -> dict[str, Any]:
    runtime = request.app.state.runtime
    with runtime.reconciler.inventory_lock:  # no inventory pass nor join between the check and the delete
        deleted = inventory.delete_node(runtime.store, name, actor=caller.name)
    # Credentials are cached for the heartbeats: a fresh cache reads them again, so the deleted node's
    # agent gets 401 (join again) at its next heartbeat, not up to CREDENTIAL_CACHE_SECONDS later.
    request.app.state.node_credentials = NodeCredentials()
    runtime.telemetry.keep_listed({name: ()})  # its last samples and history are no node's GPUs now
    runtime.wake()
    return deleted
