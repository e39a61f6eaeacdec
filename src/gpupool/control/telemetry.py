"""GPU telemetry on the head: the latest sample of every GPU and its recent history, in bounded memory.

Every sample, from any node, enters through one function: `TelemetryCache.put(node, samples)`. The local
backend's reconcile loop calls it after each NVML/simulated reading; a node agent's heartbeat carries its
samples (`GpuSample.to_dict()` rows) and the agent backend hands them to the same `put`, with the offset of
the agent's clock from the head's when it is off: every time kept is the head's. `put` attributes
each sample to the workloads holding its GPU (queue and user too) and appends it to the GPU's history.

History is kept per GPU in tiers of rising resolution (1 s for 10 minutes, 10 s for 2 hours, 1 min for
24 hours by default): a tier's bucket is averaged when time leaves it. Each tier is a bounded deque and the
number of GPUs is capped (`max_series`, the oldest-seen series go first), so memory stays bounded however
long the head runs. Prometheus is the long-term store; this history serves `gpupool node show` and `top`.

The points of the coarser tiers (10 s and 1 min) also go to disk, so history survives a restart of the head:
each completed point waits in a bounded queue (`take_unsaved`) until control/telemetry_log.py appends it to
its log, which `restore` reads back at start (merged under what arrived meanwhile). The 1 s tier is not
saved (one write per GPU per second); a read over a window the 1 s tier does not reach back to fills in
from the coarser tiers.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import select

from gpupool.store.db import Store
from gpupool.store.models import Attempt, Workload

log = logging.getLogger("gpupool.telemetry")

HISTORY_FIELDS = ("utilization_pct", "memory_used_bytes", "temperature_c", "power_w")
DEFAULT_TIERS: tuple[tuple[float, int], ...] = ((1.0, 600), (10.0, 720), (60.0, 1440))
MAX_SERIES = 65536  # GPUs whose history is kept (8192 nodes of 8); beyond it the least recently seen go
SAVED_FROM = 10.0  # tiers at least this coarse are saved to disk (control/telemetry_log.py)
UNSAVED_MAX = 500_000  # points waiting to be saved; beyond it (a stalled disk) the oldest are dropped


@dataclass(frozen=True)
class Holder:
    """A workload holding a GPU: what its samples are attributed to (labels workload, queue, user)."""

    workload_id: int
    name: str
    queue: str
    user: str


Allocations = Mapping[tuple[str, int], Sequence[Holder]]  # (node, GPU index) -> holders
Attribution = tuple[tuple[int, ...], tuple[dict[str, Any], ...]]  # a row's `workloads` and `holders`
Point = tuple[float, float, float, float, float]  # (time, *HISTORY_FIELDS)


class SavedPoint(NamedTuple):
    """A completed point of one GPU's history at one resolution, as saved to disk and restored."""

    node: str
    gpu: int  # the GPU's index on the node
    resolution: float
    point: Point


def _attribution(holders: Sequence[Holder]) -> Attribution:
    return (
        tuple(h.workload_id for h in holders),
        tuple({"workload": h.workload_id, "name": h.name, "queue": h.queue, "user": h.user} for h in holders),
    )


class StoreAllocations:
    """Who holds which GPU, from the running attempts in the store, re-read every `ttl` seconds in the
    background: an agent's heartbeat (on the API's event loop) never waits on the store for it."""

    def __init__(self, store: Store, ttl: float = 1.0) -> None:
        self.store, self.ttl = store, ttl
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[tuple[str, int], list[Holder]]] | None = None
        self._refreshing = False

    def __call__(self) -> Allocations:
        with self._lock:
            cached = self._cached
            if cached is not None:
                if time.monotonic() - cached[0] >= self.ttl and not self._refreshing:
                    self._refreshing = True
                    threading.Thread(
                        target=self._refresh_quietly, name="telemetry-allocations", daemon=True
                    ).start()
                return cached[1]
        return self._refresh()  # the first time: nothing to answer with yet

    def _refresh(self) -> Allocations:
        try:
            held = self._read()
            with self._lock:
                self._cached = (time.monotonic(), held)
            return held
        finally:
            with self._lock:
                self._refreshing = False

    def _refresh_quietly(self) -> None:
        try:
            self._refresh()
        except Exception:  # the samples keep the last known holders; the next call tries again
            log.exception("event=telemetry_allocations_failed")

    def _read(self) -> dict[tuple[str, int], list[Holder]]:
        held: dict[tuple[str, int], list[Holder]] = {}
        with self.store.read() as s:
            rows = s.execute(
                select(
                    Attempt.workload_id, Attempt.node_name, Attempt.gpu_indices, Attempt.pods,
                    Workload.name, Workload.queue, Workload.user,
                )
                .join(Workload, Attempt.workload_id == Workload.id)
                .where(Attempt.state == "running")
            ).all()  # fmt: skip
        for wid, node, indices, pods, name, queue, user in rows:
            holder = Holder(int(wid), name, queue, user)
            for pod in pods or [{"node": node, "gpu_indices": indices}]:
                for index in pod["gpu_indices"]:
                    held.setdefault((str(pod["node"]), int(index)), []).append(holder)
        return held


class _Tier:
    """Points at one resolution: a bounded deque plus the bucket being averaged."""

    # The sums of the bucket being averaged are four plain floats: this runs for every sample of every
    # GPU, three times (one per tier).
    __slots__ = (
        "_bucket", "_count", "_memory", "_power", "_temperature", "_util", "capacity", "points", "resolution",
    )  # fmt: skip

    def __init__(self, resolution: float, capacity: int) -> None:
        self.resolution, self.capacity = resolution, capacity
        self.points: deque[Point] = deque(maxlen=capacity)
        self._bucket = -1.0
        self._util = self._memory = self._temperature = self._power = 0.0
        self._count = 0

    def add(self, at: float, util: float, memory: float, temperature: float, power: float) -> Point | None:
        """Add a reading; returns the point it completed, if time left the bucket being averaged."""
        bucket = at - at % self.resolution
        done = None
        if bucket != self._bucket:
            if self._count:
                n = self._count
                done = (
                    self._bucket,
                    self._util / n,
                    self._memory / n,
                    self._temperature / n,
                    self._power / n,
                )
                self.points.append(done)
                self._util = self._memory = self._temperature = self._power = 0.0
                self._count = 0
            self._bucket = bucket
        self._util += util
        self._memory += memory
        self._temperature += temperature
        self._power += power
        self._count += 1
        return done

    def restore(self, point: Point) -> None:
        """Put back a saved point (oldest first; one not newer than the last point held is skipped)."""
        if not self.points or point[0] > self.points[-1][0]:
            self.points.append(point)

    def prepend(self, older: deque[Point]) -> None:
        """Put restored points before the ones held (those older than the first held point)."""
        if older:
            first = self.points[0][0] if self.points else float("inf")
            merged = [p for p in older if p[0] < first]
            merged.extend(self.points)
            self.points = deque(merged[-self.capacity :], maxlen=self.capacity)

    def read(self, since: float) -> list[Point]:
        return [p for p in self.points if p[0] >= since]


class GpuHistory:
    """The downsampled history of one GPU."""

    def __init__(self, tiers: tuple[tuple[float, int], ...] = DEFAULT_TIERS) -> None:
        self.tiers = [_Tier(resolution, capacity) for resolution, capacity in tiers]

    def add(self, sample: Mapping[str, Any]) -> list[tuple[float, Point]] | None:
        """Add a sample; returns the points it completed, with their tier's resolution (None: none)."""
        at = float(sample["at"])
        get = sample.get
        util, memory = float(get("utilization_pct", 0.0)), float(get("memory_used_bytes", 0))
        temperature, power = float(get("temperature_c", 0.0)), float(get("power_w", 0.0))
        done = None
        for tier in self.tiers:
            point = tier.add(at, util, memory, temperature, power)
            if point is not None:
                done = done or []
                done.append((tier.resolution, point))
        return done

    def peak_after(self, after: float) -> tuple[float, float] | None:
        """(the newest finest-tier point's time, the highest utilization of the points after `after`), or
        None when no point is newer than `after`."""
        points = self.tiers[0].points
        if not points or points[-1][0] <= after:
            return None
        peak = 0.0
        for point in reversed(points):
            if point[0] <= after:
                break
            if point[1] > peak:
                peak = point[1]
        return points[-1][0], peak

    def points_after(self, after: float, until: float) -> list[Point]:
        """The finest tier's points newer than `after` and not newer than `until`, oldest first."""
        newer: list[Point] = []
        for point in reversed(self.tiers[0].points):
            if point[0] <= after:
                break
            if point[0] <= until:
                newer.append(point)
        newer.reverse()
        return newer

    def points(self) -> int:
        return sum(len(t.points) for t in self.tiers)

    def read(self, seconds: float, now: float) -> tuple[float, list[Point]]:
        """The finest tier that covers the last `seconds`: (its resolution, its points in that window).
        Where that tier does not reach back (a restarted head restores only the coarser tiers), the
        coarser tiers' older points come first."""
        since = now - seconds
        chosen = next(
            (i for i, t in enumerate(self.tiers) if t.resolution * t.capacity >= seconds), len(self.tiers) - 1
        )
        points = self.tiers[chosen].read(since)
        first = points[0][0] if points else now
        for tier in self.tiers[chosen + 1 :]:
            older = [p for p in tier.read(since) if p[0] + tier.resolution <= first]
            if older:
                points = older + points
                first = older[0][0]
        return self.tiers[chosen].resolution, points


class TelemetryCache:
    """Latest sample and history of every GPU of every node; thread-safe."""

    def __init__(
        self,
        *,
        tiers: tuple[tuple[float, int], ...] = DEFAULT_TIERS,
        max_series: int = MAX_SERIES,
        allocations: Callable[[], Allocations] | None = None,
        saved_from: float | None = None,
    ) -> None:
        """`saved_from`: completed points of tiers at least this coarse are queued for saving (None: none)."""
        self._lock = threading.Lock()
        self._saved_from = saved_from
        self._unsaved: deque[SavedPoint] = deque(maxlen=UNSAVED_MAX)
        self._latest: dict[tuple[str, int], dict[str, Any]] = {}
        self._by_node: dict[str, dict[int, dict[str, Any]]] = {}  # the same rows, by node and GPU index
        self._history: dict[tuple[str, int], GpuHistory] = {}
        self._tiers = tiers
        self._max_series = max_series
        self._allocations = allocations
        self._received: dict[str, float] = {}  # node -> monotonic time of its last samples
        # The attribution rows of each held GPU, built once per allocations read (see put).
        self._attributed: tuple[Allocations | None, dict[tuple[str, int], Attribution]] = (None, {})

    def attribute_with(self, allocations: Callable[[], Allocations]) -> None:
        """Attribute samples to the workloads `allocations()` says hold each GPU (set once at start)."""
        self._allocations = allocations

    def put(self, node: str, samples: Iterable[Mapping[str, Any]], offset: float = 0.0) -> None:
        """The one way samples enter the head, from the local sampler or an agent: attribute, keep, append.
        `offset`: seconds added to each sample's `at` to put it on the head's clock (an agent's clock may be
        off; backends/agent_heartbeats.py measures by how much).

        A kept row holds no list (a list an agent sent becomes a tuple), and an idle GPU's row holds no
        container at all, so the garbage collector does not track it: 8,000 GPUs' rows replaced every
        second were most of what each young collection walked, and what made full collections come often.
        A held GPU's row shares its attribution's tuples, built once per read of the allocations."""
        held = self._allocations() if self._allocations is not None else None
        memo = self._attributed
        if memo[0] is not held:  # allocations re-read: attributions are built again as GPUs report
            memo = self._attributed = (held, {})
        rows = []
        for sample in samples:
            row = dict(sample)
            if gc.is_tracked(row):  # a list inside (xid_errors): the row as tuples instead
                row = {key: tuple(value) if type(value) is list else value for key, value in row.items()}
            if offset:
                row["at"] = float(row["at"]) + offset
            index = int(row["index"])
            holders = held.get((node, index)) if held else None
            if holders:
                attribution = memo[1].get((node, index))
                if attribution is None:
                    attribution = memo[1][node, index] = _attribution(holders)
                row["workloads"], row["holders"] = attribution
            else:
                row["workloads"] = row["holders"] = ()
            rows.append((index, row))
        with self._lock:
            self._received[node] = time.monotonic()
            by_node = self._by_node.get(node)
            if by_node is None:
                by_node = self._by_node[node] = {}
            for index, row in rows:
                key = (node, index)
                self._latest[key] = row
                by_node[index] = row
                history = self._history.get(key)
                if history is None:
                    if len(self._history) >= self._max_series:
                        self._evict_oldest()
                        by_node = self._by_node.setdefault(node, by_node)
                    history = self._history[key] = GpuHistory(self._tiers)
                completed = history.add(row)
                if completed is not None and self._saved_from is not None:
                    for resolution, point in completed:
                        if resolution >= self._saved_from:
                            self._unsaved.append(SavedPoint(node, index, resolution, point))

    def take_unsaved(self) -> list[SavedPoint]:
        """The completed points not yet saved, oldest first; they are handed over once."""
        with self._lock:
            taken = list(self._unsaved)
            self._unsaved.clear()
        return taken

    def restore(self, saved: Iterable[SavedPoint]) -> int:
        """Put saved points (oldest first per resolution) back into the histories, before what arrived
        since the start (the head serves while it reads them); returns how many were read."""
        built: dict[tuple[str, int], GpuHistory] = {}
        count = 0
        for item in saved:  # outside the lock: reading a large log takes seconds
            key = (item.node, item.gpu)
            history = built.get(key)
            if history is None:
                if len(built) >= self._max_series:
                    continue
                history = built[key] = GpuHistory(self._tiers)
            for tier in history.tiers:
                if tier.resolution == item.resolution:
                    tier.restore(item.point)
                    count += 1
        with self._lock:
            for key, history in built.items():
                held = self._history.get(key)
                if held is None:
                    if len(self._history) < self._max_series:
                        self._history[key] = history
                    continue
                for restored, tier in zip(history.tiers, held.tiers, strict=True):
                    tier.prepend(restored.points)
        return count

    def keep_listed(self, listed: Mapping[str, Iterable[int]]) -> int:
        """Drop the GPUs of each node in `listed` that it no longer lists (a GPU fell off the bus and the
        node came back without it): their latest sample (so /metrics stops exporting them) and history.
        Nodes not in `listed` are left alone. Returns how many GPUs were dropped."""
        dropped = 0
        with self._lock:
            for node, indices in listed.items():
                rows = self._by_node.get(node)
                if not rows:
                    continue
                keep = set(indices)
                for index in [i for i in rows if i not in keep]:
                    del rows[index]
                    self._latest.pop((node, index), None)
                    self._history.pop((node, index), None)
                    dropped += 1
                if not rows:
                    del self._by_node[node]
        return dropped

    def _evict_oldest(self) -> None:
        oldest = min(self._history, key=lambda k: float(self._latest.get(k, {}).get("at", 0.0)))
        self._history.pop(oldest, None)
        self._latest.pop(oldest, None)
        rows = self._by_node.get(oldest[0], {})
        rows.pop(oldest[1], None)
        if not rows:
            self._by_node.pop(oldest[0], None)

    def get(self, node: str, index: int) -> dict[str, Any] | None:
        with self._lock:
            return self._latest.get((node, index))

    def node_samples(self, node: str) -> list[dict[str, Any]]:
        """The latest sample of each GPU of `node`, by index."""
        with self._lock:
            rows = self._by_node.get(node, {})
            return [rows[index] for index in sorted(rows)]

    def latest(self) -> dict[tuple[str, int], dict[str, Any]]:
        with self._lock:
            return dict(self._latest)

    def age(self, node: str) -> float | None:
        """Seconds since `node` last sent samples; None if it never did."""
        with self._lock:
            at = self._received.get(node)
        return None if at is None else time.monotonic() - at

    def peak_after(self, node: str, index: int, after: float) -> tuple[float, float] | None:
        """A GPU's highest utilization in its finest history after `after` (its samples' own clock), with
        the time of its newest point, for a reader that keeps up (control/idle.py); None: nothing newer."""
        with self._lock:
            series = self._history.get((node, index))
            return None if series is None else series.peak_after(after)

    def points_after(self, node: str, index: int, after: float, until: float = float("inf")) -> list[Point]:
        """A GPU's finest history points in (`after`, `until`] (its samples' own clock), oldest first, for a
        reader that keeps up (control/efficiency.py); [] for a GPU never seen."""
        with self._lock:
            series = self._history.get((node, index))
            return [] if series is None else series.points_after(after, until)

    def history(self, node: str, index: int, seconds: float, now: float | None = None) -> dict[str, Any]:
        """`{"resolution": s, "fields": [...], "points": [[t, ...], ...]}` for the last `seconds`."""
        with self._lock:
            series = self._history.get((node, index))
            resolution, points = (
                (0.0, []) if series is None else series.read(seconds, time.time() if now is None else now)
            )
        return {
            "resolution": resolution,
            "fields": ["at", *HISTORY_FIELDS],
            "points": [list(p) for p in points],
        }

    def points(self) -> int:
        """Points held across every GPU's history (what the memory bound caps)."""
        with self._lock:
            return sum(h.points() for h in self._history.values())

    def series(self) -> int:
        with self._lock:
            return len(self._history)
