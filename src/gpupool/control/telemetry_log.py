"""GPU telemetry history on the head's disk, bounded: the coarser history tiers survive a restart.

The head appends each completed 10 s and 1 min point of every GPU (`TelemetryCache.take_unsaved`) to a log
in `$GPUPOOL_HOME/telemetry/`, one JSON array per line: `[node, gpu, resolution, at, utilization_pct,
memory_used_bytes, temperature_c, power_w]`. Each resolution has its own series of segment files
(`history-10s-<ms>.jsonl`, `history-60s-<ms>.jsonl`; `<ms>`: when the segment was opened), and keeps as
long as the head's memory tier of that resolution reaches back (`retention`: 2 h of 10 s points, 24 h of
1 min points): a new segment every twelfth of that span (or every `segment_bytes`), whole segments deleted
once every point in them is past it. Beyond that the oldest segments go whenever the total passes
`max_bytes`, so the disk it takes is at most `max_bytes` however long the head runs.

At start the head's save thread first reads the log back (`load`, then `TelemetryCache.restore`, which
merges it under whatever arrived meanwhile), then saves every `SAVE_INTERVAL` seconds and once more when
the head stops. A head killed with -9 loses the points completed since its last save.

Files, not the store: history is a cache for `gpupool node show` (Prometheus keeps the long-term series),
it would be most of the store's writes, and losing it loses nothing a user submitted. Each head keeps its
own.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from gpupool.control.telemetry import DEFAULT_TIERS, SAVED_FROM, SavedPoint, TelemetryCache

log = logging.getLogger("gpupool.telemetry")

SAVE_INTERVAL = 10.0  # seconds between appends (the finest saved tier's resolution)
# Seconds of history kept per resolution: as far back as the head's memory tier of that resolution reaches.
RETENTION: dict[float, float] = {r: r * n for r, n in DEFAULT_TIERS if r >= SAVED_FROM}
MAX_BYTES = 512 * 1024 * 1024  # the whole log; about 1,500 8-GPU nodes' retained history (~45 B a point)
SEGMENTS_PER_SPAN = 12  # a stream opens a new segment every twelfth of its retention
PREFIX, SUFFIX = "history-", ".jsonl"


def _parse_name(path: Path) -> tuple[float, int]:
    """(resolution, when opened in ms) of a segment named history-<resolution>s-<ms>.jsonl."""
    resolution, _, stamp = path.name[len(PREFIX) : -len(SUFFIX)].partition("s-")
    return float(resolution), int(stamp)


class TelemetryLog:
    """The segmented, bounded log of saved history points; one writer (the head's save thread)."""

    def __init__(
        self,
        directory: Path,
        *,
        retention: Mapping[float, float] = RETENTION,
        max_bytes: int = MAX_BYTES,
        segment_seconds: float | None = None,
        segment_bytes: int | None = None,
    ) -> None:
        if max_bytes < 4096:
            raise ValueError(f"telemetry log max_bytes {max_bytes}: at least 4096")
        self.directory, self.retention, self.max_bytes = directory, dict(retention), max_bytes
        self.segment_seconds = segment_seconds  # None: each stream's retention / SEGMENTS_PER_SPAN
        # A segment is at most this big, so the cap holds with every stream's current segment in it.
        self.segment_bytes = min(
            segment_bytes or max_bytes // 8, max_bytes // max(2, 2 * len(self.retention))
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._current: dict[float, tuple[Path, float]] = {}  # resolution -> (segment, when opened)
        # Every segment and its size (this writer alone changes the directory).
        self._sizes = {p: p.stat().st_size for p in self.segments()}

    def segments(self) -> list[Path]:
        """Segment files on disk, oldest first."""
        found = []
        for path in self.directory.glob(f"{PREFIX}*s-*{SUFFIX}"):
            try:
                found.append((_parse_name(path)[1], path))
            except ValueError:
                continue  # not ours
        return [p for _, p in sorted(found)]

    def size(self) -> int:
        """Bytes the log takes on disk."""
        return sum(p.stat().st_size for p in self.segments())

    def _keep(self, resolution: float) -> float:
        return self.retention.get(resolution, max(self.retention.values(), default=86400.0))

    def append(self, points: list[SavedPoint], now: float | None = None) -> None:
        """Append points to their resolution's segments; rotate and prune so the log stays in its bounds."""
        if not points:
            return
        now = time.time() if now is None else now
        streams: dict[float, list[bytes]] = {}
        for p in points:
            line = json.dumps(
                [p.node, p.gpu, p.resolution, *(round(v, 3) for v in p.point)], separators=(",", ":")
            )
            streams.setdefault(p.resolution, []).append(line.encode() + b"\n")
        with self._lock:
            for resolution, lines in streams.items():
                i = 0
                while i < len(lines):
                    current, size = self._segment(resolution, now, len(lines[i]))
                    chunk: list[bytes] = []
                    while i < len(lines) and (not chunk or size + len(lines[i]) <= self.segment_bytes):
                        chunk.append(lines[i])
                        size += len(lines[i])
                        i += 1
                    with open(current, "ab") as fh:
                        fh.write(b"".join(chunk))
                    self._sizes[current] = size
            self._prune(now)

    def _segment(self, resolution: float, now: float, need: int) -> tuple[Path, int]:
        """The segment of `resolution` to append `need` bytes to, and its size: a new one when due."""
        current, opened = self._current.get(resolution, (None, 0.0))
        size = self._sizes.get(current, -1) if current is not None else -1
        every = self.segment_seconds or self._keep(resolution) / SEGMENTS_PER_SPAN
        if (
            current is None
            or size < 0
            or now - opened >= every
            or (size and size + need > self.segment_bytes)
        ):
            stamp = int(now * 1000)
            if current is not None:
                stamp = max(stamp, _parse_name(current)[1] + 1)
            current = self.directory / f"{PREFIX}{resolution:g}s-{stamp}{SUFFIX}"
            self._current[resolution] = (current, now)
            size = 0
        return current, size

    def _expired(self, following: dict[Path, int], path: Path, now: float) -> bool:
        """Whether every point of a segment is past its retention: the next segment of its stream was
        opened (so it took its last point) before the retention began."""
        resolution = _parse_name(path)[0]
        nxt = following.get(path)
        return nxt is not None and nxt / 1000 <= now - self._keep(resolution)

    def _following(self, paths: list[Path]) -> dict[Path, int]:
        """Each segment's next segment's stamp in the same stream (paths oldest first)."""
        last: dict[float, Path] = {}
        following: dict[Path, int] = {}
        for path in paths:
            resolution, stamp = _parse_name(path)
            if resolution in last:
                following[last[resolution]] = stamp
            last[resolution] = path
        return following

    def _prune(self, now: float) -> None:
        """Delete expired segments; then the oldest while the log is over its cap. Never a current one."""
        ordered = sorted(self._sizes, key=lambda p: _parse_name(p)[1])
        following = self._following(ordered)
        current = {path for path, _ in self._current.values()}
        total = sum(self._sizes.values())
        for path in ordered:
            if path in current:
                continue
            if total > self.max_bytes or self._expired(following, path, now):
                path.unlink(missing_ok=True)
                total -= self._sizes.pop(path)

    def load(self, now: float | None = None) -> Iterator[SavedPoint]:
        """The saved points within their retention, oldest first per resolution; a torn line is skipped."""
        now = time.time() if now is None else now
        paths = self.segments()
        following = self._following(paths)
        for path in paths:
            if self._expired(following, path, now):
                continue
            since = now - self._keep(_parse_name(path)[0])
            try:
                text = path.read_text()
            except OSError:
                continue
            try:  # the whole segment in one parse (several times faster than a parse per line)
                rows = json.loads("[" + text.rstrip("\n").replace("\n", ",") + "]")
            except ValueError:  # a torn line (the head was killed while writing): line by line
                rows = []
                for line in text.splitlines():
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        continue
            for row in rows:
                try:
                    node, index, resolution, at, util, memory, temperature, power = row
                    if at < since:
                        continue
                    point = (float(at), float(util), float(memory), float(temperature), float(power))
                    yield SavedPoint(str(node), int(index), float(resolution), point)
                except (ValueError, TypeError):
                    continue


def restore(cache: TelemetryCache, history: TelemetryLog) -> None:
    """Read the saved history back into the cache (at the head's start)."""
    began = time.monotonic()
    count = cache.restore(history.load())
    log.info(
        "event=telemetry_history_restored points=%d seconds=%.3f dir=%s",
        count, time.monotonic() - began, history.directory,
    )  # fmt: skip


def save_loop(cache: TelemetryCache, history: TelemetryLog, stop: threading.Event) -> None:
    """Restore the saved history, then append completed points every SAVE_INTERVAL seconds until `stop`,
    and once more then."""
    try:
        restore(cache, history)
    except OSError:  # an unreadable log costs old history only
        log.exception("event=telemetry_history_restore_failed dir=%s", history.directory)
    while True:
        stopping = stop.wait(SAVE_INTERVAL)
        try:
            history.append(cache.take_unsaved())
        except OSError:  # a full or failing disk costs history only; the next pass tries again
            log.exception("event=telemetry_history_save_failed dir=%s", history.directory)
        if stopping:
            return


def open_log(home: Path) -> TelemetryLog:
    """The log in $GPUPOOL_HOME/telemetry (GPUPOOL_TELEMETRY_MAX_BYTES overrides its size cap)."""
    raw = os.environ.get("GPUPOOL_TELEMETRY_MAX_BYTES")
    try:
        max_bytes = int(raw) if raw else MAX_BYTES
    except ValueError as exc:
        raise ValueError(f"GPUPOOL_TELEMETRY_MAX_BYTES={raw}: a number of bytes, e.g. 536870912") from exc
    return TelemetryLog(home / "telemetry", max_bytes=max_bytes)
