"""/api/v1/events: the audit log, who changed what and when (control/audit.py); admins only."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from gpupool.api.auth import admin_only
from gpupool.control import audit
from gpupool.control.accounting import window_edge
from gpupool.timeutil import utcnow

router = APIRouter(prefix="/events", tags=["audit"], dependencies=[Depends(admin_only)])


@router.get(
    "", summary="The audit log, newest first: state changes and configuration changes, with who (admin)"
)
def events(
    request: Request,
    since: str | None = Query(
        None,
        description="from: an ISO 8601 time or date (UTC without a zone), or a duration before `until` "
        "(before now without it), as `usage` counts it (1d)",
    ),
    until: str | None = Query(None, description="before this time, in the same forms"),
    kind: str | None = Query(None, description=f"only this kind of object: {', '.join(audit.KINDS)}"),
    object: str | None = Query(
        None, description="only this object (a queue's name, a workload's id); with kind"
    ),
    actor: str | None = Query(
        None, description="only changes by this token's name (system, control: the head)"
    ),
    limit: int = Query(200, description=f"at most this many, newest first (1..{audit.MAX_LISTED})"),
) -> list[dict[str, Any]]:
    now = utcnow()
    end = window_edge(until, "until", before=now)
    return audit.list_events(
        request.app.state.runtime.store,
        since=window_edge(since, "since", before=min(end, now) if end is not None else now),
        until=end,
        kind=kind,
        name=object,
        actor=actor,
        limit=limit,
    )
