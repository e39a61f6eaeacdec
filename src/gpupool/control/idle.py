"""Running work whose GPUs sit idle is held or cancelled after its spec's `idle.timeout` (Run:ai's idle GPU
timeout, dstack's idle_duration): a notebook left holding GPUs over a weekend gives them back.

The reconcile loop calls `IdleWatch.look` every `CHECK_INTERVAL` seconds with the running attempts whose
workload declares `idle` (`watched`). For each attempt it reads, from the head's telemetry, the highest
utilization every GPU of the attempt reached since the last look (`TelemetryCache.peak_after`, on the
samples' own clock, so an agent's clock need not agree with the head's). A GPU at or above the spec's
`utilization` makes the attempt busy at that look. The attempt is idle once no look found it busy for
`timeout`, counted from the first look at it (its start, or the head's own start: a restarted head waits
a whole timeout again, never less).

It is judged only while telemetry keeps arriving: when a GPU of the attempt has sent nothing new for
`STALE` seconds (a Slurm node, whose GPUs gpupool does not sample; an agent gone quiet), no verdict is
given, so missing data never stops work. Utilization is per GPU: a GPU shared by fractions is busy for all
its holders if one keeps it busy. A service is idle when every running replica is, and then the action
takes the whole service, as `gpupool hold` or `cancel` of its id would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.lifecycle import running_unstopped
from gpupool.control.telemetry import TelemetryCache
from gpupool.spec.quantities import format_duration
from gpupool.spec.sections import IdleSpec
from gpupool.store.models import Attempt, Workload

CHECK_INTERVAL: Final = 5.0  # seconds between looks
STALE: Final = 30.0  # seconds without new samples from a GPU after which no verdict is given
NEVER: Final = float("-inf")


@dataclass(frozen=True, slots=True)
class Watched:
    """A running attempt of a workload that declares `idle`, and the GPUs it holds."""

    attempt_id: int
    workload_id: int
    service_id: int | None
    spec: IdleSpec
    gpus: tuple[tuple[str, int], ...]  # (node, index)


@dataclass(frozen=True, slots=True)
class Idle:
    """A verdict: stop this workload (a service: the whole service), with the reason people will read."""

    workload_id: int
    action: str  # hold | cancel
    reason: str


@dataclass(slots=True)
class _Watch:
    """What the looks found of one attempt (head time, except `last_at`: each GPU's samples' own clock)."""

    busy: float  # the last look that found a GPU busy, or the first look
    seen: float | None = None  # the last look at which every GPU had sent something new
    last_at: dict[tuple[str, int], float] = field(default_factory=dict)


class IdleWatch:
    """The looks of the reconcile loop at the running work that declares `idle` (see the module)."""

    def __init__(self, telemetry: TelemetryCache) -> None:
        self.telemetry = telemetry
        self._watches: dict[int, _Watch] = {}  # attempt id -> what the looks found
        self._specs: dict[int, IdleSpec | None] = {}  # workload id -> its spec's `idle`, read once

    def watched(self, s: Session) -> list[Watched]:
        """The running attempts, not asked to stop, of workloads that declare `idle` and are not held or
        being cancelled. A workload's spec is read once, when first seen running."""
        columns = (
            Attempt.id, Attempt.workload_id, Attempt.node_name, Attempt.gpu_indices, Attempt.pods,
            Workload.service_id,
        )  # fmt: skip
        rows = s.execute(
            select(*columns)
            .join(Workload, Attempt.workload_id == Workload.id)
            .where(*running_unstopped(), Workload.held.is_(False))
        ).all()
        unseen = [row.workload_id for row in rows if row.workload_id not in self._specs]
        if unseen:
            for wid, spec in s.execute(select(Workload.id, Workload.spec).where(Workload.id.in_(unseen))):
                self._specs[wid] = _idle_spec(spec)
        running = {row.workload_id for row in rows}
        self._specs = {wid: spec for wid, spec in self._specs.items() if wid in running}
        out = []
        for row in rows:
            spec = self._specs.get(row.workload_id)
            if spec is not None:
                gpus = held_gpus(row.node_name, row.gpu_indices, row.pods)
                out.append(Watched(row.id, row.workload_id, row.service_id, spec, gpus))
        return out

    def look(self, watched: Sequence[Watched], now: float) -> list[Idle]:
        """Look at each watched attempt's GPUs now; the workloads to stop (a service once, by its id)."""
        watches = {w.attempt_id: self._look_at(w, now) for w in watched}
        self._watches = watches  # attempts no longer watched are forgotten
        by_service: dict[int, list[Watched]] = {}
        verdicts = []
        for w in watched:
            if w.service_id is not None:
                by_service.setdefault(w.service_id, []).append(w)
            elif _idle(watches[w.attempt_id], w.spec, now):
                verdicts.append(Idle(w.workload_id, w.spec.action, _reason(w.spec)))
        for service_id, replicas in by_service.items():
            if all(_idle(watches[r.attempt_id], r.spec, now) for r in replicas):
                spec = replicas[0].spec
                verdicts.append(Idle(service_id, spec.action, _reason(spec, len(replicas))))
        return verdicts

    def _look_at(self, w: Watched, now: float) -> _Watch:
        watch = self._watches.get(w.attempt_id)
        if watch is None:
            watch = _Watch(busy=now)
        fresh, busy = True, False
        for gpu in w.gpus:
            found = self.telemetry.peak_after(gpu[0], gpu[1], watch.last_at.get(gpu, NEVER))
            if found is None:
                fresh = False
                continue
            watch.last_at[gpu], peak = found
            busy = busy or peak >= w.spec.utilization
        if fresh:
            watch.seen = now
        if busy:
            watch.busy = now
        return watch


def _idle(watch: _Watch, spec: IdleSpec, now: float) -> bool:
    return watch.seen is not None and now - watch.seen <= STALE and now - watch.busy >= spec.timeout


def _reason(spec: IdleSpec, replicas: int = 0) -> str:
    """Why: what stayed idle, for how long (a hold adds what happens next; a cancel says it here)."""
    what = f"all {replicas} replicas' GPUs" if replicas > 1 else "its GPUs"
    said = f"idle: {what} below {spec.utilization:g}% utilization for {format_duration(spec.timeout)}"
    return said if spec.action == "hold" else f"{said}: cancelling it"


def _idle_spec(spec: Any) -> IdleSpec | None:
    """The `idle` of a stored spec (one the API validated), or None."""
    data = spec.get("idle") if isinstance(spec, dict) else None
    if not data:
        return None
    try:
        return IdleSpec.model_validate(data)
    except ValidationError:
        return None  # written by a gpupool that knew another shape: not watched rather than misread


def held_gpus(
    node: str, indices: Iterable[Any] | None, pods: list[Any] | None
) -> tuple[tuple[str, int], ...]:
    """Every (node, GPU index) an attempt holds, over all its pods."""
    if pods:
        return tuple((str(p["node"]), int(i)) for p in pods for i in p.get("gpu_indices") or ())
    return tuple((node, int(i)) for i in indices or ())
