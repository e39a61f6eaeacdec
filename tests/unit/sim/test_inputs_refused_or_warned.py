"""Inputs a replay once took and then ran as something else: each is now refused in one line naming the
option, the file, the line and the fix, or warned of, or read as the product reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.scheduler import GpuDemand
from gpupool.scheduler.placement import gpu_matches
from gpupool.sim import place as pl
from gpupool.sim.cluster import load_cluster
from gpupool.sim.engine import Simulation
from gpupool.sim.errors import SimError
from gpupool.sim.policies import resolve_policies
from gpupool.sim.queues import auto_queues, load_queue_file, quota_warnings
from gpupool.sim.trace import adjusted_note, load_trace, parse_window, select

CSV_HEADER = "submit_time,duration,num_gpus,queue"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,creation_time,deletion_time,scheduled_time"
)
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
TIRESIAS_HEADER = "num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node"


def write(tmp_path: Path, name: str, *lines: str) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def refused(read: object) -> str:
    assert callable(read)
    with pytest.raises(SimError) as caught:
        read()
    return str(caught.value)


# -- GPU models: one spelling, whatever the case ---------------------------------------------------------


@pytest.mark.parametrize(
    ("cluster_model", "trace_model"), [("a100", "A100"), ("A100", "a100"), ("v100m16", "V100M16")]
)
def test_a_jobs_gpu_model_matches_the_clusters_whatever_the_case_of_either(
    cluster_model: str, trace_model: str, tmp_path: Path
) -> None:
    trace = write(tmp_path, "model.csv", f"{CSV_HEADER},gpu_model", f"0,100,1,a,{trace_model}")
    jobs, origin = select(load_trace(f"csv:{trace}"))
    cluster = load_cluster(f"1x8:{cluster_model}")
    (fifo,) = resolve_policies("fifo")
    result = Simulation(jobs, origin, cluster, auto_queues(jobs, cluster.gpus), fifo).run()
    assert [j.finish for j in result.jobs] == [100.0]  # it ran, not waited for ever
    assert cluster.nodes[0].gpus[0].model == jobs[0].gpu_models[0] == trace_model.upper()


def test_models_in_an_openb_node_list_and_pod_list_are_spelled_as_the_product_spells_them(
    tmp_path: Path,
) -> None:
    nodes = write(tmp_path, "nodes.csv", NODE_HEADER, "n0,8000,16384,2,t4", "n1,8000,16384,0,")
    cluster = load_cluster(f"alibaba-openb:{nodes}")
    assert [g.model for n in cluster.nodes for g in n.gpus] == ["T4", "T4"]
    pods = write(tmp_path, "pods.csv", POD_HEADER, "p0,1000,100,1,1000,v100m32|t4,LS,0,100,")
    (job,) = load_trace(f"alibaba-openb:{pods}").jobs
    (pod,) = pl.load_pods(f"alibaba-openb:{pods}")
    assert job.gpu_models == pod.demand.models == ("T4", "V100M32")
    assert gpu_matches(cluster.nodes[0].gpus[0].model, 0, GpuDemand(1, pod.demand.models))


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ((f"{CSV_HEADER},gpu_model", "0,100,1,a,A100|3090"),
         "line 2: gpu_model 'A100|3090' is not a GPU model name (a letter, then letters, digits, '-', '_' or "
         "'.'; several joined by '|', e.g. A100|H100)"),
    ],
)  # fmt: skip
def test_a_trace_model_that_is_no_model_name_is_refused_by_its_line(
    lines: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    path = write(tmp_path, "m.csv", *lines)
    assert refused(lambda: load_trace(f"csv:{path}")) == f"--trace: {path} {message}"


def test_an_openb_node_of_several_models_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes.csv", NODE_HEADER, "n0,8000,16384,2,T4|A10")
    assert refused(lambda: load_cluster(f"alibaba-openb:{path}")) == (
        f"--cluster: {path} line 2: model 'T4|A10' names several; give a node one"
    )


# -- GPU counts: whole, or a share of one GPU, in every format --------------------------------------------


def test_an_openb_pod_of_a_fraction_above_1_gpu_is_refused_in_run_and_in_place(tmp_path: Path) -> None:
    path = write(tmp_path, "pods.csv", POD_HEADER, "p1,1000,100,1.5,1000,,LS,0,100,")
    message = (
        f"--trace: {path} line 2: num_gpu 1.5 is a fraction above 1; give whole GPUs (a fraction is "
        "meaningful only below 1: a share of one GPU)"
    )
    assert refused(lambda: load_trace(f"alibaba-openb:{path}")) == message
    assert refused(lambda: pl.load_pods(f"alibaba-openb:{path}")) == message


def test_openb_pods_with_a_negative_figure_are_left_out_as_negative_and_refused_by_place(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        "pods.csv",
        POD_HEADER,
        "p0,1000,100,1,1000,,LS,0,100,",
        "p1,1000,100,-2,1000,,LS,0,100,",
        "p2,1000,100,1,-500,,LS,0,100,",
        "p3,1000,100,1,1000,,LS,100,50,",
        "p4,-1000,100,1,1000,,LS,0,100,",
        "p5,1000,100,0,0,,LS,0,100,",
    )
    trace = load_trace(f"alibaba-openb:{path}")
    assert len(trace.jobs) == 1
    assert trace.skipped == {
        "a negative num_gpu": 1,
        "a negative gpu_milli": 1,
        "a negative run time": 1,
        "a negative cpu_milli": 1,
        "no GPUs": 1,
    }
    assert refused(lambda: pl.load_pods(f"alibaba-openb:{path}")) == (
        f"--trace: {path} line 3: num_gpu -2 is negative; a pod asks for 0 or more: correct the row or "
        "delete it"
    )


@pytest.mark.parametrize(
    ("reader", "lines", "message"),
    [
        ("openb nodes", (NODE_HEADER, "n1,32000,1000,2.5,V100"),
         "--cluster: {path} line 2: gpu 2.5 is not a whole number; give whole GPUs"),
        ("helios", ("submit_time,duration,gpu_num,vc,node_num", "100,3600,4,vcA,2.5"),
         "--trace: {path} line 2: node_num 2.5 is not a whole number; give whole nodes"),
        ("tiresias cluster", (TIRESIAS_HEADER, "1.5,32,4,40,256"),
         "--cluster: {path} line 2: num_switch 1.5 is not a whole number; give whole switches, nodes and "
         "GPUs"),
        ("tiresias cluster", (TIRESIAS_HEADER, "1,32,4.7,40,256"),
         "--cluster: {path} line 2: num_gpu_p_node 4.7 is not a whole number; give whole switches, nodes and "
         "GPUs"),
        ("tiresias cluster", (TIRESIAS_HEADER, "-1,32,4,40,256"),
         "--cluster: {path} line 2: num_switch -1 is below 1; give 1 or more (e.g. 1,32,4)"),
        ("tiresias cluster", (TIRESIAS_HEADER, "1,2,4,40,256", "1,2,8,40,256"),
         "--cluster: {path} line 3: a second cluster row; a Tiresias cluster file has one (num_switch x "
         "num_node_p_switch nodes of num_gpu_p_node GPUs): delete the others"),
        ("csv", (CSV_HEADER, "0,100,1,a,extra"),
         "--trace: {path} line 2: 5 fields, the header 4 (extra: 'extra'); delete the extra fields, or quote "
         'a field that holds a comma ("a,b")'),
    ],
)  # fmt: skip
def test_a_count_that_is_not_whole_or_a_row_too_many_is_refused_not_cut(
    reader: str, lines: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    path = write(tmp_path, "in.csv", *lines)
    read = {
        "openb nodes": lambda: load_cluster(f"alibaba-openb:{path}"),
        "helios": lambda: load_trace(f"helios:{path}"),
        "tiresias cluster": lambda: load_cluster(f"tiresias:{path}"),
        "csv": lambda: load_trace(f"csv:{path}"),
    }[reader]
    assert refused(read) == message.format(path=path)


def test_a_helios_row_with_a_negative_node_num_is_left_out_as_negative(tmp_path: Path) -> None:
    path = write(tmp_path, "h.csv", "submit_time,duration,gpu_num,vc,node_num", "0,60,4,a,-1", "5,60,4,a,1")
    trace = load_trace(f"helios:{path}")
    assert len(trace.jobs) == 1 and trace.skipped == {"a negative node_num": 1}


# -- CSV text -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "line"),
    [
        ('0,100,1,"a\n5,100,1,b\n', 2),  # left open to the end of the file
        ('0,100,1,a\n\n\n5,100,"1\n",b\n7,100,1,c\n', 5),  # closed a line later, after blank lines
    ],
)
def test_a_quote_left_open_is_refused_naming_the_line_it_opened_on(
    body: str, line: int, tmp_path: Path
) -> None:
    path = tmp_path / "quote.csv"
    path.write_text(f"{CSV_HEADER}\n{body}")
    column = "queue" if line == 2 else "num_gpus"
    assert refused(lambda: load_trace(f"csv:{path}")) == (
        f'--trace: {path} line {line}: {column} opens a quote (") that this line does not close, so the '
        "lines after it are read into the field; close the quote on that line, or remove it"
    )


def test_blank_lines_and_quoted_fields_on_one_line_stay_readable(tmp_path: Path) -> None:
    path = tmp_path / "ok.csv"
    path.write_text(f'{CSV_HEADER}\n0,100,1,"a,b"\n\n5,100,1,c\n')
    assert [j.queue for j in load_trace(f"csv:{path}").jobs] == ["a,b", "c"]


def test_a_date_in_a_csv_trace_says_where_dates_go(tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", CSV_HEADER, "2017-10-02 00:00:00,100,1,a")
    assert refused(lambda: load_trace(f"csv:{path}")) == (
        f"--trace: {path} line 2: submit_time '2017-10-02 00:00:00' is not a number: a csv trace's times are "
        "seconds; for date-times use the helios format (--trace helios:FILE, columns submit_time, duration, "
        "gpu_num, vc), or convert them to seconds"
    )


# -- --window ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", ["-inf..inf", "nan..100", "0..nan", "-1e300..100", "0..1e13", "0..1e400"])
def test_a_window_bound_that_is_not_a_finite_sane_time_is_refused(window: str) -> None:
    with pytest.raises(
        SimError, match=r"^--window: '.*' in '.*' is not a time: give seconds between -1e12 and 1e12"
    ):
        parse_window(window, dated=True)


def test_a_window_ending_where_it_starts_is_called_empty() -> None:
    assert refused(lambda: parse_window("2017-10-02..2017-10-02", dated=True)) == (
        "--window: '2017-10-02..2017-10-02' is empty: END must be after START"
    )
    assert parse_window("-1e12..1e12", dated=False) == (-1e12, 1e12)


def test_rows_left_out_and_adjusted_are_counted_in_the_selection_only(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "h.csv",
        "submit_time,duration,gpu_num,vc,node_num",
        "0,60,0,a,1",  # left out, before the window
        "10,60,3,a,2",  # adjusted, in it
        "20,0,1,a,1",  # left out, in it
        "30,60,3,a,2",  # adjusted, in it, past --first 1
        "40,60,0,a,1",  # left out, after the window
        "50,60,3,a,2",  # adjusted, after it
    )
    trace = load_trace(f"helios:{path}")
    assert sum(trace.skipped.values()) == 3 and sum(trace.adjusted.values()) == 3  # the whole file
    jobs, _ = select(trace, "5..35")
    assert len(jobs) == 2 and trace.skipped == {"no run time": 1}
    note = adjusted_note(trace)
    assert note is not None and note.startswith("2 rows of h.csv: gpu_num not a multiple of node_num")
    jobs, _ = select(trace, "5..35", first=1)
    assert [j.submit for j in jobs] == [10] and trace.skipped == {} and sum(trace.adjusted.values()) == 1
    select(trace)
    assert sum(trace.skipped.values()) == 3 and sum(trace.adjusted.values()) == 3


# -- --queues FILE ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- {name: a, parent: b}\n- {name: b, parent: a}\n- {name: c}\n",
         "queue 'a': parent: 'b' is under 'a' (b under a), so the queues would form a loop; choose a parent "
         "outside 'a' and the queues under it"),
        ("- {name: a, parent: c}\n- {name: b, parent: a}\n- {name: c, parent: b}\n",
         "queue 'a': parent: 'c' is under 'a' (c under b under a), so the queues would form a loop; choose a "
         "parent outside 'a' and the queues under it"),
        ("- {name: a}\n- {name: b, parent: zz}\n",
         "queue 'b': parent queue 'zz' does not exist; define it in the file, or leave parent out"),
    ],
)  # fmt: skip
def test_a_queue_file_with_a_parent_loop_or_a_missing_parent_is_refused_as_the_server_refuses_it(
    text: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(text)
    assert refused(lambda: load_queue_file(path)) == f"--queues: {path}, {message}"


def test_a_yaml_error_in_a_queue_file_is_one_line_with_the_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "qbad.yaml"
    path.write_text("- {name: a\n")
    assert refused(lambda: load_queue_file(path)) == (
        f"--queues: {path} line 2, column 1: not valid YAML: expected ',' or '}}', but got '<stream end>' "
        "(a flow mapping begun at line 1, column 3); correct it there"
    )


def test_queue_fields_the_simulator_does_not_model_are_warned_of_once_per_file(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(
        "- {name: a, max_priority: 50, user_limits: {gpus: 1}, resources: {gpu: {quota: 4}}}\n"
        "- {name: b, user_limits: {workloads: 2}, budget: {gpu_hours: 10}}\n- {name: c}\n"
    )
    queues = load_queue_file(path)
    assert quota_warnings(queues, 8) == [
        f"{path} sets what the simulator does not model, so the replays run as though it were not set: "
        "max_priority (queue a), user_limits (queues a, b), budget (queue b)"
    ]
    path.write_text("- {name: a, resources: {gpu: {quota: 4}}}\n")
    assert quota_warnings(load_queue_file(path), 8) == []
