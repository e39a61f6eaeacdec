"""Deleting finished workloads the head no longer keeps (today: check jobs past their retention,
control/health_jobs.py): each goes with its attempts, its events and its log and run directories on the
head, and its GPU-hours move to its queue's row in `retired_usage`, so `gpupool_gpu_hours_total` (counted
from the attempts plus that row) never goes down.

Only finished workloads with no attempt still running are deleted, checked again inside the deleting
transaction. Callers pass small batches: each batch is one short write transaction.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Collection
from pathlib import Path

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gpupool.control.lifecycle import RUNNING, TERMINAL
from gpupool.control.usage import attempt_gpus
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Event, RetiredUsage, Workload
from gpupool.timeutil import as_utc, utcnow

log = logging.getLogger("gpupool.retention")


def delete_finished(store: Store, workload_ids: Collection[int]) -> list[int]:
    """Delete these workloads where they are finished and nothing of theirs runs; returns those deleted."""
    if not workload_ids:
        return []
    with store.session() as s:
        finished = dict(
            s.execute(
                select(Workload.id, Workload.queue).where(
                    Workload.id.in_(list(workload_ids)), Workload.state.in_(TERMINAL)
                )
            ).all()
        )
        attempts = s.execute(
            select(
                Attempt.workload_id,
                Attempt.queue,
                Attempt.state,
                Attempt.gpu_indices,
                Attempt.gpu_fraction,
                Attempt.pods,
                Attempt.started_at,
                Attempt.finished_at,
                Attempt.log_path,
                Attempt.run_dir,
            ).where(Attempt.workload_id.in_(list(finished)))
        ).all()
        for row in attempts:
            if row.state == RUNNING:  # a finished workload whose attempt is not settled yet: later
                finished.pop(row.workload_id, None)
        hours: dict[str, float] = {}
        paths: list[tuple[int, str, str]] = []
        for row in attempts:
            if row.workload_id not in finished:
                continue
            queue = row.queue  # where its GPU-hours were spent (pending work may have moved since)
            start, end = as_utc(row.started_at), as_utc(row.finished_at)
            if start is not None and end is not None:
                seconds = max(0.0, end.timestamp() - start.timestamp())
                gpu_hours = attempt_gpus(row.gpu_indices, row.gpu_fraction, row.pods) * seconds / 3600.0
                hours[queue] = hours.get(queue, 0.0) + gpu_hours
            paths.append((row.workload_id, row.log_path, row.run_dir))
        ids = sorted(finished)
        if not ids:
            return []
        per_queue: dict[str, int] = {}
        for queue in finished.values():
            per_queue[queue] = per_queue.get(queue, 0) + 1
        _retire(s, per_queue, hours)
        s.execute(
            delete(Event).where(Event.object_kind == "workload", Event.object_id.in_([str(i) for i in ids])),
            execution_options={"synchronize_session": False},
        )
        s.execute(
            delete(Attempt).where(Attempt.workload_id.in_(ids)),
            execution_options={"synchronize_session": False},
        )
        s.execute(
            delete(Workload).where(Workload.id.in_(ids)), execution_options={"synchronize_session": False}
        )
    for workload_id, log_path, run_dir in paths:
        _remove_dir(workload_id, log_path, "logs")
        _remove_dir(workload_id, run_dir, "runs")
    log.info("event=workloads_deleted count=%d first=%d last=%d", len(ids), ids[0], ids[-1])
    return ids


def _retire(s: Session, workloads: dict[str, int], hours: dict[str, float]) -> None:
    """Add deleted workloads and their GPU-hours to their queues' retired usage (in the same transaction)."""
    for queue, count in workloads.items():
        row = s.get(RetiredUsage, queue)
        if row is None:
            row = RetiredUsage(queue=queue, gpu_hours=0.0, workloads=0)
            s.add(row)
        row.gpu_hours += hours.get(queue, 0.0)
        row.workloads += count
        row.updated_at = utcnow()


def _remove_dir(workload_id: int, recorded: str, kind: str) -> None:
    """Remove the head's `<home>/<kind>/<workload id>/` directory that holds a recorded path (the control
    loop's layout, carry_out.CarryingOut._start); any other path is left alone."""
    if not recorded:
        return
    directory = Path(recorded).parent
    if directory.name != str(workload_id) or directory.parent.name != kind:
        return
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:  # another attempt's path removed it, or the files live on an agent node
        pass
    except OSError as exc:  # the rows are gone; a directory left over is only disk
        log.warning("event=workload_files_not_removed workload=%d path=%s error=%r", workload_id, directory,
                    str(exc))  # fmt: skip


def retired_gpu_hours(s: Session) -> dict[str, float]:
    """GPU-hours of deleted workloads, per queue."""
    return {
        queue: float(hours) for queue, hours in s.execute(select(RetiredUsage.queue, RetiredUsage.gpu_hours))
    }
