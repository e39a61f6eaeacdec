"""Join tokens and node credentials: how a node agent gets into the pool and proves who it is afterwards.

An operator creates a join token (`gpupool node join-token create --ttl 1h`); an agent presents it once,
at its first registration, and gets back a node credential of its own, which it keeps in its state dir
and presents on every later call. Both are kept only as SHA-256 hashes, like API tokens. A join token
admits new names only: a name whose agent still holds it (heard from within the node lease, or work still
listed on it) is refused, so a join token's holder cannot take over a running node and its work.
"""

from __future__ import annotations

import re
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
from gpupool.timeutil import as_utc, iso, utcnow

JOIN_PREFIX = "gpj_"
CREDENTIAL_PREFIX = "gpn_"
AGENT_BACKEND = "agent"
DEFAULT_JOIN_TTL = 3600.0  # seconds a join token admits agents when its creator names no ttl
# A node's name is a host name (RFC 1123): dot-separated labels of letters, digits and inner hyphens, 1-63
# characters each, 253 in all. It is printed by `gpupool nodes`, written into logs and paths, and
# passed to Slurm-style tools: no control characters, no shell syntax, no `..`.
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


class Unauthorized(ServiceError):
    status = 401
    code = "unauthorized"


class NameTaken(Conflict):
    """A join token names a node whose agent still holds it (the agent retries: it may be that node's
    replacement, waiting for the head to see the old agent lost)."""

    code = "node_name_taken"


def check_node_name(name: str) -> None:
    """Raise Invalid (field `name`) unless `name` is a host name (see _LABEL)."""
    if (
        not name
        or len(name) > 253
        or not all(_LABEL.fullmatch(label) for label in name.split("."))
        or not name.isascii()
    ):
        raise Invalid(
            f"node name {name[:80]!r}: use a host name, 1-253 characters of dot-separated labels of "
            "letters, digits and '-' (1-63 each, no '-' at either end); start the agent with --name",
            field="name",
            example="gpu-07.rack-3",
        )


def join_token_view(row: JoinToken) -> dict[str, Any]:
    expires = as_utc(row.expires_at)
    state = "revoked" if row.revoked_at else ("expired" if expires and expires <= utcnow() else "valid")
    return {
        "id": row.id,
        "prefix": row.prefix,
        "description": row.description,
        "state": state,
        "created_at": iso(row.created_at),
        "expires_at": iso(row.expires_at),
        "revoked_at": iso(row.revoked_at),
        "uses": row.uses,
        "last_used_at": iso(row.last_used_at),
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
    """A new join token; the token itself is in the answer once and never again. `ttl_seconds`: how long
    it admits new agents (None: until revoked). `gpus`: how many GPUs each node joining with it has
    (Slurm's configured Gres count): one that registers fewer is unhealthy."""
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
    still_held: Callable[[], str | None] = lambda: "the head cannot tell whether its agent is alive",
) -> str | None:
    """Admit node `name`: with a valid join token (a new credential is returned), or with the credential it
    got before (None is returned: it keeps it). Raises Unauthorized with the fix otherwise.

    A join token takes over a name that already has a credential only once `still_held()` says None:
    the agent backend answers why the old agent still holds the node (heard from within the lease, work
    listed on it), so the holder of a join token cannot take a live node's work, fencing token and secrets.

    Once admitted, the node is written as `described()` says (its GPUs, CPUs, labels) in the same
    transaction: a node that joins is never seen ready without its GPUs, waiting for a reconcile pass."""
    with store.session() as s, s.no_autoflush:
        issued = _admit(s, name, join_token, credential, still_held)
        s.flush()
        node = s.scalar(select(Node).where(Node.name == name).options(selectinload(Node.gpus)))
        inventory.apply_node(s, AGENT_BACKEND, described(), node)
        return issued


def _admit(
    s: Session,
    name: str,
    join_token: str | None,
    credential: str | None,
    still_held: Callable[[], str | None],
) -> str | None:
    node = s.scalar(select(Node).where(Node.name == name))
    if credential and node is not None and node.credential_hash == hash_token(credential):
        return None  # a node admitted before keeps its name, even one this head would not admit today
    check_node_name(name)
    if node is not None and node.backend != AGENT_BACKEND:
        raise Conflict(
            f"node {name!r} exists and is run by the {node.backend} backend, not by an agent; "
            "start the agent with another --name",
            field="name",
        )
    if credential and not join_token:
        deleted = inventory.deletion(s, name) if node is None else None
        if deleted is not None:
            at = as_utc(deleted.at)
            when = f" at {at:%Y-%m-%d %H:%M:%S} UTC" if at is not None else ""
            raise Unauthorized(
                f"node {name!r} was deleted from the pool by {deleted.actor}{when} (`gpupool node delete`), "
                "and its node credential with it; to join again, start the agent with a new --join-token "
                "(`gpupool node join-token create` on the head)"
            )
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
    if node is not None and node.credential_hash:
        held = still_held()
        if held is not None:
            raise NameTaken(
                f"node {name!r} belongs to the agent that joined with that name and is not lost ({held}); "
                "a join token cannot take it over. Another machine: start this agent with another --name. "
                "This machine reinstalled (its credential lost): stop the old agent; this one is let in "
                "once the head has seen the node lost (no heartbeat for --node-lease, no work left on it)",
                field="name",
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
    elif node.credential_hash:
        s.add(
            Event(
                object_kind="node",
                object_id=name,
                from_state=node.state,
                to_state=node.state,
                reason=f"joined again with join token {row.prefix}... (a new agent: the old one was lost)",
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
