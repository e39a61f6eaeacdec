"""How the slurm backend tells how an attempt ended: the batch script's recorded exit code, unless Slurm
ended the job itself (a node set DOWN, a preemption), and when it ended. Against stand-in commands
(slurm_stub.py); tests/integration/test_slurm_backend.py runs the same against a real Slurm."""

from __future__ import annotations

import signal
from datetime import datetime
from pathlib import Path

import pytest

from gpupool.backends.base import Handle, Phase
from gpupool.backends.slurm_commands import parse_record
from tests.unit.backends.slurm_stub import JOB, NODE, Stub, set_mtime

ENDED = datetime(2026, 12, 7, 14, 10, 0).timestamp()


@pytest.fixture
def stub(tmp_path: Path) -> Stub:
    return Stub(tmp_path)


def _ended(run_dir: Path, code: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "exit_code").write_text(f"{code}\n")
    set_mtime(run_dir / "exit_code", ENDED)


def test_a_job_whose_node_slurm_set_down_is_a_node_failure_though_its_script_recorded_sigterms_143(
    stub: Stub, tmp_path: Path
) -> None:
    stub.job("7", "NODE_FAIL", reason="NodeDown", end="2026-12-07T14:10:02")
    run_dir = tmp_path / "run"
    _ended(run_dir, 143)  # slurmstepd's SIGTERM ended the commands, the script wrote it down
    backend = stub.backend()

    state = backend.status(Handle(7, 0.0), run_dir)
    assert (state.phase, state.cause) == (Phase.VANISHED, "node-failure")
    assert "NODE_FAIL (NodeDown)" in state.detail
    assert state.ended_at == ENDED, "charged until the script's end, not until the head looked"
    asked = len(stub.calls("scontrol"))
    for _ in range(5):  # status() is called on every pass: Slurm is asked once
        assert backend.status(Handle(7, 0.0), run_dir).cause == "node-failure"
    assert len(stub.calls("scontrol")) == asked


def test_a_preempted_job_is_a_preemption_though_its_script_recorded_an_exit_code(
    stub: Stub, tmp_path: Path
) -> None:
    stub.job("8", "PREEMPTED", reason="None", end="2026-12-07T14:10:02")
    run_dir = tmp_path / "run"
    _ended(run_dir, 143)
    state = stub.backend().status(Handle(8, 0.0), run_dir)
    assert (state.phase, state.cause) == (Phase.VANISHED, "preemption")


def test_a_normal_exit_is_settled_from_the_recorded_code_without_asking_slurm(
    stub: Stub, tmp_path: Path
) -> None:
    stub.job("9", "NODE_FAIL", end="2026-12-07T14:10:02")  # never read: a code below 129 is the work's own
    run_dir = tmp_path / "run"
    _ended(run_dir, 3)
    backend = stub.backend()
    before = len(stub.calls("scontrol"))
    state = backend.status(Handle(9, 0.0), run_dir)
    assert (state.phase, state.exit_code, state.ended_at) == (Phase.EXITED, 3, ENDED)
    assert len(stub.calls("scontrol")) == before


def test_a_sigterm_gpupool_sent_itself_is_the_jobs_exit_code_without_asking_slurm(
    stub: Stub, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    backend = stub.backend()
    backend.signal(Handle(10, 0.0), signal.SIGTERM)  # a reclaim
    _ended(run_dir, 143)
    before = len(stub.calls("scontrol"))
    state = backend.status(Handle(10, 0.0), run_dir)
    assert (state.phase, state.exit_code) == (Phase.EXITED, 143)
    assert len(stub.calls("scontrol")) == before


def test_a_signal_death_while_slurm_still_runs_the_job_is_the_jobs_own_exit(
    stub: Stub, tmp_path: Path
) -> None:
    # killed by the kernel's OOM killer, say: the batch script recorded 137 and waits for the hand-off
    stub.job("11", "RUNNING", end="Unknown")
    run_dir = tmp_path / "run"
    _ended(run_dir, 137)
    state = stub.backend().status(Handle(11, 0.0), run_dir)
    assert (state.phase, state.exit_code, state.ended_at) == (Phase.EXITED, 137, ENDED)


def test_a_signal_death_is_not_settled_while_slurmctld_cannot_say_how_the_job_ended(
    stub: Stub, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    _ended(run_dir, 143)
    backend = stub.backend()
    stub.answer("job.12", "")  # scontrol printed nothing and failed: see below
    (stub.dir / "job.12").unlink()
    (stub.bin / "scontrol").write_text("#!/bin/sh\necho 'Unable to contact slurm controller' >&2; exit 1\n")
    state = backend.status(Handle(12, 0.0), run_dir)
    assert state.phase is Phase.RUNNING and "exit code 143" in state.detail


def test_a_job_that_left_no_exit_code_ends_with_slurms_exit_code_and_end_time(
    stub: Stub, tmp_path: Path
) -> None:
    stub.job("13", "FAILED", reason="NonZeroExitCode", exit="3:0", end="2026-12-07T14:10:00")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    backend = stub.backend()
    state = backend.status(Handle(13, 0.0), run_dir)
    assert (state.phase, state.exit_code) == (Phase.EXITED, 3)
    assert state.detail == "slurm job 13 ended FAILED (NonZeroExitCode)"
    assert state.ended_at == ENDED


def test_a_job_record_keeps_the_fields_after_its_reason() -> None:
    line = JOB.format(id="5", state="FAILED", reason="NonZeroExitCode", exit="2:0", end="2026-12-07T14:10:00")
    record = parse_record(line)
    assert record["Reason"] == "NonZeroExitCode"
    assert (record["ExitCode"], record["EndTime"]) == ("2:0", "2026-12-07T14:10:00")
    assert record["TresPerNode"] == "gres:gpu:1"


def test_a_node_record_keeps_its_free_text_reason_whole() -> None:
    line = NODE.format(state="IDLE+DRAIN", reason="Reason=bad fan on gpu 3 [root@2026-12-07T14:09:15]")
    record = parse_record(line, reason_last=True)
    assert record["Reason"] == "bad fan on gpu 3 [root@2026-12-07T14:09:15]"
    assert record["State"] == "IDLE+DRAIN" and record["OS"] == "Linux 6.1 #1 SMP"
