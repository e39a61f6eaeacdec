"""Decayed historical GPU usage per queue: what tilts the over-quota split of fair share toward queues
that used less (the scheduler's `usage_weight`; see scheduler/fairshare.py).

A GPU-second used `age` seconds ago counts 2^(-age / half_life), as in Slurm's fair-share decay
(PriorityDecayHalfLife). For an attempt that held `gpus` GPUs from `start` to `end` the decayed usage
at `now` is the integral of gpus * 2^(-(now - t) / H) over [start, end], which has the closed form
gpus * H / ln 2 * (2^(-(now - end) / H) - 2^(-(now - start) / H)). Computed from the attempts in the
store, it survives restarts and needs no state of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


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
