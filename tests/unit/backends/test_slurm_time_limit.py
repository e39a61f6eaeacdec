"""A workload's max_duration reaches Slurm as the job's time limit (a backstop for while the head is down),
work longer than the partition's MaxTime is refused at submit, and `gpupool update --max-duration` makes a
running job's TimeLimit follow. Against stand-in commands (slurm_stub.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from gpupool.backends.base import BackendUnavailable, Handle, Unrunnable
from gpupool.backends.slurm_commands import format_time_limit, parse_time_limit, partition_max_time
from gpupool.control import changes, queues
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.spec import SpecError, parse_workload_spec
from gpupool.store.db import Store
from gpupool.store.models import Event, Workload
from tests.support.store import submit_running
from tests.unit.backends.slurm_stub import Stub

ONE_DAY = "PartitionName=gpu Default=YES MaxTime=1-00:00:00 Nodes=n1 State=UP"


@pytest.fixture
def stub(tmp_path: Path) -> Stub:
    return Stub(tmp_path)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'gpupool.db'}")
    queues.ensure_default_queue(store)
    yield store
    store.close()


def _sbatch_time(stub: Stub) -> list[str]:
    return [a for a in (stub.dir / "sbatch.args").read_text().splitlines() if a.startswith("--time")]


def _updates(stub: Stub) -> list[str]:
    return [c for c in stub.calls("scontrol") if c.startswith("update")]


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("30", 30),
        ("30:30", 31),  # minutes:seconds; seconds round up, as Slurm's own reading does
        ("4:30:30", 271),  # hours:minutes:seconds
        ("4-12", 6480),  # days-hours
        ("4-12:15", 6495),  # days-hours:minutes
        ("4-12:15:30", 6496),
        ("1-00:00:00", 1440),
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("infinite", None),
    ],
)
def test_a_slurm_time_limit_is_read_in_minutes_as_slurm_reads_it(text: str, minutes: int | None) -> None:
    assert parse_time_limit(text) == minutes


@pytest.mark.parametrize("text", ["NONE", "N/A", "NOT_SET", "", "1h", "1-2-3"])
def test_a_time_limit_that_is_not_one_is_not_read_as_no_limit(text: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm time limit"):
        parse_time_limit(text)


def test_a_time_limit_is_written_as_days_hours_minutes_seconds_and_reads_back() -> None:
    assert format_time_limit(3) == "0-00:03:00"
    assert format_time_limit(122) == "0-02:02:00"
    assert format_time_limit(1440) == "1-00:00:00"
    assert format_time_limit(None) == "UNLIMITED"
    for minutes in (1, 59, 60, 61, 1439, 1441, 14 * 1440 + 7):
        assert parse_time_limit(format_time_limit(minutes)) == minutes
    with pytest.raises(ValueError):  # "0" would ask Slurm for no limit at all
        format_time_limit(0)


def test_the_max_time_is_the_named_partitions_else_the_default_partitions() -> None:
    records = [
        {"PartitionName": "debug", "Default": "YES", "MaxTime": "30:00"},
        {"PartitionName": "gpu", "Default": "NO", "MaxTime": "UNLIMITED"},
        {"PartitionName": "odd", "MaxTime": "NONE"},
    ]
    assert partition_max_time(records, "gpu") == ("gpu", None)
    assert partition_max_time(records, None) == ("debug", 30)
    assert partition_max_time(records, "odd") is None, "unreadable: not known, never 'no limit'"
    assert partition_max_time(records, "missing") is None


def test_sbatch_asks_for_max_duration_plus_grace_period_plus_a_margin_in_whole_minutes(
    stub: Stub, tmp_path: Path
) -> None:
    launch = dataclasses.replace(stub.launch(tmp_path), max_duration=60.0, grace_period=5.0)
    stub.backend().start(launch)
    assert _sbatch_time(stub) == ["--time=0-00:03:00"]  # 60 + 5 + 60 s = 2m05s, rounded up
    assert (launch.run_dir / "slurm_time_limit").read_text().strip() == "60.0"


def test_without_max_duration_sbatch_asks_for_no_time_limit(stub: Stub, tmp_path: Path) -> None:
    stub.backend().start(stub.launch(tmp_path))
    assert _sbatch_time(stub) == [], "the partition's DefaultTime applies"


def test_only_the_grace_period_and_margin_past_max_time_are_capped_at_max_time(
    stub: Stub, tmp_path: Path
) -> None:
    stub.answer("partition.out", ONE_DAY)
    launch = dataclasses.replace(stub.launch(tmp_path), max_duration=86400.0)
    stub.backend().start(launch)
    assert _sbatch_time(stub) == ["--time=1-00:00:00"]


def test_a_max_duration_past_the_partitions_max_time_is_refused_at_submit_with_the_fix(stub: Stub) -> None:
    stub.answer("partition.out", ONE_DAY)
    backend = stub.backend()
    asked = len(stub.calls("scontrol"))
    with pytest.raises(SpecError) as refused:
        backend.refuse(parse_workload_spec({"commands": ["true"], "max_duration": "2d"}))
    assert str(refused.value).startswith(
        "max_duration: '2d' is longer than Slurm partition gpu's MaxTime (1-00:00:00), so Slurm would never "
        "start it; ask for a max_duration of 1d or less"
    )
    assert "--partition" in str(refused.value) and "raise MaxTime" in str(refused.value)
    backend.refuse(parse_workload_spec({"commands": ["true"], "max_duration": "1d"}))
    backend.refuse(parse_workload_spec({"commands": ["true"]}))
    assert len(stub.calls("scontrol")) == asked, "a submit never waits on Slurm: the MaxTime is cached"


def test_a_max_time_slurm_does_not_say_refuses_nothing(stub: Stub) -> None:
    stub.answer("partition.out", "PartitionName=gpu Default=YES Nodes=n1 State=UP")
    stub.backend().refuse(parse_workload_spec({"commands": ["true"], "max_duration": "30d"}))


def test_a_partition_read_that_fails_keeps_the_max_time_last_read(stub: Stub) -> None:
    stub.answer("partition.out", ONE_DAY)
    backend = stub.backend()
    (stub.bin / "scontrol").write_text("#!/bin/sh\necho 'Unable to contact slurm controller' >&2\nexit 1\n")
    backend._read_max_time()
    with pytest.raises(SpecError, match="MaxTime"):
        backend.refuse(parse_workload_spec({"commands": ["true"], "max_duration": "2d"}))


def test_work_past_max_time_submitted_before_the_refusal_fails_at_start(stub: Stub, tmp_path: Path) -> None:
    stub.answer("partition.out", ONE_DAY)
    launch = dataclasses.replace(stub.launch(tmp_path), max_duration=2 * 86400.0)
    with pytest.raises(Unrunnable, match=r"max_duration: 2d is longer than Slurm partition gpu's MaxTime"):
        stub.backend().start(launch)
    assert not (stub.dir / "sbatch.args").exists()


def test_a_changed_max_duration_becomes_the_running_jobs_time_limit_once(stub: Stub, tmp_path: Path) -> None:
    launch = dataclasses.replace(stub.launch(tmp_path), max_duration=60.0, grace_period=5.0)
    backend = stub.backend()
    handle = backend.start(launch)
    assert backend.follow_time_limit(handle, launch.run_dir, 60.0, 5.0) == ""
    assert _updates(stub) == [], "as sbatch set it"
    assert backend.follow_time_limit(handle, launch.run_dir, 7200.0, 5.0) == ""
    assert _updates(stub) == ["update JobId=42 TimeLimit=0-02:02:00"]
    assert backend.follow_time_limit(handle, launch.run_dir, 7200.0, 5.0) == ""
    assert backend.follow_time_limit(handle, launch.run_dir, None, 5.0) == ""  # no limit: MaxTime's
    assert _updates(stub)[1:] == ["update JobId=42 TimeLimit=UNLIMITED"]


def test_a_time_limit_slurm_refuses_to_raise_is_said_with_the_fix(stub: Stub, tmp_path: Path) -> None:
    launch = dataclasses.replace(stub.launch(tmp_path), max_duration=60.0, grace_period=5.0)
    backend = stub.backend()
    handle = backend.start(launch)
    stub.answer("update.mode", "denied")
    said = backend.follow_time_limit(handle, launch.run_dir, 7200.0, 5.0)
    assert "Slurm job 42 keeps its old TimeLimit" in said and "Access/permission denied" in said
    assert "scontrol update JobId=42 TimeLimit=0-02:02:00" in said and "allow_user_incr_time" in said
    assert (launch.run_dir / "slurm_time_limit").read_text().strip() == "60.0", "not followed"

    stub.answer("update.mode", "ended")
    assert backend.follow_time_limit(handle, launch.run_dir, 7200.0, 5.0) == "", "nothing left to follow"
    stub.answer("update.mode", "unreachable")
    with pytest.raises(BackendUnavailable, match="Unable to contact slurm controller"):
        backend.follow_time_limit(handle, launch.run_dir, 7200.0, 5.0)


def test_the_loop_gives_slurm_a_raised_limit_and_records_a_refusal_in_the_workloads_history(
    stub: Stub, tmp_path: Path, store: Store
) -> None:
    launch = dataclasses.replace(stub.launch(tmp_path), max_duration=60.0, grace_period=5.0)
    backend = stub.backend()
    handle = backend.start(launch)
    wid = submit_running(
        store, {"commands": ["true"], "max_duration": "60s", "grace_period": "5s"}, node="n1",
        pid=handle.pid, run_dir=str(launch.run_dir),
    )  # fmt: skip
    loop = Reconciler(store, backend, None, ControlSettings(home=tmp_path, node_name="n1"))
    loop.follow_time_limits(time.time())
    assert _updates(stub) == [], "unchanged since sbatch"

    changes.update(store, wid, limit=changes.TimeLimit(7200.0))
    stub.answer("update.mode", "denied")
    loop.follow_time_limits(time.time())
    loop.follow_time_limits(time.time())
    assert _updates(stub) == ["update JobId=42 TimeLimit=0-02:02:00"], "asked once, not every pass"
    with store.read() as s:
        history = s.scalars(select(Event.reason).where(Event.object_id == str(wid))).all()
        assert s.get(Workload, wid) is not None
    assert any("Slurm job 42 keeps its old TimeLimit" in reason for reason in history), history

    # A head restarted since asks once more (an operator may have allowed it meanwhile).
    stub.answer("update.mode", "")
    Reconciler(store, backend, None, ControlSettings(home=tmp_path, node_name="n1")).follow_time_limits(0.0)
    assert _updates(stub)[1:] == ["update JobId=42 TimeLimit=0-02:02:00"]
    assert (launch.run_dir / "slurm_time_limit").read_text().strip() == "7200.0"


def test_a_job_started_without_time_limit_is_left_alone_until_a_limit_is_given(
    stub: Stub, tmp_path: Path
) -> None:
    launch = stub.launch(tmp_path)
    backend = stub.backend()
    handle = backend.start(launch)
    (launch.run_dir / "slurm_time_limit").unlink()  # as an attempt started before gpupool set --time
    assert backend.follow_time_limit(handle, launch.run_dir, None, 30.0) == ""
    assert _updates(stub) == []
    assert backend.follow_time_limit(Handle(42, 0.0), launch.run_dir, 3600.0, 30.0) == ""
    assert _updates(stub) == ["update JobId=42 TimeLimit=0-01:02:00"]


def test_a_lowered_limit_never_ends_the_job_before_the_heads_own_stop_with_its_grace_period(
    stub: Stub, tmp_path: Path
) -> None:
    launch = dataclasses.replace(stub.launch(tmp_path), max_duration=7200.0, grace_period=5.0)
    backend = stub.backend()
    handle = backend.start(launch)
    started = datetime.fromtimestamp(time.time() - 3 * 3600).strftime("%Y-%m-%dT%H:%M:%S")
    stub.answer("squeue.out", f"42|RUNNING|1|1|gres:gpu:1|root|{started}|n1|None|gpupool-3.0.0123abcd")
    backend.refresh()
    assert backend.follow_time_limit(handle, launch.run_dir, 60.0, 5.0) == ""
    # it ran 3 h: at least 3h + 5 s + 60 s, so that the head's SIGTERM and grace period come first
    assert _updates(stub) == ["update JobId=42 TimeLimit=0-03:02:00"]
