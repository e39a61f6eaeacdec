"""What keeps reclaim from taking GPUs back for a queue within its quota: the running work of other queues
above their quotas that reclaim may not take, named, with when it becomes reclaimable.

The scheduler says only that reclaim found nothing ("the work beyond other queues' quotas is non-preemptible
or within its minimum runtime, or stopping it would not free room this work can use"); `gpupool why` and
the API's workload view add this list, read from the store when asked, so that a person sees which work
holds the GPUs and until when (Run:ai's and KAI-Scheduler's users ask the same of their projects).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.accounting import gpu_quota
from gpupool.control.budgets import chain
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
    parents: dict[str, str | None] = {}
    quotas: dict[str, float] = {}
    floors: dict[str, float | None] = {}  # each queue's own min_runtime_reclaim (None: its parent's)
    for name, parent, spec in s.execute(select(Queue.name, Queue.parent, Queue.spec)):
        parents[name], quotas[name] = parent, gpu_quota(spec)
        floors[name] = (spec or {}).get("min_runtime_reclaim")
    mine = set(chain(queue, parents))
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
        for level in chain(row.queue, parents):
            held[level] = held.get(level, 0.0) + attempt_gpus(row.gpu_indices, row.gpu_fraction, row.pods)
    found: list[str] = []
    for row in rows:
        if row.queue in mine or row.stop_reason:
            continue  # its own queue's (preempt's to judge), or stopping already
        levels = chain(row.queue, parents)
        if not any(q not in mine and held.get(q, 0.0) > quotas.get(q, 0.0) for q in levels):
            continue  # within its quota: reclaim by quota takes none of it
        gpus = attempt_gpus(row.gpu_indices, row.gpu_fraction, row.pods)
        who = f"workload {row.id} ({row.name}, queue {row.queue}, {gpus:g} GPUs)"
        if not row.preemptible:
            found.append(f"{who}: non-preemptible, runs until it ends")
            continue
        floor = next((float(f) for q in levels if (f := floors.get(q)) is not None), 0.0)
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
