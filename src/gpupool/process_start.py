"""When a process started, on a clock that wall-clock steps do not move.

A pid alone does not name a process: the kernel reuses pids. gpupool records, with each pid it must find
again (an attempt's process group, the owner of simulated GPUs), when that process started, and later
counts the pid as the same process only if it started then. psutil's `create_time` is no good for that
on Linux: it adds the kernel's start time (clock ticks since boot) to the boot time in /proc/stat, and that
boot time is "now on the wall clock minus the time since boot", so it moves whenever the wall clock is
stepped (NTP, a VM paused or forked, an admin's `date -s`). After such a step every running attempt read
as gone: its status "vanished", and cancel, hold and SIGKILL sent nothing.

So on Linux a start is the kernel's own figure, seconds since boot (`starttime` in /proc/PID/stat, see
proc(5)), with the boot's id (/proc/sys/kernel/random/boot_id): after a reboot the same pid and tick can
be another process. Elsewhere psutil's `create_time` (the wall clock at start, which macOS keeps as it
was) with the boot id "". `clock()` reads now on the clock of `started`.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

# Wall-clock start times (no boot id: written before 2026-12, or off Linux) are float-rounded differently
# across calls; a since-boot start is a whole number of clock ticks, the same on every read.
WALL_CLOCK_TOLERANCE_S = 0.05
_STARTTIME_FIELD = 19  # /proc/PID/stat: field 22, `starttime`; the 20th after the ")" ending `comm`


@dataclass(frozen=True)
class ProcessStart:
    """When a process started: seconds since boot `boot` (Linux), or on the wall clock (`boot` "")."""

    seconds: float
    boot: str = ""

    def matches(self, pid: int) -> bool:
        """True while `pid` is still the process that started then (it may be a zombie)."""
        now = started(pid, self.boot == "")
        if now is None or now.boot != self.boot:
            return False
        tolerance = WALL_CLOCK_TOLERANCE_S if not self.boot else 0.5 / _ticks_per_second()
        return abs(now.seconds - self.seconds) <= tolerance


def started(pid: int, wall_clock: bool = False) -> ProcessStart | None:
    """When `pid` started; None if there is no such process. `wall_clock` asks for psutil's figure (how
    records written before boot-relative starts were taken)."""
    if not wall_clock and boot_id():
        try:
            text = Path(f"/proc/{pid}/stat").read_bytes()
            ticks = int(text[text.rindex(b")") + 2 :].split()[_STARTTIME_FIELD])
        except (OSError, ValueError, IndexError):
            return None
        return ProcessStart(ticks / _ticks_per_second(), boot_id())
    try:
        return ProcessStart(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def clock() -> float:
    """Now, on the clock of `started(pid).seconds` for this machine."""
    if boot_id() and hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)  # what the kernel counts `starttime` on
    return time.time()


@functools.cache
def boot_id() -> str:
    """This boot's id; "" where the kernel has none (not Linux). Fixed while the machine runs."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@functools.cache
def _ticks_per_second() -> int:
    return os.sysconf("SC_CLK_TCK")
