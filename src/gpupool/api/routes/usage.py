"""/api/v1/usage: GPU-hours and their cost over a window, grouped (control/accounting.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from gpupool.api.errors import ApiError
from gpupool.control import accounting
from gpupool.timeutil import utcnow

router = APIRouter(prefix="/usage", tags=["usage"])

# Refused when misspelled or unknown: a chargeback script that sends `users=alice` must not get everyone's.


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
    user: list[str] | None = Query(
        None,
        description="only the work these users submitted (their token's name): repeated (user=a&user=b) "
        "or comma separated (user=a,b); default everyone's",
    ),
) -> dict[str, Any]:
    users = None if user is None else [name.strip() for given in user for name in given.split(",")]
    if users is not None and not all(users):
        raise ApiError(422, "invalid", "user: an empty name; give names such as user=alice,bob", field="user")
    runtime = request.app.state.runtime
    now = utcnow()
    start, end = accounting.window(since, until, now)
    return accounting.usage(
        runtime.store, start, end, by=by, queue=queue, users=users, prices=runtime.prices, now=now
    )
