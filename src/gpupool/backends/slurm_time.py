"""Slurm time limits for gpupool's attempts: a job's `--time` (TimeLimit) as a backstop to `max_duration`,
and the partition's MaxTime that bounds it.

The head enforces `max_duration` itself (SIGTERM, then SIGKILL a grace period later); Slurm's TimeLimit
ends the job only where the head cannot, while it is down. So the limit given to Slurm is max_duration +
grace_period + TIME_LIMIT_MARGIN, in Slurm's whole minutes. A max_duration past the partition's MaxTime
could never run there (Slurm keeps the job pending for ever, reason PartitionTimeLimit, or rejects it with
EnforcePartLimits): `PartitionTime.past` says why, for the backend's `refuse` and `start`. See
docs/slurm.md, "Time limits".
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

from gpupool.backends.slurm_commands import format_time_limit
from gpupool.spec import format_duration

# max_duration + grace_period + this is the job's TimeLimit: while the head runs, its own stop must come
# first; the margin covers the loop's passes (a busy one takes seconds), scancel's round trip, and the skew
# between the head's clock and slurmctld's. Without max_duration no --time is given: the partition's
# DefaultTime applies (else its MaxTime).
TIME_LIMIT_MARGIN = 60.0
PARTITION_INTERVAL = 60.0  # seconds between reads of the partition's MaxTime (an operator may change it)
LIMIT_FILE = "slurm_time_limit"  # RUN_DIR/slurm_time_limit: the max_duration the job's TimeLimit follows
# What `scontrol update` says of a job that has ended ("Job has already finished for job 7"): nothing left
# to follow.
JOB_ENDED = ("already finished", "already completing or completed", "Invalid job id")


def minutes_for(seconds: float, grace_period: float) -> int:
    """Slurm's whole minutes for a job that may run `seconds`, then stop within its grace period."""
    return math.ceil((seconds + max(grace_period, 0.0) + TIME_LIMIT_MARGIN) / 60)


class PartitionTime:
    """The partition gpupool's jobs go to and its MaxTime in minutes, as last read (None: not known), so
    that a submit is answered without asking Slurm. Thread-safe: the poller writes, requests read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: tuple[str, int | None] | None = None  # (partition, MaxTime minutes or None: no limit)
        self.read_at = 0.0  # monotonic time of the last read, tried or done (0: never)

    def note(self, found: tuple[str, int | None] | None, at: float) -> bool:
        """Keep a read (None: unreadable); whether it says nothing now where it said something before, or
        at the first read (worth a line in the log)."""
        with self._lock:
            before, first = self._known, self.read_at == 0.0
            self._known, self.read_at = found, at
        return found is None and (first or before is not None)

    @property
    def most(self) -> int | None:
        """The MaxTime in minutes; None where the partition has none or it is not known."""
        with self._lock:
            return self._known[1] if self._known is not None else None

    def past(self, max_duration: float | None) -> tuple[str, str] | None:
        """Why a max_duration longer than the MaxTime cannot run, and the longest that can; None where it
        can (or the MaxTime is not known)."""
        with self._lock:
            name, minutes = self._known or ("", None)
        if max_duration is None or minutes is None or max_duration <= minutes * 60:
            return None
        longest = format_duration(minutes * 60)
        return (
            f"is longer than Slurm partition {name}'s MaxTime ({format_time_limit(minutes)}), so Slurm would "
            f"never start it; ask for a max_duration of {longest} or less (checkpoint and resume for longer "
            f"work), run the head on a partition that allows it (--partition), or ask the Slurm operator to "
            f"raise MaxTime",
            longest,
        )

    def limit(self, max_duration: float, grace_period: float) -> int:
        """The job's TimeLimit in minutes (see TIME_LIMIT_MARGIN); capped at the MaxTime where only the
        grace period and margin would reach past it (Slurm then ends the job at MaxTime, with its own
        KillWait, if the head is down)."""
        minutes = minutes_for(max_duration, grace_period)
        most = self.most
        if most is None or max_duration > most * 60:
            return minutes
        return min(minutes, most)


def followed(run_dir: Path) -> tuple[bool, float | None]:
    """Whether RUN_DIR/slurm_time_limit says which max_duration the job's TimeLimit follows, and which."""
    try:
        text = (run_dir / LIMIT_FILE).read_text().strip()
        return True, None if text == "none" else float(text)
    except (OSError, ValueError):
        return False, None  # an attempt started before gpupool set --time


def write_followed(run_dir: Path, max_duration: float | None) -> None:
    (run_dir / LIMIT_FILE).write_text(("none" if max_duration is None else repr(float(max_duration))) + "\n")
