"""How many replicas a service runs: scaled by hand, within an autoscaled service's range, or by the
autoscaler (control/autoscale.py). No HTTP here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm.exc import StaleDataError

from gpupool.control.changes import cancel_one
from gpupool.control.errors import Conflict, Invalid
from gpupool.control.lifecycle import ACTIVE, RUNNING, SERVICE, note
from gpupool.control.restarts import RESTART_BACKOFF
from gpupool.control.submission import note_submitted, replica_like
from gpupool.control.workloads import (
    Live,
    Ready,
    get_workload,
    kept_replicas,
    load_service,
    pending_or_running,
    pending_reason,
    readiness_of,
    replicas_of,
)
from gpupool.spec.replicas import MAX_REPLICAS
from gpupool.store.db import Store
from gpupool.store.models import Workload


def _removal_rank(workload: Workload, readiness: Ready | None, live: Live | None) -> int:
    """How much a replica serves, for a scale-down, which removes the least first: 0 running and ready
    (by its probe, or without one), 1 running but not ready (or not probed yet: `readiness` None counts
    every running one alike), 2 waiting out a crash-loop backoff, 3 waiting for the scheduler."""
    last = workload.attempts[-1] if workload.attempts else None
    if workload.state == RUNNING:
        probed = readiness_of(workload, last, readiness) if readiness is not None else None
        return 1 if probed is not None and not probed.ready else 0
    return 2 if pending_reason(workload, live)[1] == RESTART_BACKOFF else 3


def scale(
    store: Store,
    workload_id: int,
    replicas: int,
    *,
    actor: str = "admin",
    why: str | None = None,
    readiness: Ready | None = None,
    live: Live | None = None,
) -> dict[str, Any]:
    """Run `replicas` copies of the service `workload_id` names: new ones (the lowest replica numbers
    free) pending for the scheduler, or some cancelled, those that serve least first (`_removal_rank`,
    by the prober's word `readiness` and the loop's `live` reasons), the highest numbers first among
    equals (each running one stopped with its grace period); never replica 0, the service's own (its id
    is the service's, which `gpupool show`, the proxy's address and the service's history go by).
    `why` is the autoscaler's reason (control/autoscale.py); without it, a person asked, which a service
    with `scaling` in its spec refuses (the autoscaler would undo it). Returns the service's detail."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise Invalid(
            f"replicas must be 1..{MAX_REPLICAS}, got {replicas}"
            + ("; to stop a service, cancel it" if replicas < 1 else ""),
            field="replicas",
            example="2",
        )
    for _ in range(5):
        try:
            with store.session() as s:
                workload = load_service(
                    s, workload_id, "has replicas (kind: service, or `gpupool run --service --replicas N`)"
                )
                group = replicas_of(s, workload)
                kept = kept_replicas(group)
                if not kept:
                    raise Conflict(
                        f"service {workload.name} (workload {workload.service_id}) has ended or is "
                        f"stopping ({workload.state}); submit it again with replicas: {replicas}"
                    )
                scaling = kept[0].spec.get("scaling")
                if why is None and scaling:
                    raise Conflict(
                        f"service {workload.name} (workload {workload.service_id}) scales itself between "
                        f"{scaling['min']} and {scaling['max']} replicas by {scaling['metric']} (its spec's "
                        f"scaling); change its range instead, e.g. `gpupool scale {workload.service_id} "
                        f"{replicas}..{max(scaling['max'], replicas)}` for at least {replicas}",
                        field="replicas",
                    )
                reason = why or f"scaled to {replicas_said(replicas)} by {actor}"
                spec = {**kept[0].spec, "replicas": replicas}
                for replica in kept:
                    replica.spec = spec
                held = {
                    w.replica for w in pending_or_running(group)
                }  # a stopping one's number is not free yet
                free = (r for r in range(MAX_REPLICAS + len(held)) if r not in held)
                added = [replica_like(s, kept[0], next(free)) for _ in range(replicas - len(kept))]
                if added:
                    s.flush()
                    note_submitted(s, added, reason, actor)
                # Kept: replica 0 (the service's own id), then those that serve most, the lowest numbers
                # first among equals.
                ranked = sorted(
                    kept, key=lambda w: (w.replica != 0, _removal_rank(w, readiness, live), w.replica)
                )
                removed = ranked[replicas:]
                for replica in removed:
                    cancel_one(s, replica, reason, actor)
                    if replica.state == RUNNING:  # it stops with its grace period: say why in its history
                        replica.reason = f"stopping: {reason}"
                        note(s, replica, replica.reason, actor=actor)
                head = next((w for w in kept if w.replica == 0), None)
                if head is not None and (added or removed) and head not in removed:
                    note(s, head, reason, actor=actor)  # the service's own history says each change
                if removed or head is not None:
                    s.flush()
                service_id = workload.service_id or workload.id
        except StaleDataError:
            continue  # the control loop changed a replica at the same moment: read again, decide again
        return get_workload(store, service_id)
    raise Conflict(f"service {workload_id} is changing state; try again")


def replicas_said(count: int) -> str:
    """ "1 replica", "3 replicas"."""
    return f"{count} replica" if count == 1 else f"{count} replicas"


def scale_range(
    store: Store, workload_id: int, low: int, high: int, *, actor: str = "admin"
) -> dict[str, Any]:
    """Set the range `low..high` within which the autoscaler keeps the service `workload_id` names (one
    with `scaling` in its spec); a count outside the new range is brought into it at once. Returns the
    service's detail."""
    if not 1 <= low <= high <= MAX_REPLICAS:
        raise Invalid(
            f"replicas {low}..{high} is not a range MIN..MAX with 1 <= MIN <= MAX <= {MAX_REPLICAS}",
            field="replicas",
            example="2..6",
        )
    reason = f"scaling range set to {low}..{high} by {actor}"
    for _ in range(5):
        try:
            with store.session() as s:
                workload = load_service(s, workload_id, "has replicas to scale")
                kept = kept_replicas(replicas_of(s, workload))
                if not kept:
                    raise Conflict(
                        f"service {workload.name} (workload {workload.service_id}) has ended or is "
                        f"stopping ({workload.state}); submit it again with replicas: {low}..{high}"
                    )
                scaling = kept[0].spec.get("scaling")
                if not scaling:
                    raise Conflict(
                        f"service {workload.name} (workload {workload.service_id}) runs a fixed number of "
                        f"replicas (no scaling in its spec): give a number, e.g. `gpupool scale "
                        f"{workload.service_id} {low}`",
                        field="replicas",
                    )
                spec = {**kept[0].spec, "scaling": {**scaling, "min": low, "max": high}}
                for replica in kept:
                    replica.spec = spec
                head = kept[0]
                note(s, head, reason, actor=actor)
                count, service_id = len(kept), head.service_id or head.id
        except StaleDataError:
            continue  # the control loop changed a replica at the same moment: read again, decide again
        clamped = min(high, max(low, count))
        if clamped != count:
            return scale(
                store, service_id, clamped, actor=actor, why=f"scaled to {replicas_said(clamped)}: {reason}"
            )
        return get_workload(store, service_id)
    raise Conflict(f"service {workload_id} is changing state; try again")


@dataclass(frozen=True, slots=True)
class Autoscaled:
    """A service whose spec has `scaling`, as the autoscaler sees it."""

    service_id: int
    name: str
    ids: tuple[int, ...]  # its replicas' ids, pending or running: a request may name any of them
    replicas: int  # pending or running, not asked to stop
    scaling: dict[str, Any]  # the spec's `scaling`, as stored


def autoscaled(store: Store) -> list[Autoscaled]:
    """The services with `scaling` in their spec that still run (some replica not asked to stop)."""
    groups: dict[int, list[Workload]] = {}
    with store.read() as s:
        for w in s.scalars(
            select(Workload)
            .where(Workload.kind == SERVICE, Workload.state.in_(sorted(ACTIVE)))
            .order_by(Workload.id)
        ):
            groups.setdefault(w.service_id or w.id, []).append(w)
    found = []
    for service_id, group in groups.items():
        kept = kept_replicas(group)
        scaling = kept[0].spec.get("scaling") if kept else None
        if scaling:
            ids = tuple(w.id for w in group)
            found.append(Autoscaled(service_id, kept[0].name, ids, len(kept), scaling))
    return found
