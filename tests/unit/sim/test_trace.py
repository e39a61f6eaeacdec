"""Trace loaders: each format becomes jobs in seconds and GPUs; bad input names the flag and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.sim.errors import SimError
from gpupool.sim.trace import load_trace, parse_timestamp, select


def test_philly_rows_become_jobs_in_submit_order_with_the_vc_as_queue(fixtures: Path) -> None:
    trace = load_trace(f"philly:{fixtures / 'philly_small.csv'}")
    assert len(trace.jobs) == 42 and trace.dated
    assert [j.submit for j in trace.jobs] == sorted(j.submit for j in trace.jobs)
    assert {j.queue for j in trace.jobs} == {"vc-a", "vc-b"}
    assert all(j.gpus >= 1 and j.duration > 0 for j in trace.jobs)


def test_jobs_are_numbered_in_submit_order_those_of_one_moment_in_the_files_order(tmp_path: Path) -> None:
    path = tmp_path / "philly.csv"
    path.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-02 00:00:09,10,1,10,late\n"
        "2017-10-02 00:00:05,20,2,40,first-of-two\n"
        "1506902400,30,4,120,seconds\n"  # 2017-10-02 00:00:00 as seconds since the epoch
        "2017-10-02 00:00:05,40,8,320,second-of-two\n"
        "2017-10-02T02:00:00+02:00,50,1,50,with-zone\n"  # the same moment as 00:00:00 UTC
    )
    jobs = load_trace(f"philly:{path}").jobs
    assert [(j.id, j.queue) for j in jobs] == [
        (0, "seconds"),
        (1, "with-zone"),
        (2, "first-of-two"),
        (3, "second-of-two"),
        (4, "late"),
    ]
    assert [j.submit - jobs[0].submit for j in jobs] == [0, 0, 5, 5, 9]
    assert parse_timestamp("2017-10-02 00:00:05") == 1506902405


def test_a_date_window_keeps_the_jobs_submitted_inside_it_and_starts_the_clock_there(fixtures: Path) -> None:
    trace = load_trace(f"philly:{fixtures / 'philly_small.csv'}")
    jobs, origin = select(trace, "2017-10-02..2017-10-03")
    assert len(jobs) == 40
    assert origin == parse_timestamp("2017-10-02")
    jobs, _ = select(trace, "2017-10-02..2017-10-03", first=5)
    assert len(jobs) == 5


def test_openb_pods_ask_for_a_fraction_of_a_gpu_below_1000_milli(fixtures: Path) -> None:
    trace = load_trace(f"alibaba-openb:{fixtures / 'openb_pods.csv'}")
    fractions = [j for j in trace.jobs if j.gpus < 1]
    assert fractions and all(0 < j.gpus < 1 for j in fractions)
    assert trace.skipped.get("no GPUs", 0) > 0  # CPU-only pods do not run as GPU jobs
    pod = next(j for j in trace.jobs if "|" in ",".join(j.gpu_models) or len(j.gpu_models) == 2)
    assert set(pod.gpu_models) == {"V100M32", "T4"}
    assert all(j.duration > 0 and j.cpus > 0 and j.memory_bytes > 0 for j in trace.jobs)


def test_helios_and_generic_csv_load_their_tenants(fixtures: Path) -> None:
    helios = load_trace(f"helios:{fixtures / 'helios_small.csv'}")
    assert {j.queue for j in helios.jobs} <= {"vcEwI", "vcWoR"} and helios.dated
    assert helios.skipped.get("no GPUs", 0) > 0
    generic = load_trace(f"csv:{fixtures / 'jobs.csv'}")
    assert {j.queue for j in generic.jobs} == {"nlp", "vision"} and not generic.dated
    assert any(j.gpu_models == ("H100",) for j in generic.jobs)


def test_tiresias_input_loads(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n0,2,0,5,vgg,100,3\n")
    (job,) = load_trace(f"tiresias:{path}").jobs
    assert (job.gpus, job.duration, job.submit) == (2.0, 100.0, 0.0)


@pytest.mark.parametrize(
    ("arg", "words"),
    [
        ("parquet:x.csv", ["--trace", "unknown trace format 'parquet'", "philly"]),
        ("philly", ["--trace", "FORMAT:PATH"]),
        ("philly:/no/such/file.csv", ["--trace", "no such file"]),
    ],
)
def test_bad_trace_arguments_name_the_flag_and_the_fix(arg: str, words: list[str]) -> None:
    with pytest.raises(SimError) as caught:
        load_trace(arg)
    for word in words:
        assert word in str(caught.value)


def test_a_file_of_another_format_names_the_missing_columns(fixtures: Path) -> None:
    with pytest.raises(SimError, match=r"missing column\(s\) timestamp, cluster"):
        load_trace(f"philly:{fixtures / 'jobs.csv'}")


def test_a_bad_number_names_the_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("submit_time,duration,num_gpus,queue\n0,ten,1,a\n")
    with pytest.raises(SimError, match="line 2: duration 'ten' is not a number"):
        load_trace(f"csv:{path}")


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("0,100,4\n", "line 2: no queue (the row has 3 fields, the header 4); complete or delete it"),
        ("0,inf,1,a\n", "line 2: duration is 'inf'; it must be a finite number"),
        ("0,1e400,1,a\n", "line 2: duration is '1e400'; it must be a finite number"),
        ("0,100,nan,a\n", "line 2: num_gpus is 'nan'; it must be a finite number"),
    ],
)
def test_a_short_row_or_an_endless_number_is_refused_by_its_line(
    tmp_path: Path, rows: str, message: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("submit_time,duration,num_gpus,queue\n5,10,1,a\n".replace("5,10,1,a\n", rows))
    with pytest.raises(SimError) as caught:
        load_trace(f"csv:{path}")
    assert str(caught.value) == f"--trace: {path} {message}"


def test_a_spreadsheets_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbftimestamp,duration,num_gpus,cluster\r\n2017-10-02 00:44:12,1800,1,a\r\n")
    (job,) = load_trace(f"philly:{path}").jobs
    assert (job.queue, job.duration) == ("a", 1800.0)


def test_a_trace_with_no_job_says_so_without_asking_for_a_window(tmp_path: Path) -> None:
    path = tmp_path / "idle.csv"
    path.write_text("submit_time,duration,num_gpus,queue\n0,100,0,a\n5,0,1,a\n")
    with pytest.raises(SimError) as caught:
        select(load_trace(f"csv:{path}"))
    assert (
        str(caught.value)
        == f"--trace: {path} has no jobs to replay (2 rows left out: 1 with no GPUs, 1 with no run time)"
    )


def test_windows_are_checked(fixtures: Path) -> None:
    dated = load_trace(f"philly:{fixtures / 'philly_small.csv'}")
    plain = load_trace(f"csv:{fixtures / 'jobs.csv'}")
    with pytest.raises(SimError, match=r"--window: .* ends before it starts"):
        select(dated, "2017-10-03..2017-10-02")
    with pytest.raises(SimError, match="give seconds"):
        select(plain, "2017-10-02..2017-10-03")
    with pytest.raises(SimError, match=r"no jobs .* \(its jobs are submitted from 0 to 3480\); move or"):
        select(plain, "999999..9999999")
    with pytest.raises(SimError, match=r"submitted from 2017-10-01 23:59 to 2017-10-03 00:00\); move or"):
        select(dated, "2019-01-01..2019-01-02")  # where its jobs are, to aim the window at
    assert len(select(plain, "0..600")[0]) == 5
