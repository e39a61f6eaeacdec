"""GPU efficiency of each attempt, Slurm's `seff` and Run:ai's per-workload GPU utilization: the mean GPU
utilization and the peak GPU memory of the GPUs an attempt holds, kept with the attempt in the store
(`gpupool show`, `gpupool usage`'s USED and UTIL columns).

The reconcile loop calls `EfficiencyWatch.look` every `CHECK_INTERVAL` seconds with the running attempts
(`running`). For each GPU of each attempt it reads the points of the GPU's finest telemetry history
(control/telemetry.py: one per second) that arrived since its last look, on the samples' own clock, from
the attempt's start on (points before it are the previous holder's). Each point weighs the time since the
point before it in the GPU's history (from the attempt's start on): the mean is over GPU-time, summed over
the attempt's GPUs. A point with none before it within `MAX_GAP` weighs nothing: after an outage (a GPU
silent for minutes, a head restarted, whose history starts empty) no one knows what the GPU did meanwhile,
so the first value after it must not stand for that time. A GPU shared by fractions counts its whole
utilization for each holder, as `idle` judges it (NVML cannot tell whose kernels ran).

What the looks found is written to the attempt's row at the first look that found any, then every
`FLUSH_INTERVAL` seconds (only the attempts whose figures changed, in one transaction) and at the look after
the attempt ended (points up to its end), so telemetry never causes a write per sample. A restarted head
resumes an attempt's mean from its row (weighted by `gpu_seconds_sampled`) and counts only the points after
its own start (`began`: the stored figures cover none later, as the head before had stopped by then): it loses
at most the figures of the last `FLUSH_INTERVAL` before it stopped, and the time it was down counts for
nothing. An attempt no sample ever arrived for (a Slurm node, whose GPUs gpupool does not sample) is never
written: its figures stay None, which people read as "no GPU telemetry", never as 0%.

Utilization is NVML's utilization rate (`nvmlDeviceGetUtilizationRates().gpu`): the share of the last
sample period during which one or more kernels ran on the GPU, not how many of its SMs they kept busy; a
single small kernel running all the time reads 100%. Simulated GPUs follow the CPU use of the processes
placed on them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session

from gpupool.control.idle import held_gpus
from gpupool.control.lifecycle import RUNNING
from gpupool.control.telemetry import TelemetryCache
from gpupool.store.models import Attempt
from gpupool.timeutil import as_utc

CHECK_INTERVAL: Final = 5.0  # seconds between looks
FLUSH_INTERVAL: Final = 30.0  # seconds between writes of running attempts' figures
COLUMNS: Final = (
    "gpu_seconds_sampled",
    "gpu_utilization_pct",
    "gpu_memory_peak_bytes",
    "gpu_memory_total_bytes",
)
MAX_GAP: Final = 60.0  # the most time one point counts for (after a longer silence it counts for none)


@dataclass(slots=True)
class Efficiency:
    """Running figures of one attempt: a time-weighted mean utilization over GPU-seconds, peak memory."""

    gpu_seconds: float = 0.0  # GPU-seconds of telemetry counted, over all the attempt's GPUs
    busy_seconds: float = 0.0  # the sum of utilization (0..1) x seconds: the mean's numerator
    peak_memory_bytes: int = 0
    memory_total_bytes: int = 0  # of the attempt's largest GPU, for "peak 12 GiB of 80 GiB"

    def add(self, utilization_pct: float, memory_used_bytes: float, seconds: float) -> None:
        """Count one point of one GPU that stood for `seconds` (one of no weight still counts its peak)."""
        if seconds > 0:
            self.gpu_seconds += seconds
            self.busy_seconds += min(max(utilization_pct, 0.0), 100.0) / 100.0 * seconds
        if memory_used_bytes > self.peak_memory_bytes:
            self.peak_memory_bytes = int(memory_used_bytes)

    @property
    def mean_pct(self) -> float | None:
        """The mean utilization in percent; None before any GPU-time was counted."""
        return 100.0 * self.busy_seconds / self.gpu_seconds if self.gpu_seconds > 0 else None

    def columns(self) -> dict[str, Any]:
        """The attempt's columns, as stored."""
        mean = self.mean_pct
        return {
            "gpu_seconds_sampled": round(self.gpu_seconds, 3),
            "gpu_utilization_pct": None if mean is None else round(mean, 3),
            "gpu_memory_peak_bytes": self.peak_memory_bytes,
            "gpu_memory_total_bytes": self.memory_total_bytes or None,
        }

    @classmethod
    def resumed(
        cls, seconds: float | None, mean_pct: float | None, peak: int | None, total: int | None
    ) -> Efficiency:
        """The figures an attempt's row holds, to go on from (a restarted head)."""
        if not seconds or mean_pct is None:
            return cls(peak_memory_bytes=peak or 0, memory_total_bytes=total or 0)
        return cls(seconds, seconds * mean_pct / 100.0, peak or 0, total or 0)


@dataclass(frozen=True, slots=True)
class Tracked:
    """A running attempt that holds GPUs, with what its row holds already."""

    attempt_id: int
    started: float  # its start, epoch seconds: points before it are the previous holder's
    gpus: tuple[tuple[str, int], ...]  # (node, index)
    stored: Efficiency


@dataclass(slots=True)
class _Tally:
    """What the looks found of one attempt since the head started (or the attempt did)."""

    gpus: tuple[tuple[str, int], ...]
    figures: Efficiency
    since: float  # points at or before it are not counted: the previous holder's, or in the stored figures
    # per GPU: the newest point read (the samples' clock); None: none yet (the one before `since`, if any,
    # is read first: what the first point counted weighs)
    last_at: dict[tuple[str, int], float | None]
    sized: set[tuple[str, int]] = field(default_factory=set)  # GPUs whose memory size is known
    written: dict[str, Any] = field(default_factory=dict)  # the columns as last written


_TRACKED_COLUMNS: Final = (
    Attempt.id, Attempt.node_name, Attempt.gpu_indices, Attempt.pods, Attempt.started_at,
    Attempt.gpu_seconds_sampled, Attempt.gpu_utilization_pct, Attempt.gpu_memory_peak_bytes,
    Attempt.gpu_memory_total_bytes,
)  # fmt: skip


class EfficiencyWatch:
    """The looks of the reconcile loop at running attempts' GPU telemetry (see the module)."""

    def __init__(self, telemetry: TelemetryCache, *, began: float | None = None) -> None:
        self.telemetry = telemetry
        # When this head began looking (epoch seconds; default now): the figures it finds stored cover no
        # point after it, so a resumed attempt counts from there and none is counted twice.
        self.began = time.time() if began is None else began
        self._tallies: dict[int, _Tally] = {}  # attempt id -> what the looks found
        self._flushed = 0.0  # when running attempts' figures were last written (head time)

    def running(self, s: Session) -> list[Tracked]:
        """The running attempts that hold GPUs; each one's stored figures read once, when first seen."""
        rows = s.execute(select(*_TRACKED_COLUMNS).where(Attempt.state == RUNNING)).all()
        out = []
        for row in rows:
            gpus = held_gpus(row.node_name, row.gpu_indices, row.pods)
            started = as_utc(row.started_at)
            if not gpus or started is None:
                continue
            stored = (
                Efficiency()
                if row.id in self._tallies
                else Efficiency.resumed(
                    row.gpu_seconds_sampled, row.gpu_utilization_pct, row.gpu_memory_peak_bytes,
                    row.gpu_memory_total_bytes,
                )
            )  # fmt: skip
            out.append(Tracked(row.id, started.timestamp(), gpus, stored))
        return out

    def ended(self, s: Session, running: Iterable[Tracked]) -> dict[int, float | None]:
        """The attempts tallied that no longer run, with their end (epoch seconds; None: not recorded)."""
        gone = set(self._tallies) - {t.attempt_id for t in running}
        if not gone:
            return {}
        ends = dict.fromkeys(gone, None)
        for attempt_id, finished in s.execute(
            select(Attempt.id, Attempt.finished_at).where(Attempt.id.in_(sorted(gone)))
        ):
            end = as_utc(finished)
            ends[attempt_id] = None if end is None else end.timestamp()
        return ends  # an attempt deleted meanwhile (retention) keeps None: its write finds no row

    def look(
        self,
        running: Sequence[Tracked],
        ended: Mapping[int, float | None],
        now: float,
        *,
        flush: bool = False,
    ) -> dict[int, dict[str, Any]]:
        """Count the points that arrived since the last look; the columns to write, by attempt id: those of
        the attempts that ended, and every `FLUSH_INTERVAL` (or when `flush`: the head stops) those of the
        running ones that changed."""
        for attempt_id, end in ended.items():
            tally = self._tallies.get(attempt_id)
            if tally is not None:
                self._count(tally, float("inf") if end is None else end)
        flush = flush or now - self._flushed >= FLUSH_INTERVAL
        if flush:
            self._flushed = now
        writes = {i: c for i in ended if (c := self._changed(self._tallies.pop(i, None))) is not None}
        for tracked in running:
            tally = self._tallies.get(tracked.attempt_id)
            if tally is None:
                resumed = tracked.stored.gpu_seconds > 0
                since = max(tracked.started, self.began) if resumed else tracked.started
                tally = self._tallies[tracked.attempt_id] = _Tally(
                    tracked.gpus, tracked.stored, since, dict.fromkeys(tracked.gpus)
                )
                tally.written = tracked.stored.columns() if tracked.stored.gpu_seconds else {}
            self._count(tally, float("inf"))
            # an attempt's first figures at once (a job requeued a moment ago read "no GPU telemetry" for
            # up to FLUSH_INTERVAL), then every FLUSH_INTERVAL
            if (flush or not tally.written) and (columns := self._changed(tally)) is not None:
                writes[tracked.attempt_id] = columns
        return writes

    def _count(self, tally: _Tally, until: float) -> None:
        figures, since = tally.figures, tally.since
        for gpu in tally.gpus:
            before = tally.last_at[gpu]
            after = since - MAX_GAP if before is None else before  # the first time: the point before too
            points = self.telemetry.points_after(gpu[0], gpu[1], after, until)
            if not points:
                continue
            if gpu not in tally.sized and points[-1][0] > since:
                tally.sized.add(gpu)
                latest = self.telemetry.get(gpu[0], gpu[1]) or {}
                total = int(latest.get("memory_total_bytes") or 0)
                figures.memory_total_bytes = max(figures.memory_total_bytes, total)
            for at, utilization, memory, _temperature, _power in points:
                if at > since:
                    # After an outage (no point before it within MAX_GAP) the point stands for no time.
                    if before is None or at - before > MAX_GAP:
                        figures.add(utilization, memory, 0.0)
                    else:
                        figures.add(utilization, memory, at - max(before, since))
                before = at
            tally.last_at[gpu] = before

    @staticmethod
    def _changed(tally: _Tally | None) -> dict[str, Any] | None:
        """The tally's columns when they differ from those last written (None: nothing to write)."""
        if tally is None or tally.figures.gpu_seconds == 0:
            return None
        columns = tally.figures.columns()
        if columns == tally.written:
            return None
        tally.written = columns
        return columns


def write(s: Session, columns: Mapping[int, Mapping[str, Any]]) -> None:
    """Write the figures `look` gave, by attempt id, in one statement (an attempt deleted meanwhile by
    retention matches no row and is skipped)."""
    table = cast(Table, Attempt.__table__)
    statement = (
        update(table)
        .where(table.c.id == bindparam("attempt_id"))
        .values({name: bindparam(name) for name in COLUMNS})
    )
    s.execute(statement, [{"attempt_id": i, **c} for i, c in columns.items()])
