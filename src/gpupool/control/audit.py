"""The audit log: who changed what, when. Every change goes into the store's `events` table in the
transaction that makes it: a workload's, an attempt's and a node's state changes (control/lifecycle.py),
notes in a workload's history (a priority changed, a replica asked to stop), and, recorded here, changes
of the pool's configuration that have no state of their own: queues (created, updated with what changed,
deleted), API tokens and join tokens (created, revoked; never the token itself), users' secrets (set,
replaced, deleted; never the value). `events` lists them for
an admin (`gpupool audit`), as Kubernetes' audit log and Slurm's `sacctmgr show transactions` do.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.errors import Invalid
from gpupool.store.db import Store
from gpupool.store.models import Event
from gpupool.timeutil import as_utc, utcnow

QUEUE: Final = "queue"
TOKEN: Final = "token"
JOIN_TOKEN: Final = "join-token"
SECRET: Final = "secret"  # a user's secret, as owner/name: set, replaced, deleted (never its value)
KINDS: Final = ("workload", "attempt", "node", QUEUE, TOKEN, JOIN_TOKEN, SECRET)
MAX_LISTED: Final = 10_000  # events one listing returns at most
MAX_SHOWN: Final = 120  # characters of a changed value the log keeps (a spec value can be long)


def record(s: Session, kind: str, name: str, change: str, actor: str) -> None:
    """Append to the log, in the caller's transaction, that `actor` made `change` to the `kind` `name`."""
    s.add(Event(object_kind=kind, object_id=name, reason=change, actor=actor, at=utcnow()))


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """What differs between two specs, field by field with dotted names: `resources.gpu.quota 8 -> 16;
    budget none -> {...}`; "nothing" when they are equal."""
    found: list[str] = []
    _diff(before, after, "", found)
    return "; ".join(found) if found else "nothing"


def settings(spec: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
    """A spec's fields that differ from `defaults`, with dotted names: `resources.gpu.quota 8.0; priority
    10`; "defaults" when none does."""
    found: list[str] = []
    _leaves(spec, defaults, "", found)
    return "; ".join(found) or "defaults"


def _leaves(value: Any, default: Any, path: str, found: list[str]) -> None:
    if isinstance(value, Mapping):
        default = default if isinstance(default, Mapping) else {}
        for key in sorted(value, key=str):
            _leaves(value[key], default.get(key), f"{path}.{key}" if path else str(key), found)
    elif value != default and value not in (None, "", [], {}):
        found.append(f"{path} {_shown(value)}")


def _diff(before: Any, after: Any, path: str, found: list[str]) -> None:
    # a section set or removed whole (user_limits none -> {...}) is said field by field, as a change is
    if isinstance(before, Mapping) and (isinstance(after, Mapping) or after is None):
        after = after or {}
    elif before is None and isinstance(after, Mapping):
        before = {}
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        for key in sorted(set(before) | set(after), key=str):
            _diff(before.get(key), after.get(key), f"{path}.{key}" if path else str(key), found)
    elif before != after:
        found.append(f"{path} {_shown(before)} -> {_shown(after)}")


def _shown(value: Any) -> str:
    """A value as a person writes it: 2, not 2.0; none; a list's items; a mapping's `key: value`s."""
    if value is None:
        text = "none"
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, Mapping):
        text = "{" + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) + "}"
    elif isinstance(value, list | tuple):
        text = "[" + ", ".join(_shown(v) for v in value) + "]"
    else:
        text = str(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def list_events(
    store: Store,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    kind: str | None = None,
    name: str | None = None,
    actor: str | None = None,
    limit: int = 200,
) -> list[dict[str, Any]]:
    """The log's entries that match, newest first, at most `limit`."""
    if kind is not None and kind not in KINDS:
        raise Invalid(f"kind: {kind!r} is not one of {', '.join(KINDS)}", field="kind", example=QUEUE)
    if name is not None and kind is None:
        raise Invalid(
            "object: name its kind too, e.g. `gpupool audit --kind queue --object nlp` (API: "
            "?kind=queue&object=nlp)",
            field="kind",
            example=QUEUE,
        )
    since, until = as_utc(since), as_utc(until)
    if since is not None and until is not None and since >= until:
        raise Invalid(
            f"since ({since.isoformat()}) is not before until ({until.isoformat()})",
            field="since",
            example="2026-12-01T00:00:00Z",
        )
    if not 1 <= limit <= MAX_LISTED:
        raise Invalid(f"limit: {limit} is not 1..{MAX_LISTED}", field="limit", example="200")
    query = select(Event).order_by(Event.id.desc()).limit(limit)
    if since is not None:
        query = query.where(Event.at >= since)
    if until is not None:
        query = query.where(Event.at < until)
    for column, wanted in ((Event.object_kind, kind), (Event.object_id, name), (Event.actor, actor)):
        if wanted is not None:
            query = query.where(column == wanted)
    with store.read() as s:
        return [event_view(e) for e in s.scalars(query)]


def event_view(event: Event) -> dict[str, Any]:
    at = as_utc(event.at)
    return {
        "id": event.id,
        "at": at.isoformat() if at is not None else None,
        "actor": event.actor,
        "kind": event.object_kind,
        "object": event.object_id,
        "from": event.from_state or None,
        "to": event.to_state or None,
        "change": event.reason,
    }
