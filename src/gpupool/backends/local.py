"""Run attempts as real processes on this machine, each in its own process group and directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from gpupool import process_start
from gpupool.backends.base import (
    Handle,
    Inventory,
    Launch,
    LaunchError,
    Phase,
    Status,
    recorded_end,
    recorded_exit_code,
)

if TYPE_CHECKING:
    from gpupool.spec import WorkloadSpec

# bash runs the commands in order and stops at the first failure; on SIGTERM it lets the running command
# finish its own shutdown (checkpointing) before exiting, instead of dying under it, and then exits with
# that command's own code: 143 where the signal ended it, else the code it chose (a program that exits 42
# on SIGTERM ends the attempt with 42, as under Slurm), and runs no command after it. On the first
# command's line, so that bash's own messages number the lines as the spec does ("bash: line 1: trian:
# command not found" for the first command).
SCRIPT_PRELUDE = "trap 'exit $?' TERM INT; set -e; "

# The attempt's parent, so its exit status outlives a head restart: a POSIX shell (cheap to start) that
# outlasts SIGTERM (a trapped signal waits for the foreground command), then writes RUN_DIR/exit_code
# atomically. It first writes its own pid (RUN_DIR/shim_pid), so that an attempt whose head died between
# starting it and writing RUN_DIR/pid is still found (`find`). $1 is the run dir, $2 the job script.
SHIM = (
    'printf "%s\n" "$$" > "$1/shim_pid"; trap true TERM INT HUP; bash -c "$2"; code=$?; '
    'printf "%s\\n" "$code" > "$1/exit_code.tmp" && mv -f "$1/exit_code.tmp" "$1/exit_code"; exit "$code"'
)


class LocalBackend:
    name = "local"

    def __init__(self, on_exit: Callable[[], None] | None = None) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self._on_exit = on_exit

    def submit_warnings(self, spec: WorkloadSpec, workload_id: int) -> list[str]:
        """What to tell a submitter at once: a `workdir` that is not a folder on this machine, where this
        backend runs all work. Accepted (earlier work may make it), but each start fails until it is there,
        as a node failure retried with backoff: a typo took minutes to end in a clear failure."""
        if spec.workdir is None or Path(spec.workdir).is_dir():
            return []
        return [
            f"workdir: {spec.workdir} is not a folder on this machine, where the head runs its work; each "
            f"start fails until it is there: fix the path, or `gpupool cancel {workload_id}`"
        ]

    def start(self, launch: Launch) -> Handle:
        if not launch.workdir.is_dir():
            raise LaunchError(f"workdir {launch.workdir} does not exist on this node")
        launch.run_dir.mkdir(parents=True, exist_ok=True)
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = ["/bin/sh", "-c", SHIM, "gpupool-attempt", str(launch.run_dir), SCRIPT_PRELUDE + launch.script]
        # The output is its owner's business (`--private-logs`): no other Unix user of the machine reads it.
        log_fd = os.open(launch.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(log_fd, "ab") as log:
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=launch.workdir,
                    env=launch.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise LaunchError(f"cannot start the attempt: {exc}") from exc
        endpoint = ""
        if launch.service_port:
            endpoint = f"{launch.env.get('GPUPOOL_MASTER_ADDR') or '127.0.0.1'}:{launch.service_port}"
        handle = _handle(proc.pid, process_start.started(proc.pid), endpoint)
        _record(launch.run_dir, handle)
        with self._lock:
            self._children[proc.pid] = proc
        threading.Thread(target=self._wait, args=(proc,), name=f"wait-{proc.pid}", daemon=True).start()
        return handle

    def _wait(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        if self._on_exit is not None:
            self._on_exit()

    def status(self, handle: Handle, run_dir: Path) -> Status:
        with self._lock:
            child = self._children.get(handle.pid)
        if child is not None:
            code = child.poll()
            if code is None:
                return Status(Phase.RUNNING)
            with self._lock:
                self._children.pop(handle.pid, None)
            recorded = recorded_exit_code(run_dir)
            return Status(Phase.EXITED, recorded if recorded is not None else _shell_code(code))
        # Adopted (started by an earlier head): the shim records the exit code as its last act, so once it
        # is there the attempt has ended, though the shim may live a moment longer to exit.
        recorded = recorded_exit_code(run_dir)
        if recorded is not None:
            return Status(Phase.EXITED, recorded, ended_at=recorded_end(run_dir))
        if _alive(handle):
            return Status(Phase.RUNNING, detail="adopted")
        return Status(Phase.VANISHED, detail="the process ended without recording an exit status")

    def signal(self, handle: Handle, signum: int) -> None:
        if not _alive(handle):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(handle.pid, signum)

    def find(self, run_dir: Path) -> Handle | None:
        try:
            pid, start, *boot = (run_dir / "pid").read_text().split()
            return Handle(int(pid), float(start), boot=boot[0] if boot else "")
        except (OSError, ValueError):
            return _find_shim(run_dir)

    def cleanup(self, handle: Handle) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pid, signal.SIGKILL)

    def inventory(self) -> Inventory | None:
        return None  # the head's GPU provider describes this machine (Reconciler.register_node)

    def drain_node(self, name: str, reason: str) -> None:
        """Nothing else schedules on this machine: gpupool's own node state is the whole truth."""

    def resume_node(self, name: str) -> None:
        """Nothing to undo; see drain_node."""


def _find_shim(run_dir: Path) -> Handle | None:
    """The attempt's shim by the pid it wrote itself, when the head died before writing RUN_DIR/pid: the
    process of that pid counts only if its command line names this run dir (else the pid was reused). One
    that ended already gives a handle that is not alive, whose status is its recorded exit code."""
    try:
        pid = int((run_dir / "shim_pid").read_text())
    except (OSError, ValueError):
        return None
    try:
        ours = psutil.Process(pid).cmdline()[4:5] == [str(run_dir)]
    except (psutil.Error, OSError):
        ours = False
    handle = _handle(pid, process_start.started(pid) if ours else None)
    with contextlib.suppress(OSError):
        _record(run_dir, handle)
    return handle


def _handle(pid: int, start: process_start.ProcessStart | None, endpoint: str = "") -> Handle:
    """A handle to `pid`; one with no start (the process is gone already) is never alive."""
    if start is None:
        return Handle(pid, 0.0, endpoint)
    return Handle(pid, start.seconds, endpoint, start.boot)


def _record(run_dir: Path, handle: Handle) -> None:
    """RUN_DIR/pid: "PID START BOOT" (BOOT absent where a start is on the wall clock, as before 2026-12)."""
    (run_dir / "pid").write_text(f"{handle.pid} {handle.start_time!r} {handle.boot}".rstrip() + "\n")


def _alive(handle: Handle) -> bool:
    """True if the pid still runs the process we started (not a reused pid, not a zombie)."""
    recorded = process_start.ProcessStart(handle.start_time, handle.boot)
    if not handle.start_time or not recorded.matches(handle.pid):
        return False
    try:
        return psutil.Process(handle.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _shell_code(code: int) -> int:
    return code if code >= 0 else 128 - code
