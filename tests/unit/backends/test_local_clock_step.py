"""An attempt is still found, and still reached by signals, after the wall clock is stepped (NTP, a VM
paused or forked): its process is named by its start on the kernel's clock since boot, which no step
moves. The step is made where psutil reads it (the boot time, "now minus uptime" in /proc/stat), as
stepping this machine's clock would disturb everything else running on it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from gpupool import process_start
from gpupool.backends.base import Handle, Launch, Phase
from gpupool.backends.local import LocalBackend

pytestmark = pytest.mark.skipif(not process_start.boot_id(), reason="boot-relative starts are Linux's")


def _launch(tmp_path: Path, script: str) -> Launch:
    return Launch(
        attempt_id=1, workload_id=1, attempt_number=0, script=script + "\n", env=dict(os.environ),
        workdir=tmp_path, run_dir=tmp_path / "run", log_path=tmp_path / "attempt.log",
    )  # fmt: skip


def _step_the_wall_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    from psutil import _pslinux

    stepped = _pslinux.boot_time() + seconds
    monkeypatch.setattr(_pslinux, "boot_time", lambda: stepped)


def _wait_for(path: Path, text: str = "") -> None:
    deadline = time.monotonic() + 10
    while not path.exists() or text not in path.read_text():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_an_adopted_attempt_outlives_a_clock_step_and_still_gets_its_signals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = _launch(tmp_path, "echo ready; sleep 30")
    started = LocalBackend().start(launch)
    try:
        _wait_for(launch.log_path, "ready")  # its traps are set: SIGTERM now ends it as a stop would
        found = LocalBackend().find(launch.run_dir)  # a head restarted after the start
        assert found == started and found.boot == process_start.boot_id()
        _step_the_wall_clock(monkeypatch, 3600)

        adopted = LocalBackend()
        assert adopted.status(found, launch.run_dir).phase is Phase.RUNNING
        adopted.signal(found, signal.SIGTERM)
        _wait_for(launch.run_dir / "exit_code")
        state = adopted.status(found, launch.run_dir)
        assert (state.phase, state.exit_code) == (Phase.EXITED, 143), "SIGTERM reached the attempt"
    finally:
        LocalBackend().cleanup(started)


def test_a_start_on_the_wall_clock_written_before_boot_ids_is_still_read(tmp_path: Path) -> None:
    """pid files (and attempts in the store) from before 2026-12 hold "PID EPOCH-START": still adopted."""
    launch = _launch(tmp_path, "sleep 30")
    started = LocalBackend().start(launch)
    try:
        (launch.run_dir / "pid").write_text(f"{started.pid} {psutil.Process(started.pid).create_time()!r}\n")
        found = LocalBackend().find(launch.run_dir)
        assert found is not None and found.boot == ""
        assert LocalBackend().status(found, launch.run_dir).phase is Phase.RUNNING
    finally:
        os.killpg(started.pid, signal.SIGKILL)


def test_a_pid_from_another_boot_is_not_taken_for_the_attempt(tmp_path: Path) -> None:
    """After a reboot the same pid can start at the same tick; the boot id tells them apart."""
    with subprocess.Popen(["sleep", "30"]) as other:
        try:
            start = process_start.started(other.pid)
            assert start is not None
            same_tick_other_boot = Handle(
                other.pid, start.seconds, boot="00000000-0000-0000-0000-000000000000"
            )
            (tmp_path / "run").mkdir()
            assert LocalBackend().status(same_tick_other_boot, tmp_path / "run").phase is Phase.VANISHED
            assert LocalBackend().status(
                Handle(other.pid, start.seconds, boot=start.boot), tmp_path / "run"
            ).phase is (Phase.RUNNING)
        finally:
            other.kill()


def test_a_wall_clock_start_does_not_survive_a_step_and_a_boot_relative_one_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why starts are recorded since boot: psutil's create_time moves with the wall clock."""
    me = os.getpid()
    since_boot = process_start.started(me)
    on_the_wall_clock = process_start.started(me, wall_clock=True)
    assert since_boot is not None and on_the_wall_clock is not None
    assert since_boot.matches(me) and on_the_wall_clock.matches(me)
    _step_the_wall_clock(monkeypatch, -90)
    assert since_boot.matches(me)
    assert not on_the_wall_clock.matches(me)
    with subprocess.Popen(["sleep", "5"]) as child:  # born now: on clock()'s clock, its start is now
        try:
            born = process_start.started(child.pid)
            assert born is not None and abs(process_start.clock() - born.seconds) < 0.5, born
        finally:
            child.kill()
