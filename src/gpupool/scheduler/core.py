"""`decide(snapshot, now) -> Decisions`: the scheduler's single entry point. Pure: no I/O, no clock.

A cycle runs the configured actions in order (see cycle.py): stale-gang cleanup, allocate, consolidate,
reclaim, preempt. Every workload it leaves pending gets an explanation.
"""

from __future__ import annotations

from gpupool.scheduler import explain
from gpupool.scheduler.cycle import Cycle
from gpupool.scheduler.snapshot import Decisions, Snapshot


def decide(snapshot: Snapshot, now: float) -> Decisions:
    cycle = Cycle(snapshot, now)
    decisions = cycle.run()
    for workload_id, workload in cycle.unplaced.items():
        if workload_id not in decisions.explanations:
            decisions.explanations[workload_id] = explain.no_capacity(workload, cycle.state.free_gpus(), 0)
    return decisions
