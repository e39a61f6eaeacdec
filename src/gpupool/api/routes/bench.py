"""/api/v1/bench-results: record a bench's JSON report for a node, read the history back (docs/bench.md)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Query, Request

from gpupool.api.auth import admin_only
from gpupool.api.errors import ApiError
from gpupool.bench.results import HISTORY_PER_SERIES, KINDS, BenchResultError, summarize
from gpupool.control import bench
from gpupool.control.tokens import Caller

router = APIRouter(prefix="/bench-results", tags=["bench"])


@router.post("", status_code=201, summary="Record a bench result (the JSON `gpupool bench --json` wrote)")
def record(
    request: Request, body: dict[str, Any] = Body(...), caller: Caller = Depends(admin_only)
) -> list[dict[str, Any]]:
    # admins only: a result can flag or drain a node (health checks), like a fault injection
    node = body.get("node")
    if not isinstance(node, str) or not node:
        raise ApiError(422, "invalid", "node: give the node the bench ran on, e.g. node-1", field="node")
    unknown = set(body) - {"node", "kind", "report", "source"}
    if unknown:
        raise ApiError(
            422, "invalid", f"{sorted(unknown)[0]}: unknown field; fields: node, kind, report, source",
            field=sorted(unknown)[0],
        )  # fmt: skip
    kind = body.get("kind")
    if kind is not None and kind not in KINDS:
        raise ApiError(422, "invalid", f"kind: {kind!r}; one of {', '.join(KINDS)}", field="kind")
    try:
        summaries = summarize(body.get("report"), kind)
    except BenchResultError as exc:
        field = str(exc).split(":", 1)[0]
        raise ApiError(422, "invalid", str(exc), field=field) from exc
    source = str(body.get("source") or "api")[:64]
    return bench.record(request.app.state.runtime.store, summaries, [node], source=source, actor=caller.name)


@router.get("", summary="Bench results, newest first; `latest`: the newest of each node, kind and key")
def results(
    request: Request,
    node: str | None = Query(None, description="only this node's results"),
    kind: str | None = Query(None, description="collective, gemm or train"),
    key: str | None = Query(None, description="collective: the op; gemm: the dtype; train: the precision"),
    latest: bool = Query(False, description="only the newest result of each series"),
    limit: int = Query(HISTORY_PER_SERIES, ge=1, le=10_000, description="at most this many"),
) -> list[dict[str, Any]]:
    if kind is not None and kind not in KINDS:
        raise ApiError(422, "invalid", f"kind: {kind!r}; one of {', '.join(KINDS)}", field="kind")
    store = request.app.state.runtime.store
    return bench.history(store, node=node, kind=kind, key=key, latest=latest, limit=limit)
