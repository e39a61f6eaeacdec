"""The interface every execution backend presents to the control loop (local today; agent, slurm later)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Launch:
    """Everything needed to start one attempt, decided by control; the backend only carries it out."""

    attempt_id: int
    workload_id: int
    attempt_number: int
    script: str
    env: dict[str, str]
    workdir: Path
    run_dir: Path
    log_path: Path


@dataclass(frozen=True, slots=True)
class Handle:
    """How to find a started attempt again, even after a restart: pid plus its start time."""

    pid: int
    start_time: float


class Phase(Enum):
    RUNNING = "running"
    EXITED = "exited"
    VANISHED = "vanished"  # gone without leaving an exit status


@dataclass(frozen=True, slots=True)
class Status:
    phase: Phase
    exit_code: int | None = None
    detail: str = ""


class LaunchError(RuntimeError):
    """The attempt could not be started; the message says why (missing workdir, bad interpreter, ...)."""


class Backend(Protocol):
    name: str

    def start(self, launch: Launch) -> Handle: ...

    def status(self, handle: Handle, run_dir: Path) -> Status: ...

    def signal(self, handle: Handle, signum: int) -> None: ...

    def find(self, run_dir: Path) -> Handle | None:
        """The handle an attempt wrote at start, for attempts whose pid never reached the store."""
        ...

    def cleanup(self, handle: Handle) -> None:
        """Kill anything the attempt left behind in its process group."""
        ...
