"""When work that stopped on its own may start again: the crash-loop backoff.

A service (`kind: service`) runs until it is cancelled: whenever its program exits, with any code, the
workload goes back to pending for a new attempt; a job does so after a failure when its `retry` policy
says so. A program that keeps exiting soon after it starts would otherwise take GPUs, stop and take them
again every pass, so each new attempt waits as Kubernetes makes a crash-looping container (and a failed
Job's next pod) wait: the base delay after the first quick exit, doubling with each quick exit in a row,
at most `CAP` times the base (10 s up to 5 minutes with the default base). An attempt that ran `RESET`
seconds or longer ends the streak. Only exits count, and attempts their node could not start (a launch
error: a working directory that is not there yet, no free port): an eviction, a drained or lost node is
not the program's doing, and the workload is pending again at once.

Everything here is read from the attempts in the store, so a restarted head keeps every backoff.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from gpupool.scheduler import Explanation
from gpupool.timeutil import as_utc

RESET: Final = 600.0  # seconds an attempt must run for its exit to end a crash loop (Kubernetes: 10 min)
CAP: Final = 30  # the longest wait, in multiples of the base delay
DEFAULT_BASE: Final = 10.0  # seconds before the first restart after a quick exit
RESTART_BACKOFF: Final = "restart-backoff"  # the reason code of work waiting out its backoff


@dataclass(frozen=True, slots=True)
class Ended:
    """What the backoff reads of an attempt, oldest first."""

    started_at: datetime | None
    finished_at: datetime | None
    exit_code: int | None
    stop_reason: str  # "" when nothing asked it to stop: it exited on its own
    unstarted: bool = False  # its node could not start it (no process): as quick an end as any exit
    reason: str = ""  # the attempt's reason: why its node could not start it


@dataclass(frozen=True, slots=True)
class Backoff:
    """Work waiting to start again: until `until` (Unix seconds), after `quick_exits` quick exits in a row,
    the last with `exit_code`."""

    until: float
    delay: float
    quick_exits: int
    exit_code: int | None
    unstarted: bool = False  # the last of them never started: its node could not start it
    reason: str = ""  # why, when it never started


def quick_exits(attempts: Iterable[Ended]) -> list[Ended]:
    """The latest attempts, newest first, that exited on their own within `RESET` seconds of their start:
    the crash loop the workload is in (empty when its last attempt ran long or was stopped)."""
    streak = []
    for attempt in reversed(list(attempts)):
        started, finished = as_utc(attempt.started_at), as_utc(attempt.finished_at)
        if attempt.stop_reason or started is None or finished is None:
            break
        if attempt.exit_code is None and not attempt.unstarted:  # lost with its node: not its doing
            break
        if (finished - started).total_seconds() >= RESET:
            break
        streak.append(attempt)
    return streak


def backoff(attempts: Iterable[Ended], base: float = DEFAULT_BASE) -> Backoff | None:
    """When pending work whose attempts are `attempts` (oldest first) may start again; None when it may
    start now (no quick exit last, or no delay configured)."""
    streak = quick_exits(attempts)
    if not streak or base <= 0:
        return None
    last = streak[0]
    finished = as_utc(last.finished_at)
    assert finished is not None  # quick_exits keeps only finished attempts
    delay = min(base * 2.0 ** min(len(streak) - 1, 30), base * CAP)
    reason = last.reason if last.unstarted else ""
    return Backoff(finished.timestamp() + delay, delay, len(streak), last.exit_code, last.unstarted, reason)


def restart_explanation(waiting: Backoff) -> Explanation:
    """Why work is pending while it waits: its quick exits and when it starts again. The time is a UTC clock
    time, not "in N s", so the sentence stays the same from one pass to the next."""
    at = datetime.fromtimestamp(waiting.until, UTC).strftime("%H:%M:%S UTC")
    times = "once" if waiting.quick_exits == 1 else f"{waiting.quick_exits} times in a row"
    within = f"within {RESET / 60:g} minutes of starting"
    if waiting.unstarted:
        why = f": {waiting.reason}" if waiting.reason else ""
        ended = f"it ended {times} {within} (the last: its node could not start it{why})"
    else:
        code = "" if waiting.exit_code is None else f", exit code {waiting.exit_code}"
        ended = f"it exited {times} {within} (the last{code})"
    return Explanation(
        RESTART_BACKOFF,
        f"{ended}; its next attempt starts at {at}, after a crash-loop backoff of {waiting.delay:g} s",
    )
