"""/api/v1/secrets: the caller's secrets (control/secrets.py): names and when each was set, never a value."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Query, Request

from gpupool.api.auth import require_token
from gpupool.api.body import fields
from gpupool.api.errors import ApiError
from gpupool.control import secrets
from gpupool.control.tokens import Caller

router = APIRouter(prefix="/secrets", tags=["secrets"])


@router.get("", summary="Your secrets' names (an admin: anyone's, with owner), never their values")
def list_secrets(
    request: Request,
    owner: str | None = Query(None, description="whose (admin); default: the caller's own"),
    caller: Caller = Depends(require_token),
) -> list[dict[str, Any]]:
    if owner is not None and owner != caller.name and not caller.admin:
        raise ApiError(
            403, "forbidden", f"only an admin lists another user's secrets (your token: {caller.name})"
        )
    return secrets.list_secrets(request.app.state.runtime.store, owner or caller.name)


@router.put("/{name}", summary='Set one of your secrets (made, or replaced): {"value": "..."}')
def set_secret(
    request: Request,
    name: str,
    body: dict[str, Any] | None = Body(None, description='{"value": "hf_..."}'),
    caller: Caller = Depends(require_token),
) -> dict[str, Any]:
    given = fields(body, ("value",))
    return secrets.set_secret(request.app.state.runtime.store, caller.name, name, given.get("value"))


@router.delete("/{name}", summary="Delete one of your secrets: work naming it fails when it next starts")
def delete_secret(request: Request, name: str, caller: Caller = Depends(require_token)) -> dict[str, Any]:
    return secrets.delete_secret(request.app.state.runtime.store, caller.name, name)
