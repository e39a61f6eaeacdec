"""GPU use read from the attempts in the store: the GPUs an attempt held (`attempt_gpus`), each pending
or running workload's attained service (`AttainedService`), and decayed historical usage per queue, which
tilts the over-quota split of fair share toward queues that used less (the scheduler's `usage_weight`; see
scheduler/fairshare.py).

A GPU-second used `age` seconds ago counts 2^(-age / half_life), as in Slurm's fair-share decay
(PriorityDecayHalfLife). For an attempt that held `gpus` GPUs from `start` to `end` the decayed usage
at `now` is the integral of gpus * 2^(-(now - t) / H) over [start, end], which has the closed form
gpus * H / ln 2 * (2^(-(now - end) / H) - 2^(-(now - start) / H)). Computed from the attempts in the
store, it survives restarts and needs no state of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.store.models import Attempt
from gpupool.timeutil import as_utc


def decayed_gpu_seconds(gpus: float, start: float, end: float, now: float, half_life: float) -> float:
    """GPU-seconds of one interval, each weighted by 2^(-age / half_life) at `now`."""
    end = min(end, now)
    if end <= start or gpus <= 0:
        return 0.0
    if half_life <= 0:
        return 0.0
    rate = math.log(2.0) / half_life
    # = gpus / rate * (2^(-(now - end)/H) - 2^(-(now - start)/H)), written to stay exact for long half-lives
    return gpus / rate * math.exp(-rate * (now - end)) * -math.expm1(-rate * (end - start))


def queue_usage(
    intervals: Iterable[tuple[str, float, float, float]],
    parents: Mapping[str, str | None],
    now: float,
    half_life: float,
) -> dict[str, float]:
    """Decayed GPU-seconds per queue from (queue, gpus, start, end) intervals; a parent counts its
    children's usage too, since fair share splits among siblings at every level."""
    usage: dict[str, float] = {}
    for queue, gpus, start, end in intervals:
        amount = decayed_gpu_seconds(gpus, start, end, now, half_life)
        if amount <= 0:
            continue
        seen: set[str] = set()
        name: str | None = queue
        while name is not None and name not in seen:
            seen.add(name)
            usage[name] = usage.get(name, 0.0) + amount
            name = parents.get(name)
    return usage


def attempt_gpus(indices: Iterable[object] | None, fraction: float | None, pods: list[Any] | None) -> float:
    """GPUs an attempt held, over all its pods (a fraction of a GPU counts as that fraction)."""
    if pods:
        return sum(len(p.get("gpu_indices") or ()) * (p.get("gpu_fraction") or 1.0) for p in pods)
    return len(list(indices or ())) * (fraction or 1.0)


class AttainedService:
    """GPU-seconds each pending or running workload received in its earlier (ended) attempts: the attained
    service that least-attained-service ordering (`ordering: las`, Tiresias) ranks by, and from which the
    default policy's bands and young-work weights are computed (a running workload adds its current
    attempt's GPU-seconds so far; see control/policy.py).

    Read from the store for a workload when it becomes pending (its attempts cannot change while it
    waits), and kept until it runs again, so an unchanged pass gives the scheduler the same views; for a
    running workload when its attempt starts (keyed by the attempt's start), and kept while it runs."""

    def __init__(self) -> None:
        self._known: dict[int, float] = {}
        self._running: dict[tuple[int, float], float] = {}

    def of(self, s: Session, pending: list[int]) -> dict[int, float]:
        missing = [wid for wid in pending if wid not in self._known]
        self._known.update(_ended_attempts(s, missing))
        wanted = set(pending)
        self._known = {wid: value for wid, value in self._known.items() if wid in wanted}
        return self._known

    def of_running(self, s: Session, running: list[tuple[int, float]]) -> dict[tuple[int, float], float]:
        """The earlier attempts' GPU-seconds of running workloads, by (workload id, attempt start)."""
        missing = [key for key in running if key not in self._running]
        if missing:
            ended = _ended_attempts(s, [wid for wid, _ in missing])
            self._running.update({key: ended[key[0]] for key in missing})
        if len(self._running) > len(running):
            wanted = set(running)
            self._running = {key: value for key, value in self._running.items() if key in wanted}
        return self._running


def _ended_attempts(s: Session, workloads: list[int]) -> dict[int, float]:
    """GPU-seconds of the ended attempts of each workload (0 for one with none)."""
    out = dict.fromkeys(workloads, 0.0)
    for start in range(0, len(workloads), 500):
        chunk = workloads[start : start + 500]
        rows = s.execute(
            select(Attempt.workload_id, Attempt.gpu_indices, Attempt.gpu_fraction, Attempt.pods,
                   Attempt.started_at, Attempt.finished_at)
            .where(Attempt.workload_id.in_(chunk), Attempt.finished_at.is_not(None))
        ).all()  # fmt: skip
        for wid, indices, fraction, pods, started, finished in rows:
            begin, end = as_utc(started), as_utc(finished)
            if begin is not None and end is not None and end > begin:
                out[wid] += attempt_gpus(indices, fraction, pods) * (end - begin).total_seconds()
    return out
