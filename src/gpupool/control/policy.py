"""The server's scheduling policy, as the control loop applies it each pass.

The policy is gpupool's default (`gpupool.spec.scheduling.DEFAULT_POLICY`, the simulator's `gpupool`)
unless `$GPUPOOL_HOME/scheduling.yaml` (or the file `$GPUPOOL_SCHEDULING_CONFIG` names) changes it; it is
read once at start. Two of its knobs are applied here, through the same functions as the simulator:
- **bands** (`las_preempt`): each workload's priority in a `las` queue is its user priority x (bands + 1)
  plus its band of attained GPU-service (its ended attempts, plus the running attempt's GPU-seconds so far),
  so new work preempts work of its own queue that has had more GPU-time, and a higher user priority
  still outranks a lower one whatever the bands. A running workload changes band when its service
  crosses a threshold; the next pass (every `tick`, 0.5 s) sees it.
- **young-work weights** (`young_weights`): each queue's over-quota weight is its spec's weight x the sum
  of its pending and running workloads' young weights.
Between threshold crossings the views are unchanged, so the scheduler still answers an unchanged pass from
memory. What the scheduler says about a preemption or a pending workload in bands is put in words here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from gpupool.control.config_files import parse_file
from gpupool.scheduler import Eviction, Explanation, QueueView, SchedulerConfig, WorkloadView
from gpupool.scheduler.explain import OVER_FAIR_SHARE, cured_by_capacity
from gpupool.spec.scheduling import (
    DEFAULT_POLICY,
    band_text,
    effective_priority,
    gpu_time_text,
    parse_scheduling_spec,
    priority_parts,
    weighted_by_young,
    young_weight,
)

CONFIG_ENV = "GPUPOOL_SCHEDULING_CONFIG"
CONFIG_FILE = "scheduling.yaml"


class SchedulingConfigError(ValueError):
    """A scheduling policy file that cannot be used; the message names the file, the field and the fix."""


def policy_file(home: Path) -> Path | None:
    """The file the server's policy comes from: $GPUPOOL_SCHEDULING_CONFIG (it must exist), else
    $GPUPOOL_HOME/scheduling.yaml if there; None: the default policy."""
    named = os.environ.get(CONFIG_ENV)
    path = Path(named).expanduser() if named else home / CONFIG_FILE
    if path.exists():
        return path
    if named:
        raise SchedulingConfigError(f"${CONFIG_ENV}={named}: no such file; create it or unset the variable")
    return None


def load_policy(home: Path) -> SchedulerConfig:
    """The policy of `policy_file(home)`, else the default policy."""
    path = policy_file(home)
    if path is None:
        return DEFAULT_POLICY
    return parse_file(path, parse_scheduling_spec, SchedulingConfigError).config()


class BandedPass:
    """One pass's band priorities and young-work counts: `priority` for each pending and running workload,
    then `queues` for the queues' over-quota weights."""

    def __init__(self, config: SchedulerConfig, queues: Sequence[QueueView]) -> None:
        self.config = config
        self.orderings = {q.name: q.ordering for q in queues}
        self.counts: dict[str, float] = {}
        # Pending work mostly shares a few (priority, attained, queue): most of it has had nothing yet.
        self._known: dict[tuple[int, float, str, bool], tuple[int, float]] = {}

    def priority(self, priority: int, attained: float, queue: str, resumable: bool = True) -> int:
        """The priority the scheduler sees for a workload of `queue` that has had `attained` GPU-seconds,
        counting it toward its queue's young work. Running work that is not `resumable` (its spec declares
        no checkpoint) keeps the top band: preempting it for newer work would throw all of its work away,
        so only a higher user priority or reclaim can take its GPUs."""
        key = (priority, attained, queue, resumable)
        known = self._known.get(key)
        if known is None:
            config = self.config
            known = self._known[key] = (
                effective_priority(
                    priority, attained if resumable else 0.0, config, self.orderings.get(queue)
                ),
                young_weight(attained, config.young_weights),
            )
        if known[1]:
            self.counts[queue] = self.counts.get(queue, 0.0) + known[1]
        return known[0]

    def queues(self, queues: tuple[QueueView, ...]) -> tuple[QueueView, ...]:
        return weighted_by_young(queues, self.counts) if self.config.young_weights else queues


def preemption_reason(victim: WorkloadView, gainer: WorkloadView, config: SchedulerConfig) -> str:
    """Why `victim` was preempted for `gainer` (of its own queue), with user priorities, not the
    scheduler's combined ones, and the bands in words when they decided."""
    victim_priority, victim_band = priority_parts(victim.priority, config)
    gainer_priority, gainer_band = priority_parts(gainer.priority, config)
    if victim_band is None or gainer_band is None or gainer_priority != victim_priority:
        return (
            f"preempted by workload {gainer.id} (priority {gainer_priority} > {victim_priority}), "
            f"queue {gainer.queue}"
        )
    thresholds = config.las_thresholds
    return (
        f"preempted by newer work of queue {gainer.queue}: workload {gainer.id} has had less GPU-time "
        f"({band_text(thresholds, gainer_band)}; this one {band_text(thresholds, victim_band)}), and "
        "least-attained-service bands let work that has had less go first"
    )


def reword_preemptions(
    evictions: list[Eviction], pending: tuple[WorkloadView, ...], running: tuple[WorkloadView, ...],
    config: SchedulerConfig,
) -> list[Eviction]:  # fmt: skip
    """The evictions with each preemption's reason in users' terms (see `preemption_reason`)."""
    if not config.las_preempt or not any(e.code == "preempt" for e in evictions):
        return evictions
    gainers = {w.id: w for w in pending}
    victims = {w.id: w for w in running}
    out = []
    for eviction in evictions:
        victim = victims.get(eviction.workload_id)
        gainer = gainers.get(eviction.for_workload) if eviction.for_workload is not None else None
        if eviction.code == "preempt" and victim is not None and gainer is not None:
            _, limited, kept = eviction.reason.partition(", to keep ")  # the scheduler's words: a queue limit
            said = preemption_reason(victim, gainer, config)
            eviction = replace(eviction, reason=f"{said}, to keep {kept}" if limited else said)
        out.append(eviction)
    return out


class BandNotes:
    """Adds to a pending workload's explanation what the policy did to it, in words: that it has left the
    top band, so newer work of its queue goes first; that its queue has no new work, so its fair share is
    its quota (young-work weights). Remembers each note so that an unchanged pass builds nothing new."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._notes: dict[int, tuple[Explanation, Explanation]] = {}

    def add(
        self,
        explanations: dict[int, Explanation],
        pending: tuple[WorkloadView, ...],
        queues: tuple[QueueView, ...] = (),
        running: tuple[WorkloadView, ...] = (),
    ) -> None:
        config = self.config
        bands = config.las_preempt and bool(config.las_thresholds)
        # Queues left without over-quota weight by young_weights: their fair share is their quota.
        idle = {q.name for q in queues if q.gpu.weight == 0} if config.young_weights else set()
        if not bands and not idle:
            self._notes = {}
            return
        thresholds = config.las_thresholds
        top = len(thresholds)
        # Each queue's highest band, pending or running: work below it has work of its queue going first; the
        # note would mislead work that is alone in its queue, or the least served there.
        highest: dict[str, int] = {}
        if bands:
            for v in (*pending, *running):
                band = v.priority % (top + 1)
                if band > highest.get(v.queue, -1):
                    highest[v.queue] = band
        notes: dict[int, tuple[Explanation, Explanation]] = {}
        for w in pending:
            band = w.priority % (top + 1) if bands else top
            if band < top and highest.get(w.queue, band) <= band:
                band = top  # no work of its queue has had less
            old = w.queue in idle
            if band == top and not old:
                continue
            given = explanations.get(w.id)
            if given is None or not cured_by_capacity(given.code):
                continue
            known = self._notes.get(w.id)
            if known is not None and (known[0] is given or known[0] == given):
                noted = known[1]
            else:
                message = given.message
                if band != top:
                    message += (
                        f"; it has had {band_text(thresholds, band)}, so work of its queue that has had less "
                        "goes first (least-attained-service bands)"
                    )
                if old and given.code == OVER_FAIR_SHARE:
                    message += (
                        f"; its fair share is its quota: queue {w.queue} has no work under "
                        f"{_youngest(config)}, and GPUs above the quotas go to queues with new work"
                    )
                noted = Explanation(given.code, message)
            notes[w.id] = (given, noted)
            explanations[w.id] = noted
        self._notes = notes


def _youngest(config: SchedulerConfig) -> str:
    """The largest young-work threshold in words: work under it still counts for its queue."""
    return gpu_time_text(max(below for below, _ in config.young_weights))
