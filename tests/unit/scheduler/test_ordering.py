"""Orders of pending work inside a queue: the band search of `las` is the bisect module's, including on
thresholds given as ints or out of order."""

from __future__ import annotations

import bisect

import pytest

from gpupool.scheduler import WorkloadView
from gpupool.scheduler.ordering import _bisect_right, order_key


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
