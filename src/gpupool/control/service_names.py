"""A service by its name, for the head's proxy (`/api/v1/services/NAME/proxy/`): the one pending or running
service of that name, as the command line's names stand for workloads (cli/refs.py): a service's replicas
count as one, by its id; where several users run a service of one name, the name stands for the caller's
own when exactly one of them is theirs, and for none of them otherwise. A caller without a token owns
nothing. No HTTP here."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from sqlalchemy import select

from gpupool.control.access import PRIVATE, Access
from gpupool.control.errors import Conflict
from gpupool.control.lifecycle import ACTIVE, SERVICE, TERMINAL
from gpupool.spec.fields import NAME_PATTERN
from gpupool.spec.quantities import format_duration
from gpupool.store.db import Store
from gpupool.store.models import Workload
from gpupool.timeutil import age_seconds, utcnow

# How long after a service of a name ended a request for that name is told so (the 404 names it).
ENDED_LATELY: Final = 24 * 3600.0
_SHOWN: Final = 10  # the services an ambiguous name's error lists
_NAME: Final = re.compile(NAME_PATTERN)


@dataclass(frozen=True, slots=True)
class Named:
    """A pending or running service of a name: its id (replica 0's, the service's) and who may reach it."""

    service_id: int
    access: Access


def could_be_a_name(name: str) -> bool:
    """Whether `name` is a name a workload may have (else no service has it: nothing to read)."""
    return _NAME.fullmatch(name) is not None


def services_named(store: Store, name: str) -> tuple[Named, ...]:
    """The pending or running services named `name`, by id: a service's replicas as one (its owner and
    `access` as its own workload's, replica 0's, which `access.access_of` reads)."""
    if not could_be_a_name(name):
        return ()
    with store.read() as s:
        rows = s.execute(
            select(Workload.id, Workload.service_id, Workload.user, Workload.spec).where(
                Workload.state.in_(ACTIVE), Workload.name == name, Workload.kind == SERVICE
            )
        ).all()
    # per service, its own row (replica 0's) if active, else its lowest replica's
    found: dict[int, tuple[int, str, str]] = {}
    for workload_id, service_id, user, spec in rows:
        whole = service_id if service_id is not None else workload_id
        rank = 0 if workload_id == whole else workload_id
        if whole not in found or rank < found[whole][0]:
            found[whole] = (rank, user, (spec or {}).get("access") or PRIVATE)
    return tuple(Named(whole, Access(user, access)) for whole, (_, user, access) in sorted(found.items()))


def choose(named: Sequence[Named], name: str, caller: str | None) -> Named | None:
    """The one of `named` (the pending or running services of `name`) the name stands for: the only one, or
    the caller's own when exactly one of them is theirs (`caller`: the token's name; None without a
    token); None when there are none. Conflict (409) when several are and none or several are theirs."""
    if len(named) <= 1:
        return named[0] if named else None
    mine = [n for n in named if caller is not None and n.access.owner == caller]
    if len(mine) == 1:
        return mine[0]
    whose, listed = ("of your ", mine) if mine else ("", list(named))
    shown = ", ".join(f"{n.service_id} ({n.access.owner})" for n in listed[:_SHOWN])
    more = ", ..." if len(listed) > _SHOWN else ""
    raise Conflict(
        f"{len(listed)} {whose}pending or running services are named {name!r} (ids and owners: "
        f"{shown}{more}), and a name reaches one: reach the one you mean by its id, at "
        "/api/v1/workloads/ID/proxy/, or have all but one of them submitted again under another name",
        field="name",
    )


def missing(store: Store | None, name: str) -> str:
    """What a request for a name no pending or running service has is told: also which service of that
    name ended, and when, if one did in the last ENDED_LATELY seconds (read from `store`, a scan of the
    name's past work; None: not looked up)."""
    none = f"no pending or running service is named {name!r}"
    ended = _last_ended(store, name) if store is not None and could_be_a_name(name) else None
    if ended is None:
        return (
            f"{none} (`gpupool ps` lists the pool's work; a service is reached by the name it was submitted "
            "with, or by its id at /api/v1/workloads/ID/proxy/)"
        )
    whole, owner, state, ago = ended
    return (
        f"{none}: service {name} (workload {whole}, {owner}'s) ended {ago} ago ({state}); submit it again "
        "and this address reaches the new one"
    )


def _last_ended(store: Store, name: str) -> tuple[int, str, str, str] | None:
    """The service of `name` that ended last, if one did in the last ENDED_LATELY seconds: its id, owner,
    state, and how long ago."""
    with store.read() as s:
        row = s.execute(
            select(Workload.id, Workload.service_id, Workload.user, Workload.state, Workload.finished_at)
            .where(
                Workload.name == name,
                Workload.kind == SERVICE,
                Workload.state.in_(TERMINAL),
                Workload.finished_at >= utcnow() - timedelta(seconds=ENDED_LATELY),
            )
            .order_by(Workload.finished_at.desc(), Workload.id.desc())
            .limit(1)
        ).first()
    if row is None:
        return None
    workload_id, service_id, user, state, finished_at = row
    ago = format_duration(max(0, round(age_seconds(finished_at))))
    return (service_id if service_id is not None else workload_id), user, state, ago
