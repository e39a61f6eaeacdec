"""/api/v1/scheduling: the scheduling policy the server applies (its scheduling.yaml, or the default)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

router = APIRouter(prefix="/scheduling", tags=["scheduling"])


@router.get(
    "",
    summary="The scheduling policy each pass applies: scheduling.yaml's fields (GPU-times in GPU-seconds), "
    "the file they came from (null: the default policy), and the fair share by history",
)
def scheduling(request: Request) -> dict[str, Any]:
    result: dict[str, Any] = request.app.state.runtime.reconciler.scheduling()
    return result
