"""Input files a new user gets wrong: each is one error naming the option, the file, the line and the fix,
or, where the replay runs all the same, a note of what it does instead of what the file says."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.scheduler import QueueView, Share
from gpupool.sim.cluster import load_cluster
from gpupool.sim.errors import SimError
from gpupool.sim.place import load_pods
from gpupool.sim.policies import resolve_policies
from gpupool.sim.queues import load_queue_file, quota_warnings
from gpupool.sim.trace import adjusted_note, load_trace, select
from gpupool.sim.whatif import check_changes

UTF16 = b"\xff\xfe\x00garbage"  # what a spreadsheet's "Unicode text" export begins with
CSV_HEADER = "submit_time,duration,num_gpus,queue\n"

# Each reader of a file: (the option that carries it, how it is read).
READERS: dict[str, tuple[str, Callable[[Path], object]]] = {
    "csv trace": ("--trace", lambda p: load_trace(f"csv:{p}")),
    "philly trace": ("--trace", lambda p: load_trace(f"philly:{p}")),
    "helios trace": ("--trace", lambda p: load_trace(f"helios:{p}")),
    "tiresias cluster": ("--cluster", lambda p: load_cluster(f"tiresias:{p}")),
    "openb cluster": ("--cluster", lambda p: load_cluster(f"alibaba-openb:{p}")),
    "openb nodes": ("--nodes", lambda p: load_cluster(f"alibaba-openb:{p}", "--nodes")),
    "openb pod list (sim place)": ("--trace", lambda p: load_pods(f"alibaba-openb:{p}")),
    "queue file": ("--queues", load_queue_file),
    "scheduling.yaml": ("--policy", lambda p: resolve_policies(str(p))),
}


@pytest.mark.parametrize("reader", READERS)
def test_a_utf16_file_is_one_error_naming_the_option_the_line_and_how_to_convert_it(
    reader: str, tmp_path: Path
) -> None:
    flag, read = READERS[reader]
    path = tmp_path / "b.yaml"
    path.write_bytes(UTF16)
    with pytest.raises(SimError) as caught:
        read(path)
    assert str(caught.value) == (
        f"{flag}: {path} line 1: not UTF-8 text (byte 0xff at column 1: the file is UTF-16); save it as "
        f"UTF-8, e.g. iconv -f UTF-16 -t UTF-8 {path} > {tmp_path / 'b-utf8.yaml'}"
    )


@pytest.mark.parametrize("reader", READERS)
def test_a_latin1_byte_after_the_first_lines_names_its_own_line(reader: str, tmp_path: Path) -> None:
    flag, read = READERS[reader]
    path = tmp_path / "cafe.csv"
    path.write_bytes(b"# a comment, or a header\nsomething: 1\nname: caf\xe9\n")
    with pytest.raises(SimError) as caught:
        read(path)
    assert str(caught.value) == (
        f"{flag}: {path} line 3: not UTF-8 text (byte 0xe9 at column 10); save it as UTF-8"
    )


def test_a_bad_byte_far_into_a_large_trace_names_its_line(tmp_path: Path) -> None:
    """The text is decoded in blocks of thousands of bytes: the line is found, not guessed."""
    path = tmp_path / "big.csv"
    rows = "".join(f"{i},60,1,a\n" for i in range(5000))
    path.write_bytes((CSV_HEADER + rows).encode() + b"5000,60,1,\x80\n")
    with pytest.raises(
        SimError, match=rf"^--trace: {path} line 5002: not UTF-8 text \(byte 0x80 at column 11\)"
    ):
        load_trace(f"csv:{path}")


def test_a_field_over_csvs_limit_names_the_line_where_its_row_begins(tmp_path: Path) -> None:
    path = tmp_path / "open-quote.csv"
    path.write_text(CSV_HEADER + '0,60,1,a\n5,60,1,"b\n' + "x" * 140_000 + "\n")
    with pytest.raises(SimError) as caught:
        load_trace(f"csv:{path}")
    assert str(caught.value) == (
        f'--trace: {path} line 3: a field longer than 131,072 characters: a quote (") left open takes in '
        "every line after it; close it, or is this not a CSV file?"
    )


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("0,-100,1,a",
         "duration -100 is negative; give 0 or more seconds of run time (a row of 0 is left out)"),
        ("0,100,-4,a", "num_gpus -4 is negative; give 0 or more GPUs (a row of 0 is left out)"),
        ("0,100,1.5,a", "num_gpus 1.5 is a fraction above 1; give whole GPUs (a fraction is meaningful only "
                        "below 1: a share of one GPU)"),
    ],
)  # fmt: skip
def test_a_negative_or_fractional_figure_in_ones_own_csv_is_an_error_naming_line_and_column(
    row: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(CSV_HEADER + "0,60,1,a\n" + row + "\n")
    with pytest.raises(SimError) as caught:
        load_trace(f"csv:{path}")
    assert str(caught.value) == f"--trace: {path} line 3: {message}"


def test_a_share_of_one_gpu_and_rows_of_nothing_stay_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(CSV_HEADER + "0,60,0.5,a\n1,0,1,a\n2,60,0,a\n3,60,2,a\n")
    trace = load_trace(f"csv:{path}")
    assert [j.gpus for j in trace.jobs] == [0.5, 2.0]
    assert trace.skipped == {"no run time": 1, "no GPUs": 1}


def test_a_public_traces_negative_rows_are_left_out_and_counted_apart(tmp_path: Path) -> None:
    path = tmp_path / "philly.csv"
    path.write_text(
        "timestamp,duration,num_gpus,cluster\n"
        "2017-10-02 00:00:00,-5,1,a\n2017-10-02 00:00:01,0,1,a\n2017-10-02 00:00:02,60,8,a\n"
    )
    trace = load_trace(f"philly:{path}")
    assert len(trace.jobs) == 1
    assert trace.skipped == {"a negative duration": 1, "no run time": 1}


def test_a_helios_job_whose_gpus_do_not_divide_over_its_nodes_is_noted_with_what_the_replay_runs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "helios.csv"
    path.write_text(
        "job_id,user,vc,gpu_num,cpu_num,node_num,submit_time,duration\n"
        "j0,u,vc,3,8,2,0,100\nj1,u,vc,16,8,2,10,100\nj2,u,vc,5,8,4,20,100\n"
    )
    trace = load_trace(f"helios:{path}")
    assert trace.adjusted == {
        "gpu_num not a multiple of node_num; each runs as node_num pods of gpu_num / node_num GPUs rounded "
        "up, more GPUs than the row asks for (gpu_num 3 on node_num 2: 2 pods x 2 GPUs)": 2
    }
    assert adjusted_note(trace) == (
        "2 rows of helios.csv: gpu_num not a multiple of node_num; each runs as node_num pods of gpu_num / "
        "node_num GPUs rounded up, more GPUs than the row asks for (gpu_num 3 on node_num 2: 2 pods x 2 GPUs)"
    )
    path.write_text("job_id,user,vc,gpu_num,node_num,submit_time,duration\nj0,u,vc,16,2,0,100\n")
    assert adjusted_note(load_trace(f"helios:{path}")) is None


def test_a_second_quota_for_one_queue_is_refused_naming_both() -> None:
    with pytest.raises(SimError) as caught:
        check_changes(quotas=["nlp=8", "cv=2", "nlp=4"])
    assert (
        str(caught.value)
        == "--quota: queue 'nlp' is given twice ('nlp=8' and 'nlp=4'); give one --quota nlp=GPUS"
    )
    check_changes(quotas=["nlp=8", "cv=8"])


def test_quotas_beyond_what_the_cluster_or_a_parent_holds_are_warned_of() -> None:
    queues = [
        QueueView("research", gpu=Share(quota=8)),
        QueueView("nlp", parent="research", gpu=Share(quota=6)),
        QueueView("cv", parent="research", gpu=Share(quota=6)),
        QueueView("prod", gpu=Share(quota=12)),
    ]
    assert quota_warnings(queues, 16) == [
        "the GPU quotas of top-level queues add up to 20, but the cluster has 16: more than the cluster can "
        "guarantee; when all of them want their quota, each gets less (fair shares scale the quotas down)",
        "the GPU quotas of the queues under research add up to 12, but queue research's quota is 8: more "
        "than the cluster can guarantee; when all of them want their quota, each gets less (fair shares "
        "scale the quotas down)",
    ]
    assert quota_warnings(queues[:1] + queues[3:], 20) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("2x8:", "'2x8:' names no GPU model after ':'; e.g. 2x8:H100, or 2x8"),
        ("2x8:H100:x",
         "'2x8:H100:x': GPU model 'H100:x' is not a model name (a letter, then letters, digits, '_', '.' or "
         "'-'; one model a group); e.g. 2x8:H100"),
        ("2x8:3090",
         "'2x8:3090': GPU model '3090' is not a model name (a letter, then letters, digits, '_', '.' or '-'; "
         "one model a group); e.g. 2x8:H100"),
        ("4x8,2x8:", "'2x8:' names no GPU model after ':'; e.g. 2x8:H100, or 2x8"),
        ("slurm:cluster.conf",
         "unknown cluster kind 'slurm'; expected NODESxGPUS[:MODEL][,...] (e.g. 64x8 or "
         "32x8:H100,32x8:A100), tiresias:FILE or alibaba-openb:FILE"),
    ],
)  # fmt: skip
def test_a_cluster_spec_with_a_bad_model_says_what_is_wrong_with_the_model(spec: str, message: str) -> None:
    with pytest.raises(SimError) as caught:
        load_cluster(spec)
    assert str(caught.value) == f"--cluster: {message}"


@pytest.mark.parametrize("spec", ["tiresias:n32g4.csv", "4x8"])
def test_nodes_takes_only_an_openb_node_list_and_says_to_use_cluster(spec: str) -> None:
    with pytest.raises(SimError) as caught:
        load_cluster(spec, "--nodes")
    assert str(caught.value) == (
        f"--nodes: '{spec}': --nodes takes an alibaba-openb node list (alibaba-openb:NODES.csv); give "
        f"--cluster {spec} instead"
    )


def test_all_stands_alone_among_policies() -> None:
    with pytest.raises(SimError) as caught:
        resolve_policies("all,fifo")
    assert str(caught.value) == (
        "--policy: 'all' stands alone in 'all,fifo' (it is every policy): give --policy all, or name the "
        "policies without it, e.g. --policy fifo,gpupool"
    )
    assert len(resolve_policies("all")) > 3


def test_a_window_in_seconds_on_a_dated_trace_says_the_trace_is_dated(fixtures: Path) -> None:
    path = fixtures / "philly_small.csv"
    with pytest.raises(SimError) as caught:
        select(load_trace(f"philly:{path}"), "0..86400")
    assert str(caught.value) == (
        f"--window: no jobs selected from {path}: this trace is dated, and '0..86400' reads as seconds since "
        "1970-01-01 UTC (its jobs are submitted from 2017-10-01 23:59 to 2017-10-03 00:00); give dates, "
        "e.g. --window 2017-10-01..2017-10-08"
    )
    with pytest.raises(SimError, match=r"^--window: no jobs selected .*; move or widen it$"):
        select(load_trace(f"philly:{path}"), "2018-01-01..2018-01-02")  # dates, only elsewhere
