"""GPU telemetry history on the head's disk, bounded: the coarser history tiers survive a restart.

The head appends each completed 10 s and 1 min point of every GPU (`TelemetryCache.take_unsaved`) to a log
in `$GPUPOOL_HOME/telemetry/`, one JSON array per line: `[node, gpu, resolution, at, utilization_pct,
memory_used_bytes, temperature_c, power_w]`. The log is a series of segment files (`history-<ms>.jsonl`),
a new one every `segment_seconds` or `segment_bytes`; whole segments are deleted once their newest point
is older than `retention`, and the oldest go whenever the total passes `max_bytes`. So the disk it takes is
at most `max_bytes` however long the head runs. At start `load` reads back the points within the retention
and `TelemetryCache.restore` puts them back into the tiers.

Files, not the store: history is a cache for `gpupool node show` (Prometheus keeps the long-term series),
it would be most of the store's writes, and losing it loses nothing a user submitted. Each head keeps its
own. A head killed with -9 loses the points completed since the last save (`SAVE_INTERVAL`).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from gpupool.control.telemetry import SavedPoint, TelemetryCache

log = logging.getLogger("gpupool.telemetry")

SAVE_INTERVAL = 10.0  # seconds between appends (the finest saved tier's resolution)
RETENTION = 86400.0  # seconds of history kept on disk: the coarsest tier's span
MAX_BYTES = 512 * 1024 * 1024  # total size of the log: about 600 8-GPU nodes' day of history
SEGMENT_SECONDS = 3600.0  # a new segment every hour, so whole segments age out of the retention
PREFIX, SUFFIX = "history-", ".jsonl"


class TelemetryLog:
    """The segmented, bounded log of saved history points; one writer (the head's save loop)."""

    def __init__(
        self,
        directory: Path,
        *,
        retention: float = RETENTION,
        max_bytes: int = MAX_BYTES,
        segment_seconds: float = SEGMENT_SECONDS,
        segment_bytes: int | None = None,
    ) -> None:
        if max_bytes < 4096:
            raise ValueError(f"telemetry log max_bytes {max_bytes}: at least 4096")
        self.directory, self.retention, self.max_bytes = directory, retention, max_bytes
        self.segment_seconds = segment_seconds
        # A segment is at most this big, so the cap is kept with the current segment in it.
        self.segment_bytes = min(segment_bytes or max_bytes // 8, max_bytes)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._current: Path | None = None
        self._opened_at = 0.0
        # Every segment and its size, oldest first (this writer alone changes the directory).
        self._sizes = {p: p.stat().st_size for p in self.segments()}

    def segments(self) -> list[Path]:
        """Segment files on disk, oldest first."""
        return sorted(self.directory.glob(f"{PREFIX}*{SUFFIX}"), key=self._stamp)

    def size(self) -> int:
        """Bytes the log takes on disk."""
        return sum(p.stat().st_size for p in self.segments())

    def append(self, points: list[SavedPoint], now: float | None = None) -> None:
        """Append points; rotate and prune so the log stays within its bounds."""
        if not points:
            return
        now = time.time() if now is None else now
        lines = [
            json.dumps(
                [p.node, p.gpu, p.resolution, *(round(v, 3) for v in p.point)], separators=(",", ":")
            ).encode()
            + b"\n"
            for p in points
        ]
        with self._lock:
            i = 0
            while i < len(lines):
                current, size = self._segment(now, len(lines[i]))
                chunk: list[bytes] = []
                while i < len(lines) and (not chunk or size + len(lines[i]) <= self.segment_bytes):
                    chunk.append(lines[i])
                    size += len(lines[i])
                    i += 1
                with open(current, "ab") as fh:
                    fh.write(b"".join(chunk))
                self._sizes[current] = size
            self._prune(now)

    def _segment(self, now: float, need: int) -> tuple[Path, int]:
        """The segment to append `need` bytes to, and its size: a new one when it is due."""
        current = self._current
        size = self._sizes.get(current, -1) if current is not None else -1
        if (
            current is None
            or size < 0
            or now - self._opened_at >= self.segment_seconds
            or (size and size + need > self.segment_bytes)
        ):
            stamp = max(int(now * 1000), self._stamp(current) + 1 if current is not None else 0)
            current = self._current = self.directory / f"{PREFIX}{stamp}{SUFFIX}"
            self._opened_at, size = now, 0
        return current, size

    @staticmethod
    def _stamp(path: Path) -> int:
        """When a segment was opened (ms): its points are older than the next segment's stamp."""
        return int(path.name[len(PREFIX) : -len(SUFFIX)])

    def _prune(self, now: float) -> None:
        """Delete whole segments, oldest first: those all of whose points are past the retention (the
        next segment opened before it), then any while the log is over its size cap. Never the current."""
        total = sum(self._sizes.values())
        for path, following in itertools.pairwise(list(self._sizes)):
            expired = self._stamp(following) / 1000 <= now - self.retention
            if not expired and total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= self._sizes.pop(path)

    def load(self, now: float | None = None) -> Iterator[SavedPoint]:
        """The saved points within the retention, oldest first; a torn last line is skipped."""
        since = (time.time() if now is None else now) - self.retention
        for path in self.segments():
            try:
                text = path.read_text()
            except OSError:
                continue
            for line in text.splitlines():
                try:
                    node, index, resolution, at, util, memory, temperature, power = json.loads(line)
                    if float(at) < since:
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
    """Append the completed points every SAVE_INTERVAL seconds until `stop`, and once more then."""
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
