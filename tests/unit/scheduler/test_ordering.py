"""Orders of pending work inside a queue: the band search of `las` is the bisect module's, including on
thresholds given as ints or out of order; `in_order`, which starts from a group's last order, gives what
sorting afresh gives, cycle after cycle, whatever comes and goes."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.scheduler import WorkloadView
from gpupool.scheduler.ordering import ORDERINGS, _bisect_right, in_order, order_key


@pytest.mark.parametrize(
    "thresholds", [(), (120.0,), (120.0, 57_600.0), (60, 3600), (3600.0, 60.0, 900.0), (1.0, 1.0, 2.0)]
)
def test_the_las_band_is_where_bisect_right_puts_the_attained_service(thresholds: tuple[float, ...]) -> None:
    for attained in (0.0, 1.0, 59.9, 60.0, 119.0, 120.0, 900.0, 3600.0, 57_600.0, 1e12):
        assert _bisect_right(thresholds, attained) == bisect.bisect_right(thresholds, attained)


def test_keys_put_priority_first_then_the_band_then_submit_time() -> None:
    las = order_key("las")
    thresholds = (120.0, 57_600.0)
    old_high = WorkloadView(1, "q", priority=5, submit_time=0.0, attained_service=1e6)
    new_low = WorkloadView(2, "q", priority=0, submit_time=10.0)
    served_low = WorkloadView(3, "q", priority=0, submit_time=5.0, attained_service=600.0)
    later_low = WorkloadView(4, "q", priority=0, submit_time=20.0, attained_service=60.0)
    ranked = sorted([later_low, served_low, new_low, old_high], key=lambda w: las(w, thresholds))
    assert [w.id for w in ranked] == [1, 2, 4, 3]


# A pool of views to draw each cycle's pending work from: ids repeat across views (a workload whose view
# was rebuilt), and some keys tie or hold a NaN, which no cache may paper over.
_POOL = [
    WorkloadView(
        i % 9,
        "q",
        priority=i % 3,
        submit_time=float(i % 5) if i != 17 else float("nan"),
        attained_service=float((i * 37) % 200),
        duration_estimate=None if i % 4 == 0 else float(i % 7),
    )
    for i in range(24)
]
_CYCLES = st.lists(
    st.lists(st.integers(min_value=0, max_value=len(_POOL) - 1), max_size=12).map(
        lambda picks: [_POOL[i] for i in picks]
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(ORDERINGS)), _CYCLES, st.integers(min_value=0, max_value=3))
def test_in_order_gives_what_sorting_gives_cycle_after_cycle(
    ordering: str, cycles: list[list[WorkloadView]], slide: int
) -> None:
    key_of = order_key(ordering)
    thresholds = (3.0, 150.0)
    carried = list(_POOL[:slide])  # a cycle that keeps most of the last one, as callers do
    for items in cycles:
        items = carried + items
        expected = [id(w) for w in sorted(items, key=lambda w: key_of(w, thresholds))]
        for _ in range(2):  # and again with nothing changed
            ranked = in_order(f"group-{ordering}", ordering, thresholds, items)
            assert [id(w) for w in ranked] == expected
        carried = items[1:]


def test_in_order_keeps_the_last_order_of_views_still_there_and_keys_only_new_ones() -> None:
    thresholds = (120.0, 57_600.0)
    views = [WorkloadView(i, "q", priority=0, submit_time=float(100 - i)) for i in range(6)]
    first = in_order("kept", "fifo", thresholds, views[:4])
    assert [w.id for w in first] == [3, 2, 1, 0]
    # One gone, one new in the middle, one new at the end: the newest submits come last.
    later = [views[0], views[5], views[2], views[3], views[4]]
    assert [w.id for w in in_order("kept", "fifo", thresholds, later)] == [5, 4, 3, 2, 0]
    # Another ordering of the same group is not mixed up with the one remembered.
    assert [w.id for w in in_order("kept", "las", thresholds, later)] == [5, 4, 3, 2, 0]
