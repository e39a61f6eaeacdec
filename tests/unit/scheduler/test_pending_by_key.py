"""The work left to place, by id (`prepare.by_key`): built from the last cycle's answer where callers pass
mostly the same views, it must be exactly the dict a fresh walk gives: keys, values and order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.scheduler import WorkloadView
from gpupool.scheduler.prepare import _LAST_PENDING, by_key

# Views to draw from: two views of each id (a workload whose view was rebuilt), so a cycle may replace a
# view in its place, drop it, or list an id twice (which no cache may paper over).
_POOL = [WorkloadView(i % 12, "q", priority=0, submit_time=float(i)) for i in range(24)]

# One cycle's change to the last pending work: (drop these places, replace these places by the other view
# of their id, append these views, insert this view at this place).
_CHANGES = st.tuples(
    st.sets(st.integers(0, 30), max_size=20),
    st.sets(st.integers(0, 30), max_size=4),
    st.lists(st.sampled_from(_POOL), max_size=4),
    st.one_of(st.none(), st.tuples(st.integers(0, 30), st.sampled_from(_POOL))),
)


def _fresh(pending: tuple[WorkloadView, ...]) -> list[tuple[int, int]]:
    return [(k, id(w)) for k, w in {w.key: w for w in pending}.items()]


def _other(w: WorkloadView) -> WorkloadView:
    return _POOL[(_POOL.index(w) + 12) % 24]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_POOL), max_size=16), st.lists(_CHANGES, min_size=1, max_size=8))
def test_the_pending_work_by_id_is_what_a_fresh_walk_gives_cycle_after_cycle(
    start: list[WorkloadView], changes: list[tuple[set[int], set[int], list[WorkloadView], object]]
) -> None:
    _LAST_PENDING.views, _LAST_PENDING.by_key = (), {}
    pending = tuple(start)
    earlier: list[tuple[dict[int, WorkloadView], tuple[WorkloadView, ...]]] = []
    for drop, swap, extra, insert in changes:
        answer = by_key(pending)
        assert [(k, id(w)) for k, w in answer.items()] == _fresh(pending)
        earlier.append((answer, pending))
        kept = [_other(w) if i in swap else w for i, w in enumerate(pending) if i not in drop]
        if isinstance(insert, tuple):
            place, view = insert
            kept.insert(min(place, len(kept)), view)
        pending = (*kept, *extra)
    assert [(k, id(w)) for k, w in by_key(pending).items()] == _fresh(pending)
    for answer, asked in earlier:  # a cycle still reading its answer: the later ones changed copies
        assert [(k, id(w)) for k, w in answer.items()] == _fresh(asked)


def test_a_cycle_like_the_last_is_answered_from_it() -> None:
    """The common case: one view gone, one replaced in its place, one new at the end."""
    _LAST_PENDING.views, _LAST_PENDING.by_key = (), {}
    first = tuple(_POOL[:5])
    assert list(by_key(first)) == [0, 1, 2, 3, 4]
    second = (_POOL[0], _POOL[14], _POOL[3], _POOL[4], _POOL[7])  # 1 gone, 2 replaced, 7 new
    answer = by_key(second)
    assert list(answer) == [0, 2, 3, 4, 7]
    assert answer[2] is _POOL[14] and answer[7] is _POOL[7]
    assert _LAST_PENDING.views is second  # remembered, for the next
