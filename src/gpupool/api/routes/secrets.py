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


@router.get(
    "",
    summary="Your secrets' names (an admin: anyone's, with owner), never their values; `key`: the id of the "
    "key each is encrypted with, `unreadable`: why no key of the head opens it (else null)",
)
def list_secrets(
    request: Request,
    owner: str | None = Query(None, description="whose (admin); default: the caller's own"),
    caller: Caller = Depends(require_token),
) -> list[dict[str, Any]]:
    if owner is not None and owner != caller.name and not caller.admin:
        raise ApiError(
            403, "forbidden", f"only an admin lists another user's secrets (your token: {caller.name})"
        )
    runtime = request.app.state.runtime
    return secrets.list_secrets(runtime.store, runtime.secret_keys, owner or caller.name)


@router.put("/{name}", summary='Set one of your secrets (made, or replaced): {"value": "..."}')
def set_secret(
    request: Request,
    name: str,
    body: dict[str, Any] | None = Body(None, description='{"value": "hf_..."}'),
    caller: Caller = Depends(require_token),
) -> dict[str, Any]:
    given = fields(body, ("value",))
    runtime = request.app.state.runtime
    return secrets.set_secret(runtime.store, runtime.secret_keys, caller.name, name, given.get("value"))


@router.delete("/{name}", summary="Delete one of your secrets: work naming it fails when it next starts")
def delete_secret(request: Request, name: str, caller: Caller = Depends(require_token)) -> dict[str, Any]:
    runtime = request.app.state.runtime
    return secrets.delete_secret(runtime.store, runtime.secret_keys, caller.name, name)
