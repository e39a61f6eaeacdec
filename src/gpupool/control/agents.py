"""Join tokens and node credentials: how a node agent gets into the pool and proves who it is afterwards.

An operator creates a join token (`gpupool node join-token create --ttl 1h`); an agent presents it once,
at its first registration, and gets back a node credential of its own, which it keeps in its state dir
and presents on every later call. Both are kept only as SHA-256 hashes, like API tokens.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session, selectinload

from gpupool.backends.base import InventoryNode
from gpupool.control import audit, inventory
from gpupool.control.errors import Conflict, Invalid, NotFound, ServiceError
from gpupool.control.tokens import hash_token
from gpupool.store.db import Store
from gpupool.store.models import Event, JoinToken, Node
from gpupool.timeutil import as_utc, utcnow

JOIN_PREFIX = "gpj_"
CREDENTIAL_PREFIX = "gpn_"
AGENT_BACKEND = "agent"


class Unauthorized(ServiceError):
    status = 401
    code = "unauthorized"


def _iso(value: Any) -> str | None:
    value = as_utc(value)
    return value.isoformat() if value is not None else None


def join_token_view(row: JoinToken) -> dict[str, Any]:
    expires = as_utc(row.expires_at)
    state = "revoked" if row.revoked_at else ("expired" if expires and expires <= utcnow() else "valid")
    return {
        "id": row.id,
        "prefix": row.prefix,
        "description": row.description,
        "state": state,
        "created_at": _iso(row.created_at),
        "expires_at": _iso(row.expires_at),
        "revoked_at": _iso(row.revoked_at),
        "uses": row.uses,
        "last_used_at": _iso(row.last_used_at),
        "gpus": row.gpus,
    }


MAX_DECLARED_GPUS = 1024


def _declared(gpus: object) -> int | None:
    """A join token's GPUs per node: a whole number 0..MAX_DECLARED_GPUS, or None (nothing declared)."""
    if gpus is None:
        return None
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= MAX_DECLARED_GPUS:
        raise Invalid(
            f"gpus must be a whole number of GPUs per node, 0..{MAX_DECLARED_GPUS}, got {gpus!r}",
            field="gpus",
            example="8",
        )
    return gpus


def create_join_token(
    store: Store,
    ttl_seconds: float | None,
    description: str = "",
    *,
    gpus: object = None,
    actor: str = "admin",
) -> dict[str, Any]:
    """A new join token; the token itself is in the answer once and never again. `gpus`: how many GPUs each
    node joining with it has (Slurm's configured Gres count): one that registers fewer is unhealthy."""
    if ttl_seconds is not None and ttl_seconds <= 0:
        raise Invalid(f"ttl must be longer than 0 seconds, got {ttl_seconds:g}", field="ttl", example="1h")
    declared = _declared(gpus)
    token = JOIN_PREFIX + secrets.token_urlsafe(24)
    with store.session() as s:
        row = JoinToken(
            token_hash=hash_token(token),
            prefix=token[:10],
            description=description,
            expires_at=utcnow() + timedelta(seconds=ttl_seconds) if ttl_seconds is not None else None,
            uses=0,
            gpus=declared,
        )
        s.add(row)
        s.flush()
        ttl = f"expires {row.expires_at.isoformat()}" if row.expires_at is not None else "never expires"
        said = f", {description!r}" if description else ""
        each = f", {declared} GPUs per node" if declared is not None else ""
        audit.record(s, audit.JOIN_TOKEN, str(row.id), f"created: {row.prefix}..., {ttl}{each}{said}", actor)
        return {**join_token_view(row), "token": token}


def list_join_tokens(store: Store) -> list[dict[str, Any]]:
    with store.read() as s:
        return [join_token_view(r) for r in s.scalars(select(JoinToken).order_by(JoinToken.id))]


def revoke_join_token(store: Store, ident: str, *, actor: str = "admin") -> dict[str, Any]:
    """Revoke by id or by prefix (as `join-token list` shows it). Nodes that joined with it stay."""
    with store.session() as s:
        rows = s.scalars(select(JoinToken)).all()
        matches = [r for r in rows if str(r.id) == ident or (len(ident) >= 6 and r.prefix.startswith(ident))]
        if not matches:
            raise NotFound(f"no join token {ident!r}; list them with `gpupool node join-token list`")
        if len(matches) > 1:
            raise Conflict(f"{ident!r} matches {len(matches)} join tokens; give the id instead")
        row = matches[0]
        if row.revoked_at is None:
            row.revoked_at = utcnow()
            audit.record(s, audit.JOIN_TOKEN, str(row.id), f"revoked: {row.prefix}...", actor)
        s.flush()
        return join_token_view(row)


def register(
    store: Store,
    name: str,
    *,
    join_token: str | None,
    credential: str | None,
    described: Callable[[], InventoryNode],
) -> str | None:
    """Admit node `name`: with a valid join token (a new credential is returned), or with the credential it
    got before (None is returned: it keeps it). Raises Unauthorized with the fix otherwise.

    Once admitted, the node is written as `described()` says (its GPUs, CPUs, labels) in the same
    transaction: a node that joins is never seen ready without its GPUs, waiting for a reconcile pass."""
    if not name or len(name) > 253 or any(c.isspace() or c == "/" for c in name):
        raise Invalid(f"node name {name!r}: use 1-253 characters without spaces or '/'", field="name")
    with store.session() as s, s.no_autoflush:
        issued = _admit(s, name, join_token, credential)
        s.flush()
        node = s.scalar(select(Node).where(Node.name == name).options(selectinload(Node.gpus)))
        inventory.apply_node(s, AGENT_BACKEND, described(), node)
        return issued


def _admit(s: Session, name: str, join_token: str | None, credential: str | None) -> str | None:
    node = s.scalar(select(Node).where(Node.name == name))
    if node is not None and node.backend != AGENT_BACKEND:
        raise Conflict(
            f"node {name!r} exists and is run by the {node.backend} backend, not by an agent; "
            "start the agent with another --name",
            field="name",
        )
    if credential:
        if node is not None and node.credential_hash == hash_token(credential):
            return None
        if not join_token:
            raise Unauthorized(
                f"the node credential of {name!r} is not known to this head (its store was replaced, or "
                "the node was removed); start the agent with a new --join-token "
                "(`gpupool node join-token create` on the head)"
            )
    if not join_token:
        raise Unauthorized("no join token: pass --join-token (`gpupool node join-token create` on the head)")
    row = s.scalar(select(JoinToken).where(JoinToken.token_hash == hash_token(join_token)))
    if row is None:
        raise Unauthorized(
            "invalid join token: it matches no join token of this head; create one with "
            "`gpupool node join-token create` and pass it as --join-token"
        )
    if row.revoked_at is not None:
        raise Unauthorized(
            f"join token {row.prefix}... was revoked; create a new one with `gpupool node join-token create`"
        )
    expires = as_utc(row.expires_at)
    if expires is not None and expires <= utcnow():
        raise Unauthorized(
            f"join token {row.prefix}... expired at {expires.isoformat()}; create a new one with "
            "`gpupool node join-token create --ttl 1h`"
        )
    row.uses += 1
    row.last_used_at = utcnow()
    issued = CREDENTIAL_PREFIX + secrets.token_urlsafe(32)
    declares = f" (it declares {row.gpus} GPUs per node)" if row.gpus is not None else ""
    if node is None:
        node = Node(name=name, state="ready", state_reason="", labels={}, backend=AGENT_BACKEND)
        s.add(node)
        s.add(
            Event(
                object_kind="node",
                object_id=name,
                from_state="",
                to_state="ready",
                reason=f"joined with join token {row.prefix}...{declares}",
                actor=AGENT_BACKEND,
            )
        )
    if row.gpus is not None and node.expected_gpus is None:
        # The GPUs it must have, before it has registered any (a node that joins short of a GPU is
        # caught); a node whose GPUs are known already keeps them (`gpupool node accept-gpus`).
        node.declared_gpus = row.gpus
    node.credential_hash = hash_token(issued)
    return issued


def credential_names(store: Store) -> dict[str, str]:
    """Every agent node's credential hash -> its name, in one query."""
    with store.read() as s:
        return {
            digest: name
            for digest, name in s.execute(
                select(Node.credential_hash, Node.name).where(
                    Node.backend == AGENT_BACKEND, Node.credential_hash.is_not(None)
                )
            )
            if digest
        }


def agent_node_names(store: Store) -> tuple[str, ...]:
    """Every node the agents registered (a restarted head waits a lease for them to come back)."""
    with store.read() as s:
        return tuple(s.scalars(select(Node.name).where(Node.backend == AGENT_BACKEND).order_by(Node.name)))


def record_heartbeats(store: Store, seen: dict[str, float]) -> None:
    """Write each agent node's last heartbeat (epoch seconds) in one statement (`gpupool nodes` shows it)."""
    if not seen:
        return
    table = cast(Table, Node.__table__)
    statement = (
        update(table)
        .where(table.c.name == bindparam("node"), table.c.backend == AGENT_BACKEND)
        .values(last_heartbeat=bindparam("at"))
    )
    rows = [{"node": name, "at": datetime.fromtimestamp(at, UTC)} for name, at in seen.items()]
    with store.session() as s:
        s.execute(statement, rows)
