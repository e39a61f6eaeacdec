"""API tokens: who calls the API, and what they may do (docs/operations.md#users-and-roles).

Each token names its holder (`name`, the `user` of the work it submits and the actor of what it changes)
and has a role:
- `admin`: everything (the server makes the first one, named admin, at its first start);
- `user`: submit work (to the token's queues only, when it lists some) and cancel, hold, release, update
  and scale their own work; read everything;
- `viewer`: read only (GET), for dashboards and reports.

Only a token's SHA-256 hash is stored; the token itself is shown once, when made.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control import audit
from gpupool.control.errors import Conflict, Invalid, NotFound
from gpupool.spec.errors import SpecError
from gpupool.spec.fields import check_name
from gpupool.spec.queue import SYSTEM_QUEUE
from gpupool.store.db import Store
from gpupool.store.models import ApiToken, Queue, Workload
from gpupool.timeutil import as_utc

ADMIN, USER, VIEWER = "admin", "user", "viewer"
ROLES: Final = (ADMIN, USER, VIEWER)
ADMIN_NAME: Final = "admin"  # the server's own first token (`gpupool server --new-admin-token` replaces it)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a token says is calling."""

    name: str
    role: str
    queues: tuple[str, ...] = ()  # a user token's queues; () any

    @property
    def admin(self) -> bool:
        return self.role == ADMIN

    def may_submit_to(self, queue: str) -> bool:
        return self.role != VIEWER and (not self.queues or queue in self.queues)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "gpp_" + secrets.token_urlsafe(32)


def ensure_admin_token(store: Store) -> str | None:
    """Create the admin token on first start and return it (once); None if one exists already."""
    with store.session() as s:
        if s.scalar(select(ApiToken).where(ApiToken.name == ADMIN_NAME)) is not None:
            return None
        token = new_token()
        s.add(ApiToken(name=ADMIN_NAME, token_hash=hash_token(token), role=ADMIN, queues=[]))
        return token


def reset_admin_token(store: Store) -> str:
    token = new_token()
    with store.session() as s:
        existing = s.scalar(select(ApiToken).where(ApiToken.name == ADMIN_NAME))
        if existing is None:
            s.add(ApiToken(name=ADMIN_NAME, token_hash=hash_token(token), role=ADMIN, queues=[]))
        else:
            existing.token_hash = hash_token(token)
        audit.record(s, audit.TOKEN, ADMIN_NAME, "replaced (gpupool server --new-admin-token)", "system")
    return token


def caller_of(store: Store, token: str) -> Caller | None:
    """The holder of `token`, or None when it matches no token."""
    with store.read() as s:
        row = s.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
        return None if row is None else Caller(row.name, row.role, tuple(row.queues or ()))


# The names the head records as the actor of its own changes (events, audit), and the user its health
# check jobs run as (control/health_jobs.py): no token may carry one.
HEAD_ACTORS = frozenset(
    {
        "agent",
        "autoscaler",
        "bench-job",
        "budget",
        "control",
        "dependencies",
        "health",
        "idle",
        "scheduler",
        "slurm",
        "system",
    }
)


def create_token(
    store: Store, name: Any, role: Any = USER, queues: Any = None, *, actor: str = ADMIN_NAME
) -> dict[str, Any]:
    """A new token for a person or a script; the answer holds the token itself, shown this once."""
    try:
        name = check_name(name, "name")
    except SpecError as exc:
        raise Invalid(str(exc), field="name", example="alice") from None
    if name in HEAD_ACTORS:
        raise Invalid(
            f"name: {name!r} is what gpupool itself signs its own actions with (its health checks, control "
            "loop, scheduler...); a person with that name would act as it, and `gpupool audit --actor` "
            "could not tell them apart; pick another name, e.g. alice",
            field="name",
            example="alice",
        )
    if role not in ROLES:
        raise Invalid(f"role: {role!r} is not one of {', '.join(ROLES)}", field="role", example=USER)
    queues = [] if queues is None else queues
    if not isinstance(queues, list) or not all(isinstance(q, str) for q in queues):
        raise Invalid("queues: must be a list of queue names, e.g. [nlp]", field="queues", example='["nlp"]')
    if queues and role != USER:
        raise Invalid(
            f"queues: only a user token is kept to some queues (an {role} token would ignore them); "
            "drop them, or use role user",
            field="queues",
        )
    if SYSTEM_QUEUE in queues:
        where = f"queues[{queues.index(SYSTEM_QUEUE)}]"
        raise Invalid(
            f"{where}: {SYSTEM_QUEUE} is gpupool's own queue (its health checks); nobody submits there; "
            "name a team's queue",
            field=where,
            example="nlp",
        )
    token = new_token()
    with store.session() as s:
        known = set(s.scalars(select(Queue.name).where(Queue.name.in_(queues))))
        for i, queue in enumerate(queues):
            if queue not in known:
                raise Invalid(
                    f"queues[{i}]: no queue named {queue!r}; create it first (`gpupool queue create "
                    f"{queue}`) or list them with `gpupool queues`",
                    field=f"queues[{i}]",
                )
        if s.scalar(select(ApiToken.id).where(ApiToken.name == name)) is not None:
            raise Conflict(
                f"a token named {name!r} exists; revoke it first (`gpupool token revoke {name}`) or pick "
                "another name",
                field="name",
            )
        row = ApiToken(name=name, token_hash=hash_token(token), role=role, queues=sorted(set(queues)))
        s.add(row)
        kept = f", queues {', '.join(row.queues)}" if row.queues else ""
        audit.record(s, audit.TOKEN, name, f"created: role {role}{kept}", actor)
        s.flush()
        return {**token_view(row), "token": token}


def list_tokens(store: Store) -> list[dict[str, Any]]:
    with store.read() as s:
        return [token_view(row) for row in s.scalars(select(ApiToken).order_by(ApiToken.name))]


def revoke_token(store: Store, name: str, *, actor: str = ADMIN_NAME) -> dict[str, Any]:
    """Delete a token: it stops working at once on this head (other heads: within their cache's seconds)."""
    if name == ADMIN_NAME:
        raise Conflict(
            "the admin token is the server's own; replace it with `gpupool server --new-admin-token`",
            field="name",
        )
    with store.session() as s:
        row = s.scalar(select(ApiToken).where(ApiToken.name == name))
        if row is None:
            raise NotFound(f"no token named {name!r}; list them with `gpupool token list`")
        view = token_view(row)
        s.delete(row)
        audit.record(s, audit.TOKEN, name, f"revoked (role {row.role})", actor)
        return view


def token_view(row: ApiToken) -> dict[str, Any]:
    created = as_utc(row.created_at)
    return {
        "name": row.name,
        "role": row.role,
        "queues": list(row.queues or []),
        "created_at": created.isoformat() if created is not None else None,
    }


def known_user(s: Session, name: str) -> bool:
    """Someone who holds a token (work is submitted as the token's name), or who once submitted work."""
    if s.scalar(select(ApiToken.id).where(ApiToken.name == name)) is not None:
        return True
    return s.scalar(select(Workload.id).where(Workload.user == name).limit(1)) is not None
