"""`decide(snapshot, now) -> Decisions`: the scheduler's single entry point. Pure: no I/O, no clock.

A cycle runs the configured actions in order (see cycle.py): stale-gang cleanup, allocate, consolidate,
reclaim, preempt. Every workload it leaves pending gets an explanation.

`Scheduler` is `decide` with a memory of its last answer, for callers that decide again and again (the
control loop, the simulator): given the same snapshot (the same object, or an equal one) at a later time
before anything time-dependent in the last cycle could come out otherwise (a victim reaching its minimum
runtime, a backfill window closing), it returns the same decisions without running a cycle. The answer
is always exactly what `decide` would give.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Final

from gpupool.scheduler import explain
from gpupool.scheduler.cycle import Cycle
from gpupool.scheduler.snapshot import Decisions, Snapshot

# Remembered answers stay valid until this much before their horizon (float rounding in the tests).
HORIZON_MARGIN: Final = 1e-6


def decide(snapshot: Snapshot, now: float) -> Decisions:
    return _run(snapshot, now)[0]


def _run(snapshot: Snapshot, now: float) -> tuple[Decisions, float]:
    """The decisions, and the time until which the same snapshot decides the same.

    Python's cyclic garbage collector is paused for the cycle. A cycle allocates hundreds of thousands
    of short-lived containers, and each allocation burst set off collections that walked the whole
    snapshot (two full passes and forty middle ones per 10,000-node cycle, a fifth of its time). A cycle
    builds no reference cycles that outlive it (the undo log, whose entries refer back to the state, is
    emptied at the end), so reference counting frees its garbage as it goes.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        cycle = Cycle(snapshot, now)
        decisions = cycle.run()
        explanations = decisions.explanations
        unplaced = cycle.unplaced
        if not cycle.explained_all():  # almost always they are
            for workload_id, workload in unplaced.items():
                if workload_id not in explanations:
                    explanations[workload_id] = explain.no_capacity(workload, cycle.state.free_gpus(), 0)
        state = cycle.state
        state.commit()
        state.park()
        return decisions, state.horizon
    finally:
        if collecting:
            gc.enable()


@dataclass(slots=True)
class _Answer:
    snapshot: Snapshot
    now: float
    valid_until: float
    decisions: Decisions


class Scheduler:
    """`decide` that answers an unchanged snapshot from memory (see the module docstring)."""

    def __init__(self) -> None:
        self._last: _Answer | None = None
        self.cycles = 0  # cycles run
        self.reused = 0  # answers given from memory

    def decide(self, snapshot: Snapshot, now: float) -> Decisions:
        last = self._last
        if (
            last is not None
            and last.now <= now < last.valid_until - HORIZON_MARGIN
            and (last.snapshot is snapshot or last.snapshot == snapshot)
        ):
            self.reused += 1
            return _copy(last.decisions)
        decisions, valid_until = _run(snapshot, now)
        self.cycles += 1
        self._last = _Answer(snapshot, now, valid_until, decisions)
        return _copy(decisions)

    def forget(self) -> None:
        self._last = None


def _copy(decisions: Decisions) -> Decisions:
    """A copy the caller may change without changing what is remembered (the items are immutable)."""
    return Decisions(
        binds=list(decisions.binds),
        evictions=list(decisions.evictions),
        explanations=dict(decisions.explanations),
        fair_shares={queue: dict(shares) for queue, shares in decisions.fair_shares.items()},
        released_to=dict(decisions.released_to),
        nominated=dict(decisions.nominated),
    )
