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

import bisect
from collections.abc import Callable
from typing import Final

from gpupool.scheduler.snapshot import WorkloadView

INFINITY: Final = float("inf")
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


ORDERINGS: Final[dict[str, Callable[[WorkloadView, tuple[float, ...]], OrderKey]]] = {
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


# The last order given for each group (queue) of pending work: see `in_order`. A pure cache that changes
# no result, bounded like the state's caches.
_LAST: Final[dict[str, _Order]] = {}
MAX_GROUPS: Final = 20_000
MAX_GONE: Final = 16  # views gone since the last order beyond which the order is made afresh


class _Order:
    """A group's order: its items as they were given, and their keys and views in ascending key order
    (the keys distinct, without NaN)."""

    __slots__ = ("items", "keys", "ordering", "thresholds", "views")

    def __init__(
        self,
        ordering: str,
        thresholds: tuple[float, ...],
        items: list[WorkloadView],
        keys: list[OrderKey],
        views: list[WorkloadView],
    ) -> None:
        self.ordering = ordering
        self.thresholds = thresholds
        self.items = items
        self.keys = keys
        self.views = views


def in_order(
    group: str, ordering: str, thresholds: tuple[float, ...], items: list[WorkloadView]
) -> list[WorkloadView]:
    """`items` sorted by `ordering`'s key, exactly as `sorted(items, key=...)` gives them.

    Callers (the simulator, the control loop) pass mostly the same view objects cycle after cycle, in
    the same order, with a few gone and a few new ones (mostly at the end). So this starts from the
    group's last order: the views still there keep their keys (a view is immutable, so its key is too)
    and their places, and only the new ones are keyed and inserted. When the keys are distinct (every
    key ends with the workload's id) and none holds a NaN, there is one order they sort to, whatever the
    starting arrangement: this one. Otherwise the items are sorted as they came, and not remembered.
    """
    key_of = ORDERINGS[ordering]
    last = _LAST.get(group)
    if last is None or last.ordering != ordering or last.thresholds != thresholds:
        return _afresh(group, ordering, key_of, thresholds, items)
    # Match the last items to these, in order, by identity: a view in neither place is gone, and these
    # items not matched are new (or moved: then they are both, which is still right, only slower).
    gone: list[WorkloadView] = []
    new: list[WorkloadView] = []
    j, n = 0, len(items)
    for w in last.items:
        if j < n and items[j] is w:
            j += 1
        elif j + 1 < n and items[j + 1] is w:
            new.append(items[j])
            j += 2
        else:
            gone.append(w)
            if len(gone) > MAX_GONE:
                return _afresh(group, ordering, key_of, thresholds, items)
    new.extend(items[j:])
    if not gone and not new:
        return list(last.views)
    keys: list[OrderKey] = []
    views: list[WorkloadView] = []
    if gone:
        last_keys, last_views = last.keys, last.views
        for i in range(len(last_views)):  # zip's `strict` would make this loop a call through Python
            w = last_views[i]
            if not _among(w, gone):
                keys.append(last_keys[i])
                views.append(w)
    else:
        keys = list(last.keys)
        views = list(last.views)
    for w in new:
        key = key_of(w, thresholds)
        at = bisect.bisect_right(keys, key)
        if has_nan(key) or (at > 0 and keys[at - 1] == key):
            return _afresh(group, ordering, key_of, thresholds, items)
        keys.insert(at, key)
        views.insert(at, w)
    _LAST[group] = _Order(ordering, thresholds, list(items), keys, views)
    return list(views)


def _afresh(
    group: str,
    ordering: str,
    key_of: Callable[[WorkloadView, tuple[float, ...]], OrderKey],
    thresholds: tuple[float, ...],
    items: list[WorkloadView],
) -> list[WorkloadView]:
    """`items` sorted, and remembered when their keys are distinct and free of NaN."""
    _LAST.pop(group, None)
    pairs = [(key_of(w, thresholds), w) for w in items]
    pairs.sort(key=_first)  # stable: equal keys keep the items' order, as sorted(items, key=...) would
    keys = [pair[0] for pair in pairs]
    for i, key in enumerate(keys):
        if has_nan(key) or (i > 0 and keys[i - 1] == key):
            return [pair[1] for pair in pairs]
    if len(_LAST) >= MAX_GROUPS:
        _LAST.clear()
    views = [pair[1] for pair in pairs]
    _LAST[group] = _Order(ordering, thresholds, list(items), keys, views)
    return list(views)


def _first(pair: tuple[OrderKey, WorkloadView]) -> OrderKey:
    return pair[0]


def _among(w: WorkloadView, views: list[WorkloadView]) -> bool:
    return any(other is w for other in views)


def has_nan(key: OrderKey) -> bool:
    return any(value != value for value in key)  # NaN is the one value unequal to itself
