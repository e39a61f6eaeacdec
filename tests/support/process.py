"""Small helpers about processes and time that several tests share."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


class Clock:
    """A clock a test moves by hand (`clock.now += 5`), for components that take a `clock` callable."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
