"""/api/v1/health (verdicts, checks on demand), /api/v1/telemetry (GPU history), node faults and expected
GPUs (admin)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Query, Request

from gpupool.api.auth import admin_only
from gpupool.api.body import fields, text
from gpupool.api.errors import ApiError
from gpupool.control import health as node_health
from gpupool.control.tokens import Caller

MAX_HISTORY_S = 86400.0  # the longest GPU history a node keeps (its coarsest tier)

router = APIRouter(tags=["health"])

FAULT_FIELDS = ("xid", "ecc", "throttle", "slow", "fall_off_bus", "clear")


@router.get("/health", summary="Health verdict of every node, with its evidence")
def list_health(request: Request) -> list[dict[str, Any]]:
    views = request.app.state.runtime.health.views()
    return [{"node": name, **view} for name, view in sorted(views.items())]


@router.get("/health/{name}", summary="One node's health, its last active checks and its events")
def get_health(request: Request, name: str) -> dict[str, Any]:
    runtime = request.app.state.runtime
    views = _known(runtime, name)
    return {"node": name, **views[name], "events": node_health.node_events(runtime.store, name)}


def _known(runtime: Any, name: str) -> dict[str, dict[str, Any]]:
    """Every node's health view; ApiError 404, naming the nodes, when none is called `name`."""
    views: dict[str, dict[str, Any]] = runtime.health.views()
    if name not in views:
        raise ApiError(
            404, "not_found", f"no node named {name!r} (nodes: {', '.join(sorted(views)) or 'none'})"
        )
    return views


@router.post(
    "/health/run",
    summary="Run the passive and active checks now, and act on the verdict (admin)",
    dependencies=[Depends(admin_only)],
)
def run_checks(request: Request, body: dict[str, Any] | None = Body(None)) -> list[dict[str, Any]]:
    body = fields(body, ("node", "level"))
    level = text(body, "level", example="quick") or "quick"
    runtime = request.app.state.runtime
    node = text(body, "node", example="node-1")
    names = [node] if node else [n for n in sorted(runtime.health.views()) if runtime.health.can_check(n)]
    if not names:
        raise ApiError(
            409, "conflict", "no node here can run active checks; name one with --node", field="node"
        )
    if node:  # named: refused (409) when it cannot be checked now
        return [runtime.health.check(node, level)]
    reports: list[dict[str, Any]] = runtime.health.check_many(names, level)  # skipped, with why
    return reports


@router.get("/telemetry/{name}", summary="A node's GPUs: latest sample and downsampled history")
def telemetry(
    request: Request,
    name: str,
    seconds: float = Query(600.0, gt=0, le=MAX_HISTORY_S, allow_inf_nan=False, description="history window"),
) -> dict[str, Any]:
    runtime = request.app.state.runtime
    cache = runtime.telemetry
    samples = cache.node_samples(name)
    if not samples:
        _known(runtime, name)  # a typo is refused; a node with no sample yet has an empty history
    return {
        "node": name,
        "age_seconds": cache.age(name),
        "gpus": [
            {"index": s["index"], "latest": s, "history": cache.history(name, int(s["index"]), seconds)}
            for s in samples
        ],
    }


@router.post("/nodes/{name}/faults", summary="Inject a fault into a simulated GPU (admin; tests and demos)")
def inject_fault(
    request: Request, name: str, body: dict[str, Any] = Body(...), _: Caller = Depends(admin_only)
) -> dict[str, Any]:
    body = fields(body, ("gpu", *FAULT_FIELDS))
    # Compared by identity: 0 == False, and `xid: 0` or `slow: 0` is a value to refuse, not no fault.
    chosen = [key for key in FAULT_FIELDS if body.get(key) is not None and body.get(key) is not False]
    if len(chosen) != 1:
        raise ApiError(
            422, "invalid", f"give exactly one fault of {', '.join(FAULT_FIELDS)}; got {chosen or 'none'}",
            field="fault",
        )  # fmt: skip
    gpu = body.get("gpu")
    if not isinstance(gpu, int) or isinstance(gpu, bool):
        raise ApiError(422, "invalid", f"gpu: {gpu!r} is not a GPU index; e.g. 3", field="gpu")
    runtime = request.app.state.runtime
    fault = chosen[0]
    _check_fault_value(fault, body[fault])
    done = runtime.health.inject_fault(name, gpu, fault, body[fault])
    return {"node": name, "gpu": gpu, "fault": fault, "result": done}


def _check_fault_value(fault: str, value: Any) -> None:
    """Refuse a value of the wrong type with the fix (ranges and kinds are checked where the fault is
    injected, on the head or on the node's agent)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if fault == "xid" and not (number and isinstance(value, int) and 0 < value < 1 << 31):
        message = f"xid: {value!r} is not an Xid code: a whole number, e.g. 79 (fallen off the bus)"
    elif fault == "slow" and not number:
        message = f"slow: {value!r} is not a number: the share of its expected speed the GPU keeps; e.g. 0.5"
    elif fault in ("fall_off_bus", "clear") and value is not True:
        message = f"{fault}: {value!r}; give true"
    else:
        return
    raise ApiError(422, "invalid", message, field=fault)


@router.post(
    "/nodes/{name}/expected-gpus",
    summary="Accept the GPUs the node has registered now as the ones it is expected to have (admin)",
)
def accept_gpus(request: Request, name: str, _: Caller = Depends(admin_only)) -> dict[str, Any]:
    result: dict[str, Any] = request.app.state.runtime.health.accept_gpus(name)
    return result
