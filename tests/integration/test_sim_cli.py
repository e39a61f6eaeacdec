"""`gpupool sim` through the real CLI: what a person types and reads, and the files it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import ServerProcess
from tests.support.services import wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def gpupool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.main", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_sim_run_compares_policies_and_writes_json_and_a_report(tmp_path: Path) -> None:
    out = gpupool(
        "sim", "run", "--trace", f"philly:{FIXTURES / 'philly_small.csv'}", "--cluster", "2x8",
        "--window", "2017-10-02..2017-10-03", "--queues", "auto", "--policy", "fifo,las,gpupool",
        "--json", str(tmp_path / "out.json"), "--report", str(tmp_path / "report"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "40 jobs" in out.stdout and "fifo" in out.stdout and "gpupool" in out.stdout
    data = json.loads((tmp_path / "out.json").read_text())
    assert list(data["policies"]) == ["fifo", "las", "gpupool"]
    keys = {"avg_jct_s", "p50_jct_s", "p99_jct_s", "mean_slowdown", "avg_queue_s", "makespan_s", "gpu_util",
            "jain", "quota_violation", "preemptions", "wall_s"}  # fmt: skip
    for figures in data["policies"].values():
        assert keys <= set(figures)
        assert figures["finished"] + figures["dropped"] == 40
    assert data["policies"]["fifo"]["preemptions"] == 0
    assert data["policies"]["las"]["avg_jct_s"] <= data["policies"]["fifo"]["avg_jct_s"]
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| las |" in report and "![JCT distribution](jct_cdf.png)" in report
    fair_share = report.index("![Allocation against fair share: gpupool](fair_share_gpupool.png)")
    assert report.index("Shaded: GPUs a queue holds above its fair share", fair_share) > fair_share
    for png in ("jct_cdf.png", "queue_length.png", "gpu_util.png", "fair_share_gpupool.png"):
        assert (tmp_path / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sim_run_replays_an_operators_scheduling_yaml_next_to_the_default(tmp_path: Path) -> None:
    """`--policy gpupool,FILE`: the file's policy, named as given (a relative path, written into the report's
    folder under a name of its own); one that changes nothing replays as gpupool, figure for figure."""
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "spread.yaml").write_text("placement: spread\nlas_preempt: false\n")
    (tmp_path / "same.yaml").write_text("# every line commented out: the default policy\n")
    work = tmp_path / "work"
    work.mkdir()
    out = gpupool(
        "sim", "run", "--trace", f"philly:{FIXTURES / 'philly_small.csv'}", "--cluster", "2x8",
        "--window", "2017-10-02..2017-10-03", "--policy", "gpupool,../same.yaml,../tuned/spread.yaml",
        "--json", "out.json", "--report", "report", "--quiet", cwd=work,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads((work / "out.json").read_text())["policies"]
    assert list(data) == ["gpupool", "../same.yaml", "../tuned/spread.yaml"]
    unlike = {"wall_s", "decide_s", "description"}  # timings, and the words naming each policy
    figures = [{k: v for k, v in data[name].items() if k not in unlike} for name in data]
    assert figures[0] == figures[1] and figures[2]["finished"] == 40
    report = (work / "report" / "report.md").read_text()
    assert "- **../tuned/spread.yaml**: the scheduling.yaml ../tuned/spread.yaml: placement spread" in report
    assert (work / "report" / "fair_share_.._tuned_spread.yaml.png").read_bytes()[:4] == b"\x89PNG"
    bad = gpupool("sim", "run", "--trace", f"philly:{FIXTURES / 'philly_small.csv'}", "--policy", "nope.yaml")
    assert bad.returncode == 1 and "--policy: nope.yaml: no such file" in bad.stderr, bad.stderr


def test_sim_run_with_a_queue_file_and_the_generic_csv_format(tmp_path: Path) -> None:
    out = gpupool(
        "sim", "run", "--trace", f"csv:{FIXTURES / 'jobs.csv'}", "--cluster", "2x8:H100,2x8:A100",
        "--queues", str(FIXTURES / "queues.yaml"), "--policy", "gpupool,drf", "--first", "20",
        "--json", str(tmp_path / "out.json"), "--quiet",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["queues"]["nlp"]["quota_gpus"] == 12 and data["trace"]["jobs"] == 20
    assert data["policies"]["gpupool"]["finished"] == 20


def test_sim_run_counts_one_job_node_and_queue_in_the_singular(tmp_path: Path) -> None:
    trace = tmp_path / "one.csv"
    trace.write_text("submit_time,duration,num_gpus,queue\n0,600,2,nlp\n")
    out = gpupool("sim", "run", "--trace", f"csv:{trace}", "--cluster", "1x8", "--policy", "fifo", "--quiet",
                  "--report", str(tmp_path / "report"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"1 job from {trace} on 8 GPUs (1 node), 1 queue\n" in out.stdout
    report = (tmp_path / "report" / "report.md").read_text()
    assert "1 job\n" in report and "(1 node, 8 GPUs); 1 queue\n" in report


def test_sim_run_says_which_rows_it_left_out_and_which_jobs_it_dropped(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("submit_time,duration,num_gpus,queue\n0,600,2,a\n5,0,1,a\n7,300,0,a\n9,60,16,a\n")
    out = gpupool("sim", "run", "--trace", f"csv:{trace}", "--cluster", "1x8", "--policy", "fifo,gpupool",
                  "--quiet", "--report", str(tmp_path / "report"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "2 rows of jobs.csv left out: 1 with no run time, 1 with no GPUs\n" in out.stdout
    (said,) = [line for line in out.stdout.splitlines() if line.startswith("1 job of 2 dropped")]
    assert "more GPUs than the cluster's nodes hold" in said, out.stdout
    report = (tmp_path / "report" / "report.md").read_text()
    assert "- 2 rows of jobs.csv left out" in report and "- 1 job of 2 dropped" in report
    trace.write_text("submit_time,duration,num_gpus,queue\n0,600,16,a\n")
    out = gpupool("sim", "run", "--trace", f"csv:{trace}", "--cluster", "1x8", "--quiet")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert (
        "error: --cluster: 1 job selected and none fits '1x8'" in out.stderr and "avg JCT" not in out.stdout
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "parquet:x", "--cluster", "2x8"], "--trace: unknown trace format 'parquet'"),
        (["--trace", "philly:/nowhere.csv", "--cluster", "2x8"], "--trace: /nowhere.csv: no such file"),
        (["--trace", f"philly:{FIXTURES / 'philly_small.csv'}", "--cluster", "2by8"], "--cluster: '2by8'"),
        (["--trace", f"philly:{FIXTURES / 'philly_small.csv'}", "--cluster", "2x8", "--policy", "magic"],
         "--policy: unknown policy 'magic'"),
        (["--trace", f"philly:{FIXTURES / 'philly_small.csv'}", "--cluster", "2x8", "--cycle", "soon"],
         "--cycle: 'soon' is not a duration"),
        (["--trace", f"philly:{FIXTURES / 'philly_small.csv'}", "--cluster", "2x8", "--cycle", "0s"],
         "--cycle: '0s' is shorter than the shortest cycle, 1s"),
        (["--trace", f"philly:{FIXTURES / 'philly_small.csv'}", "--cluster", "2x8",
          "--restart-overhead", "-5s"],
         "--restart-overhead: '-5s' is not a duration: it must not be negative"),
    ],
)  # fmt: skip
def test_bad_flags_fail_with_one_line_naming_the_flag(args: list[str], message: str) -> None:
    out = gpupool("sim", "run", *args)
    assert out.returncode == 1
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_an_output_that_cannot_be_written_is_refused_before_the_replay(tmp_path: Path) -> None:
    """A long replay is not run only to fail at its last step: --json and --report are checked first."""
    folder = tmp_path / "taken"
    folder.mkdir()
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    base = ["sim", "run", "--trace", f"philly:{FIXTURES / 'philly_small.csv'}", "--cluster", "2x8", "--quiet"]
    cases = [
        (["--json", str(folder)], f"--json: {folder} is a folder; give a file name"),
        (["--report", str(a_file)], f"--report: {a_file} is a file"),
        (["--json", str(a_file / "out.json")], f"--json: {a_file} is a file, not a folder"),
        # sysfs refuses even root, whom the folder's permissions let through: the file itself is tried
        (["--json", "/sys/none.json"], "--json: cannot write"),
    ]
    for flags, message in cases:
        out = gpupool(*base, *flags)
        assert out.returncode == 1
        assert message in out.stderr and "Traceback" not in out.stderr
        assert "avg JCT" not in out.stdout  # nothing was replayed
    assert list(folder.iterdir()) == []
    out = gpupool(*base, "--json", str(tmp_path / "new" / "deeper" / "out.json"))
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "new" / "deeper" / "out.json").read_text())["trace"]["jobs"] > 0


def test_sim_whatif_refuses_a_malformed_change_before_asking_the_server() -> None:
    """The change is checked first: a typo is named as such, not as an unreachable server."""
    for flags, message in (
        (["--policy", "all", "--add", "1x8"], "--policy: whatif replays one policy; give one name"),
        (["--policy", "bogus", "--add", "1x8"], "--policy: unknown policy 'bogus'; one of fifo,"),
        (["--add", "4by8"], "--add: '4by8' is not NODESxGPUS[:MODEL]; expected NODESxGPUS[:MODEL][,...]"),
        (["--quota", "nlp=lots"], "--quota: 'lots' is not a number of GPUs"),
        (["--quota", "nlp=-2"], "--quota: 'nlp=-2': a quota is a number of GPUs, 0 or more"),
    ):
        out = gpupool("--server", "http://127.0.0.1:9", "sim", "whatif", *flags)
        assert out.returncode == 1
        assert message in out.stderr and "cannot reach" not in out.stderr, out.stderr


def test_sim_place_reports_the_allocation_at_full_demand(tmp_path: Path) -> None:
    out = gpupool(
        "sim", "place", "--trace", f"alibaba-openb:{FIXTURES / 'openb_pods.csv'}",
        "--nodes", f"alibaba-openb:{FIXTURES / 'openb_nodes.csv'}", "--policy", "binpack,spread",
        "--seed", "42", "--json", str(tmp_path / "place.json"), "--report", str(tmp_path / "plots"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "76 pods drawn (seed 42) from a list of 60 pods, onto 56 GPUs (11 nodes)" in out.stdout
    data = json.loads((tmp_path / "place.json").read_text())["policies"]
    for name in ("binpack", "spread"):
        assert 0 < data[name]["alloc_ratio_at_100"] <= 1
    assert data["binpack"]["alloc_ratio_at_100"] > data["spread"]["alloc_ratio_at_100"]
    assert (tmp_path / "plots" / "place.png").exists()
    gpupool(
        "sim", "place", "--trace", f"alibaba-openb:{FIXTURES / 'openb_pods.csv'}",
        "--nodes", f"alibaba-openb:{FIXTURES / 'openb_nodes.csv'}", "--policy", "binpack", "--seed", "42",
        "--json", str(tmp_path / "again.json"),
    )  # fmt: skip
    again = json.loads((tmp_path / "again.json").read_text())["policies"]["binpack"]
    assert {k: v for k, v in again.items() if k != "wall_s"} == {  # same seed, same placement
        k: v for k, v in data["binpack"].items() if k != "wall_s"
    }
    for stop in ("nan", "inf", "0.5"):  # pods are drawn until demand reaches it: refused, not run forever
        out = gpupool("sim", "place", "--trace", f"alibaba-openb:{FIXTURES / 'openb_pods.csv'}",
                      "--cluster", "1x2", "--stop", stop)  # fmt: skip
        assert out.returncode == 1 and f"--stop: {stop} must be from 1.0" in out.stderr


def test_sim_whatif_replays_the_live_history_on_a_bigger_cluster(
    server: ServerProcess, job_dir: Path
) -> None:
    for i in range(4):
        server.submit(
            {"name": f"w{i}", "resources": {"gpu": 8}, "commands": ["sleep 0.3"], "workdir": str(job_dir)}
        )
    for i in range(1, 5):
        server.wait_for(i)
    # one that ran and waits pending again (held; as after an eviction or a lost node): it is replayed
    again = server.submit({"name": "again", "resources": {"gpu": 2}, "commands": ["sleep 60"]})["id"]
    server.wait_for(again, states=("running",))
    server.cli("hold", str(again), check=True)
    wait_until(server, again, lambda w: w["state"] == "pending" and w["run_seconds"] > 0)
    server.cli("queue", "create", "idle", "--gpu-quota", "0", check=True)  # it ran nothing
    out = server.cli("sim", "whatif", "--add", "1x8:H100", "--json", str(job_dir / "w.json"))
    assert out.returncode == 0, out.stderr
    assert "replaying 5 jobs" in out.stdout and "GPUs 8 -> 16" in out.stdout
    assert "with the server's policy: the default policy's settings (as gpupool)" in out.stdout, out.stdout
    (idle,) = [line for line in out.stdout.splitlines() if " idle " in line]
    assert idle.split()[2:] == ["│", "0", *["│", "-"] * 6, "│"], idle  # no times for a queue that ran nothing
    assert "preemptions 0 -> 0" in out.stdout
    assert "measured on the live cluster: avg JCT " in out.stdout and "over 4 jobs that ended" in out.stdout
    data = json.loads((job_dir / "w.json").read_text())
    assert data["before"]["gpus"] == 8 and data["after"]["gpus"] == 16
    assert data["after"]["avg_queue_s"] <= data["before"]["avg_queue_s"]
    assert data["live"]["jobs"] == 4 and data["live"]["avg_jct_s"] > 0
    # A node out of service now still ran the history: it counts (the replay of the cluster as it is ran
    # no job at all, and every figure read 0).
    server.cli("node", "cordon", "node-1", check=True)
    try:
        cordoned = server.cli("sim", "whatif", "--add", "1x8:H100", "--json", str(job_dir / "c.json"))
    finally:
        server.cli("node", "uncordon", "node-1", check=True)
    assert cordoned.returncode == 0, cordoned.stderr
    assert "counted in service, as the history ran on them: node-1 (cordoned)" in cordoned.stdout
    assert json.loads((job_dir / "c.json").read_text())["before"] == data["before"]
    server.cli("cancel", str(again), check=True)
    # A change of policy alone, on this cluster's own history, as operations.md says to try one
    tuned = job_dir / "tuned.yaml"
    tuned.write_text(server.cli("scheduling", check=True).stdout)
    policy = server.cli("sim", "whatif", "--policy-after", str(tuned), "--json", str(job_dir / "p.json"))
    assert policy.returncode == 0, policy.stderr
    assert f"before, {tuned} after" in policy.stdout and f"what if: policy {tuned}" in policy.stdout
    compared = json.loads((job_dir / "p.json").read_text())
    assert (compared["policy"], compared["policy_after"]) == ("server", str(tuned))
    assert compared["after"]["gpus"] == compared["before"]["gpus"] == 8
    bad = server.cli("sim", "whatif", "--remove", "no-such-node")
    assert bad.returncode == 1 and "--remove: no node named 'no-such-node'" in bad.stderr
    # the only node removed: refused before "replaying 4 jobs" is said, not after
    empty = server.cli("sim", "whatif", "--remove", "node-1")
    assert empty.returncode == 1 and empty.stdout == "", empty.stdout
    assert empty.stderr.startswith("error: --remove: the changed cluster has no GPUs left"), empty.stderr
    # quotas beyond the pool's 8 GPUs are replayed with the warning `sim run --queues` gives
    over = server.cli("sim", "whatif", "--quota", "default=16", "--quota", "idle=8")
    assert over.returncode == 0, over.stderr
    assert "warning: --quota: the GPU quotas of top-level queues add up to 24, but the cluster has 8" in (
        over.stderr
    )
    typo = server.cli("sim", "whatif", "--add", "1x8:H10O")
    assert typo.returncode == 1 and "replaying" not in typo.stdout
    said = "--add: unknown GPU model 'H10O' in '1x8:H10O'; models in this pool: H100; known models:"
    assert said in typo.stderr, typo.stderr
