"""What keeps reclaim from taking GPUs back for a queue within its quota: the running work of other queues
above their quotas that reclaim may not take, named, with when it becomes reclaimable.

The scheduler says only that reclaim found nothing ("the work beyond other queues' quotas is non-preemptible
or within its minimum runtime, or stopping it would not free room this work can use"); `gpupool why` and
the API's workload view add this list, read from the store when asked, so that a person sees which work
holds the GPUs and until when (Run:ai's and KAI-Scheduler's users ask the same of their projects).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.lifecycle import RUNNING
from gpupool.control.usage import attempt_gpus
from gpupool.spec.quantities import format_duration
from gpupool.store.models import Attempt, Queue, Workload
from gpupool.timeutil import as_utc, utcnow

NOTHING_TO_RECLAIM: Final = "reclaim found nothing to take for it"  # in the scheduler's explanation
SHOWN: Final = 5  # blockers named; the rest counted


def reclaim_blockers(s: Session, queue: str, now: datetime | None = None) -> list[str]:
    """Other queues' running work above their GPU quotas that reclaim may not take for `queue`'s work:
    non-preemptible, or not yet past its queue's `min_runtime_reclaim` (inherited from the parent where
    unset), oldest first; at most SHOWN, then how many more."""
    now = now or utcnow()
    specs = {name: (parent, spec or {}) for name, parent, spec in s.execute(select(Queue.name, Queue.parent,
                                                                                    Queue.spec))}  # fmt: skip
    mine = set(_chain(queue, specs))
    rows = s.execute(
        select(
            Workload.id, Workload.name, Workload.queue, Workload.preemptible, Attempt.started_at,
            Attempt.gpu_indices, Attempt.gpu_fraction, Attempt.pods, Attempt.stop_reason,
        )
        .join(Workload, Attempt.workload_id == Workload.id)
        .where(Attempt.state == RUNNING)
        .order_by(Attempt.started_at, Workload.id)
    ).all()  # fmt: skip
    held: dict[str, float] = {}
    for row in rows:
        for level in _chain(row.queue, specs):
            held[level] = held.get(level, 0.0) + attempt_gpus(row.gpu_indices, row.gpu_fraction, row.pods)
    found: list[str] = []
    for row in rows:
        if row.queue in mine or row.stop_reason:
            continue  # its own queue's (preempt's to judge), or stopping already
        over = [q for q in _chain(row.queue, specs) if q not in mine and held.get(q, 0.0) > _quota(specs, q)]
        if not over:
            continue  # within its quota: reclaim by quota takes none of it
        gpus = attempt_gpus(row.gpu_indices, row.gpu_fraction, row.pods)
        who = f"workload {row.id} ({row.name}, queue {row.queue}, {gpus:g} GPUs)"
        if not row.preemptible:
            found.append(f"{who}: non-preemptible, runs until it ends")
            continue
        floor = _min_runtime_reclaim(row.queue, specs)
        started = as_utc(row.started_at)
        if floor > 0 and started is not None and (now - started).total_seconds() < floor:
            free = started + timedelta(seconds=floor)
            found.append(
                f"{who}: within queue {row.queue}'s minimum runtime for reclaim ({format_duration(floor)}), "
                f"reclaimable from {free:%H:%M:%S} UTC"
            )
    if len(found) > SHOWN:
        found = [*found[:SHOWN], f"and {len(found) - SHOWN} more"]
    return found


def _chain(queue: str, specs: Mapping[str, tuple[str | None, Mapping[str, Any]]]) -> list[str]:
    """The queue and its ancestors, nearest first (a loop in bad data ends the walk)."""
    chain: list[str] = []
    at: str | None = queue
    while at is not None and at not in chain:
        chain.append(at)
        at = specs[at][0] if at in specs else None
    return chain


def _quota(specs: Mapping[str, tuple[str | None, Mapping[str, Any]]], queue: str) -> float:
    spec = specs.get(queue, (None, {}))[1]
    return float(((spec.get("resources") or {}).get("gpu") or {}).get("quota") or 0.0)


def _min_runtime_reclaim(queue: str, specs: Mapping[str, tuple[str | None, Mapping[str, Any]]]) -> float:
    """The queue's `min_runtime_reclaim`, else its nearest ancestor's, else 0 (as the scheduler reads it)."""
    for level in _chain(queue, specs):
        value = specs.get(level, (None, {}))[1].get("min_runtime_reclaim")
        if value is not None:
            return float(value)
    return 0.0
