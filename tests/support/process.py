"""Small helpers about processes and time that several tests share."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil


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


def kill_attempts_under(root: Path) -> int:
    """SIGKILL the process group of every session leader whose command line names a path under `root`;
    how many groups. A service runs until cancelled and attempts run in sessions of their own, so stopping
    a test's server leaves them running; each attempt's shell names its run directory, under the test's
    folders, on its command line."""
    prefix = str(root)
    killed = 0
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if proc.pid != os.getsid(proc.pid) or not any(arg.startswith(prefix) for arg in cmdline):
                continue
            os.killpg(proc.pid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return killed
