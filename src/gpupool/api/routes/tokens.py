"""/api/v1/tokens: API tokens for people and scripts (admin), and /api/v1/whoami (control/tokens.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Request

from gpupool.api.auth import admin_only, require_token
from gpupool.api.body import fields
from gpupool.control import tokens
from gpupool.control.tokens import Caller

router = APIRouter(tags=["tokens"])


@router.post("/tokens", status_code=201, summary="Make a token (shown once) for a person or a script (admin)")
def create(
    request: Request,
    body: dict[str, Any] | None = Body(
        None, description='{"name": "alice", "role": "user", "queues": ["nlp"]}; role: admin, user, viewer'
    ),
    caller: Caller = Depends(admin_only),
) -> dict[str, Any]:
    given = fields(body, ("name", "role", "queues"))
    store = request.app.state.runtime.store
    return tokens.create_token(
        store, given.get("name"), given.get("role", tokens.USER), given.get("queues"), actor=caller.name
    )


@router.get("/tokens", summary="The tokens, by name and role (never the tokens themselves) (admin)")
def list_tokens(request: Request, _: Caller = Depends(admin_only)) -> list[dict[str, Any]]:
    return tokens.list_tokens(request.app.state.runtime.store)


@router.delete("/tokens/{name}", summary="Revoke a token: it stops working at once (admin)")
def revoke(request: Request, name: str, caller: Caller = Depends(admin_only)) -> dict[str, Any]:
    revoked = tokens.revoke_token(request.app.state.runtime.store, name, actor=caller.name)
    request.app.state.tokens.forget()
    return revoked


@router.get("/whoami", summary="Who this token says you are: name, role, the queues you may submit to")
def whoami(caller: Caller = Depends(require_token)) -> dict[str, Any]:
    return {"name": caller.name, "role": caller.role, "queues": list(caller.queues)}
