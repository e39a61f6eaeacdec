"""Orders of pending work inside a queue, as named policies: each key starts with the negated priority
(higher priority first), then:

- fifo: submit time.
- attained: least attained GPU-service first (GPU-seconds), then submit time.
- las: Tiresias' discretized 2D-LAS: the attained-service band (thresholds in GPU-seconds), then FIFO.
- estimate: shortest estimated GPU-time first (duration estimate x GPUs), as QSSF and Lucid do with a
  learned estimate; work without an estimate goes after work with one.
- sjf-oracle / srtf-oracle: shortest (remaining) true duration first; they read `duration_estimate` as the
  truth and exist for reference in simulation only.
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.scheduler.snapshot import WorkloadView

INFINITY = float("inf")
OrderKey = tuple[float, ...]


def _fifo(w: WorkloadView, _: tuple[float, ...]) -> OrderKey:
    return (-w.priority, w.submit_time, w.id)


def _attained(w: WorkloadView, _: tuple[float, ...]) -> OrderKey:
    return (-w.priority, w.attained_service, w.submit_time, w.id)


def _las(w: WorkloadView, thresholds: tuple[float, ...]) -> OrderKey:
    return (-w.priority, float(_bisect_right(thresholds, w.attained_service)), w.submit_time, w.id)


def _bisect_right(a: tuple[float, ...], x: float) -> int:
    """`bisect.bisect_right(a, x)`, the same search written out: compiled, it runs without calling into
    the bisect module for each pending workload of each cycle."""
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _estimate(w: WorkloadView, _: tuple[float, ...]) -> OrderKey:
    estimate = w.duration_estimate
    gpu_time = INFINITY if estimate is None else estimate * max(w.gpu_units, 1.0)
    return (-w.priority, gpu_time, w.submit_time, w.id)


def _sjf(w: WorkloadView, _: tuple[float, ...]) -> OrderKey:
    estimate = INFINITY if w.duration_estimate is None else w.duration_estimate
    return (-w.priority, estimate, w.submit_time, w.id)


def _srtf(w: WorkloadView, _: tuple[float, ...]) -> OrderKey:
    if w.duration_estimate is None:
        return (-w.priority, INFINITY, w.submit_time, w.id)
    ran = w.attained_service / w.gpu_units if w.gpu_units > 0 else 0.0
    return (-w.priority, max(0.0, w.duration_estimate - ran), w.submit_time, w.id)


ORDERINGS: dict[str, Callable[[WorkloadView, tuple[float, ...]], OrderKey]] = {
    "fifo": _fifo,
    "attained": _attained,
    "las": _las,
    "estimate": _estimate,
    "sjf-oracle": _sjf,
    "srtf-oracle": _srtf,
}


def order_key(ordering: str) -> Callable[[WorkloadView, tuple[float, ...]], OrderKey]:
    try:
        return ORDERINGS[ordering]
    except KeyError:
        raise ValueError(f"unknown ordering {ordering!r}; one of {', '.join(ORDERINGS)}") from None
