"""Metrics of one simulated policy (definitions and sources in docs/simulator.md)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from gpupool.sim.results import SimResult


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default); None
    of no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all are equal, 1/n at worst."""
    if not values:
        return 1.0
    square = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * square) if square > 0 else 1.0


def summarize(result: SimResult) -> dict[str, Any]:
    """The JSON figures of one policy: `policies.<name>` in `sim run --json`. A figure of no jobs (the
    JCT of a queue none of whose jobs finished) is None, null in the JSON: not 0, which reads as news.

    `jobs` counts the jobs replayed (not dropped), overall and per queue, `finished` and `unfinished`
    split them; JCT, slowdown and queueing figures are over the finished jobs.

    `quota_violation` is the GPU-seconds queues wanted within their quotas but did not get, over their
    quota GPU-seconds, both summed over the leaf queues only (those with no queue under them): a parent's
    quota is what its children's quotas share out, so counting it too would count one guarantee twice in
    the denominator, and a parent's own shortfall is its subtree's. Flat queues and the same queues under
    a parent that adds no constraint give the same figure. A parent's own line (`queues.<parent>`)
    measures its subtree (its own jobs and all below) against its quota."""
    done = [j for j in result.jobs if j.finish is not None]
    jcts = [j.finish - j.submit for j in done if j.finish is not None]
    slowdowns = [(j.finish - j.submit) / j.duration for j in done if j.finish is not None and j.duration > 0]
    by_queue: dict[str, list[float]] = {}
    for j in done:
        if j.finish is not None and j.duration > 0:
            by_queue.setdefault(j.queue, []).append((j.finish - j.submit) / j.duration)
    queue_slowdown = {q: sum(v) / len(v) for q, v in sorted(by_queue.items())}
    replayed = Counter(j.queue for j in result.jobs)
    unfinished = Counter(j.queue for j in result.jobs if j.finish is None)
    window = result.arrival_window  # 0 when no job ran (every one dropped)
    quota_gpu_s = {q: quota * window for q, quota in result.quotas.items() if quota > 0 and window > 0}
    leaves = [q for q in quota_gpu_s if q not in result.parents]
    total_quota = sum(quota_gpu_s[q] for q in leaves)
    total_shortfall = sum(result.shortfall_gpu_s.get(q, 0.0) for q in leaves)
    window_gpu_s = result.cluster_gpus * window
    return {
        "jobs": len(result.jobs),
        "finished": len(done),
        "unfinished": result.unfinished,
        "dropped": len(result.dropped),
        "avg_jct_s": _mean(jcts),
        "p50_jct_s": percentile(jcts, 50),
        "p99_jct_s": percentile(jcts, 99),
        "mean_slowdown": _mean(slowdowns),
        "avg_queue_s": _mean([j.queued for j in done]),
        "makespan_s": max((j.finish for j in done if j.finish is not None), default=0.0),
        "gpu_util": result.busy_gpu_s / window_gpu_s if window_gpu_s > 0 else 0.0,
        "jain": jain(list(queue_slowdown.values())),
        "quota_violation": total_shortfall / total_quota if total_quota > 0 else 0.0,
        "preemptions": sum(j.preemptions for j in result.jobs),
        "lost_gpu_h": sum(j.lost_gpu_s for j in result.jobs) / 3600.0,
        "wall_s": result.wall_s,
        "decide_s": result.decide_s,
        "cycles": result.cycles,
        "queues": {
            q: {
                "jobs": replayed.get(q, 0),
                "finished": replayed.get(q, 0) - unfinished.get(q, 0),
                "unfinished": unfinished.get(q, 0),
                "mean_slowdown": queue_slowdown.get(q),
                "quota_gpus": result.quotas.get(q, 0.0),
                "quota_violation": (result.shortfall_gpu_s.get(q, 0.0) / quota_gpu_s[q])
                if q in quota_gpu_s
                else 0.0,
                "avg_jct_s": _mean(
                    [j.finish - j.submit for j in done if j.queue == q and j.finish is not None]
                ),
                "avg_queue_s": _mean([j.queued for j in done if j.queue == q]),
            }
            for q in sorted(set(replayed) | set(result.quotas))
        },
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
