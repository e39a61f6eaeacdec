"""/api/v1/queues: create, list, get, update."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request

from gpupool.control import service
from gpupool.spec import parse_queue_spec

router = APIRouter(prefix="/queues", tags=["queues"])


@router.post("", status_code=201, summary="Create a queue (team or project)")
def create(
    request: Request, body: Any = Body(..., description="A queue spec: see docs/specs.md")
) -> dict[str, Any]:
    return service.create_queue(request.app.state.runtime.store, parse_queue_spec(body))


@router.get("", summary="Queues with quotas, limits and what they use now")
def list_queues(request: Request) -> list[dict[str, Any]]:
    runtime = request.app.state.runtime
    return service.list_queues(runtime.store, runtime.reconciler.fair_shares)


@router.get("/{name}", summary="One queue")
def get_queue(request: Request, name: str) -> dict[str, Any]:
    runtime = request.app.state.runtime
    return service.get_queue(runtime.store, name, runtime.reconciler.fair_shares)


@router.patch("/{name}", summary="Change some fields of a queue (merged into its spec)")
def update(request: Request, name: str, body: Any = Body(...)) -> dict[str, Any]:
    def build(current: dict[str, Any]) -> Any:
        return parse_queue_spec(merge(current, body if isinstance(body, dict) else {"<body>": body}))

    runtime = request.app.state.runtime
    result = service.update_queue(runtime.store, name, build)
    runtime.wake()
    return result


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `patch` into `base` (a JSON merge patch without deletes)."""
    out = dict(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
