"""The local backend finds an attempt whose head died before writing its pid file: the attempt's shim
writes its own pid first, and `find` trusts that pid only while its process names the attempt's run dir."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from gpupool.backends.base import Launch, Phase
from gpupool.backends.local import LocalBackend


def _launch(tmp_path: Path, script: str) -> Launch:
    return Launch(
        attempt_id=1, workload_id=1, attempt_number=0, script=script + "\n", env=dict(os.environ),
        workdir=tmp_path, run_dir=tmp_path / "run", log_path=tmp_path / "attempt.log",
    )  # fmt: skip


def _wait_for(path: Path) -> None:
    deadline = time.time() + 10
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_an_attempt_without_a_pid_file_is_found_by_its_shims_pid(tmp_path: Path) -> None:
    launch = _launch(tmp_path, "sleep 30")
    started = LocalBackend().start(launch)
    try:
        _wait_for(launch.run_dir / "shim_pid")
        (launch.run_dir / "pid").unlink()  # as if the head died right after starting it

        found = LocalBackend().find(launch.run_dir)  # a new head, which never saw it start
        assert found is not None and found.pid == started.pid
        assert abs(found.start_time - started.start_time) < 0.05
        assert LocalBackend().status(found, launch.run_dir).phase is Phase.RUNNING
        assert (launch.run_dir / "pid").exists(), "what was found is written down for the next restart"
    finally:
        os.killpg(started.pid, signal.SIGKILL)


def test_a_finished_attempt_found_by_its_shims_pid_keeps_its_exit_code(tmp_path: Path) -> None:
    launch = _launch(tmp_path, "exit 7")
    backend = LocalBackend()
    started = backend.start(launch)
    _wait_for(launch.run_dir / "exit_code")
    (launch.run_dir / "pid").unlink()
    found = LocalBackend().find(launch.run_dir)
    assert found is not None and found.pid == started.pid
    state = LocalBackend().status(found, launch.run_dir)
    assert state.phase is Phase.EXITED and state.exit_code == 7


def test_a_reused_pid_is_not_taken_for_the_attempt(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "shim_pid").write_text(f"{os.getpid()}\n")  # a live process that is not the attempt's shim
    found = LocalBackend().find(run_dir)
    assert found is not None and found.start_time == 0.0
    state = LocalBackend().status(found, run_dir)
    assert state.phase is Phase.VANISHED, "the test process must not be adopted as the attempt"


def test_an_attempt_that_was_never_launched_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    assert LocalBackend().find(tmp_path / "run") is None
