"""Starting attempts on Slurm when slurmctld cannot be reached, job names unique per attempt, start-up
errors that name their cause, and which Slurm nodes take work. Against stand-in commands (slurm_stub.py)."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import pytest

from gpupool.backends.base import BackendUnavailable, Handle, LaunchError
from gpupool.backends.slurm_commands import SlurmCommands, SlurmError
from tests.unit.backends.slurm_stub import NODE, Stub


@pytest.fixture
def stub(tmp_path: Path) -> Stub:
    return Stub(tmp_path)


def test_an_sbatch_that_cannot_reach_slurmctld_leaves_the_backend_unavailable_not_the_node_failed(
    stub: Stub, tmp_path: Path
) -> None:
    stub.answer("sbatch.mode", "unreachable")
    with pytest.raises(BackendUnavailable, match=r"Unable to contact slurm controller \(connect failure\)"):
        stub.backend().start(stub.launch(tmp_path))
    assert stub.calls("scancel") == [], "nothing was submitted: nothing to cancel"


def test_an_sbatch_slurm_refuses_is_still_a_launch_error(stub: Stub, tmp_path: Path) -> None:
    stub.answer("sbatch.mode", "refused")
    with pytest.raises(LaunchError, match="Requested node configuration is not available"):
        stub.backend().start(stub.launch(tmp_path))


def test_an_sbatch_that_timed_out_cancels_the_job_slurmctld_may_have_taken_under_the_attempts_name(
    stub: Stub, tmp_path: Path
) -> None:
    stub.answer("sbatch.mode", "hang")
    stub.answer("named.gpupool-3.0.0123abcd", "77")  # slurmctld took it after all
    backend = stub.backend(timeout=1.0)
    with pytest.raises(BackendUnavailable, match="did not answer"):
        backend.start(stub.launch(tmp_path))
    assert "-h -n gpupool-3.0.0123abcd -o %A" in stub.calls("squeue")
    assert stub.calls("scancel") == ["77"]


def test_an_untracked_job_that_could_not_be_cancelled_is_said_in_the_log(
    stub: Stub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stub.answer("sbatch.mode", "hang")
    stub.answer("named.gpupool-3.0.0123abcd", "77")
    stub.answer("scancel.fails", "")
    backend = stub.backend(timeout=1.0)
    with caplog.at_level(logging.ERROR, logger="gpupool.slurm"), pytest.raises(BackendUnavailable):
        backend.start(stub.launch(tmp_path))
    said = [r.getMessage() for r in caplog.records if "slurm_job_may_run_untracked" in r.getMessage()]
    assert said and "scancel --name=gpupool-3.0.0123abcd" in said[0]


def test_a_job_name_carries_the_attempts_fencing_token_and_find_reads_it_back(
    stub: Stub, tmp_path: Path
) -> None:
    launch = stub.launch(tmp_path, token="feedbeef00112233")
    backend = stub.backend()
    backend.start(launch)
    args = (stub.dir / "sbatch.args").read_text().splitlines()
    assert "--job-name=gpupool-3.0.feedbeef" in args
    assert (launch.run_dir / "slurm_job_name").read_text().strip() == "gpupool-3.0.feedbeef"

    # The head died before it wrote the job id down: a new head finds the job by that name only.
    (launch.run_dir / "slurm_job_id").unlink()
    stub.answer("named.gpupool-3.0.feedbeef", "42")
    stub.answer("named.gpupool-3.0", "13")  # an older job of the same workload and attempt number
    found = stub.backend().find(launch.run_dir)
    assert found is not None and found.pid == 42


def test_an_attempt_started_before_names_carried_a_token_is_found_by_its_old_name(
    stub: Stub, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "3" / "0"
    run_dir.mkdir(parents=True)
    (run_dir / "job.sh").write_text("#!/bin/sh\n")  # what the old start() wrote before its sbatch
    stub.answer("named.gpupool-3.0", "13")
    found = stub.backend().find(run_dir)
    assert found is not None and found.pid == 13
    assert (run_dir / "slurm_job_id").read_text().strip() == "13"


def test_an_attempt_that_never_reached_sbatch_is_not_adopted_from_a_job_of_the_same_number(
    stub: Stub, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "3" / "0"
    run_dir.mkdir(parents=True)
    stub.answer("named.gpupool-3.0", "13")
    assert stub.backend().find(run_dir) is None


def test_a_missing_slurm_conf_fails_at_once_naming_the_file(tmp_path: Path) -> None:
    stub = Stub(tmp_path)
    commands = SlurmCommands({**stub.env, "SLURM_CONF": str(tmp_path / "nonexistent")})
    began = time.monotonic()
    with pytest.raises(SlurmError, match=r"SLURM_CONF=.*/nonexistent: no such file"):
        commands.ping()
    assert time.monotonic() - began < 5
    assert stub.calls("scontrol") == []


def test_a_command_that_does_not_answer_passes_on_what_it_said(stub: Stub) -> None:
    stub.answer("ping.mode", "hang")
    with pytest.raises(SlurmError, match=r"did not answer in 1s; it said: .*Failed to connect to munged"):
        SlurmCommands(stub.env, timeout=1.0).ping()


@pytest.mark.parametrize(
    ("state", "expected"),
    [("IDLE", "ready"), ("IDLE*", "cordoned"), ("MIXED*", "cordoned"), ("DOWN*", "lost")],
)
def test_a_node_whose_slurmd_does_not_respond_takes_no_new_work(
    stub: Stub, state: str, expected: str
) -> None:
    stub.answer("nodes.out", NODE.format(state=state, reason=""))
    inventory = stub.backend().inventory()
    assert inventory is not None
    (node,) = inventory.nodes
    assert node.state == expected
    if state.endswith("*") and expected == "cordoned":
        assert "NOT_RESPONDING" in node.state_reason


def test_a_gangs_sigterm_reaches_its_ranks_without_stopping_srun(stub: Stub, tmp_path: Path) -> None:
    backend = stub.backend()
    gang = backend.start(stub.launch(tmp_path, pods=2))
    single = Handle(99, 0.0)
    backend.signal(gang, signal.SIGTERM)
    backend.signal(single, signal.SIGTERM)
    backend.signal(gang, signal.SIGKILL)
    assert stub.calls("scancel") == [
        "--signal=TERM 42",
        "--signal=TERM --full 99",
        "--signal=KILL --full 42",
        "42",
    ]
