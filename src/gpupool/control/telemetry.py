"""The latest GPU samples of each node, kept in memory for the API (history comes with the metrics work)."""

from __future__ import annotations

import threading
from typing import Any


class TelemetryCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[tuple[str, int], dict[str, Any]] = {}

    def put(self, node: str, samples: list[dict[str, Any]]) -> None:
        with self._lock:
            for sample in samples:
                self._latest[(node, int(sample["index"]))] = sample

    def get(self, node: str, index: int) -> dict[str, Any] | None:
        with self._lock:
            return self._latest.get((node, index))
