"""A job array's %N (control/arrays.py): which pending tasks a pass gives the scheduler, and which wait."""

from __future__ import annotations

from gpupool.control.arrays import ARRAY_LIMIT, throttled


def test_the_lowest_pending_tasks_fill_what_the_running_ones_leave_under_the_limit() -> None:
    limits = {wid: (10, 3) for wid in range(10, 16)} | {20: (20, 1), 21: (20, 1)}
    held = throttled(pending=[12, 13, 14, 15, 21, 30], running=[10, 11, 20, 31], limits=limits)
    # array 10: 2 running, so task 12 may start and 13..15 wait; array 20: 1 running, so 21 waits;
    # 30 and 31 belong to no limited array
    assert sorted(held) == [13, 14, 15, 21]
    assert {e.code for e in held.values()} == {ARRAY_LIMIT}
    assert held[21].message.startswith("array 20 runs at most 1 of its tasks at once (its %1)")


def test_nothing_is_held_while_the_array_is_under_its_limit() -> None:
    assert throttled(pending=[1, 2], running=[], limits={1: (1, 2), 2: (1, 2)}) == {}
