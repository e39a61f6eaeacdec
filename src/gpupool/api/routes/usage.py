"""/api/v1/usage: GPU-hours and their cost over a window, grouped (control/accounting.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from gpupool.control import accounting
from gpupool.timeutil import utcnow

router = APIRouter(prefix="/usage", tags=["usage"])


@router.get("", summary="GPU-hours (and their cost, with prices.yaml) per queue, user, workload, node, ...")
def usage(
    request: Request,
    since: str | None = Query(
        None,
        description="start: an ISO 8601 time or date (UTC without a zone), or a duration before "
        "`until` such as 7d or 12h; default 7d",
    ),
    until: str | None = Query(
        None, description="end, in the same forms (a duration: before now); default now"
    ),
    by: str = Query("queue", description=f"group by one of: {', '.join(accounting.GROUPS)}"),
    queue: str | None = Query(None, description="only this queue's work"),
) -> dict[str, Any]:
    runtime = request.app.state.runtime
    now = utcnow()
    start, end = accounting.window(since, until, now)
    return accounting.usage(runtime.store, start, end, by=by, queue=queue, prices=runtime.prices, now=now)
