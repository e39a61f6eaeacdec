"""What `gpupool sim` prints of what it was given, and what it refuses: a path is printed as written (no
Rich markup taken from it), an option is named in its own words, a result that covers fewer jobs says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
ENV = {"GPUPOOL_SERVER": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
PODS = f"alibaba-openb:{FIXTURES / 'openb_pods.csv'}"


def gpupool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.main", *args], env=ENV, capture_output=True, text=True, timeout=120,
        cwd=cwd,
    )  # fmt: skip


def test_paths_with_brackets_are_printed_as_written(tmp_path: Path) -> None:
    """A folder named `odd[/b]` crashed `sim run` (a closing tag matching nothing), after the replay when it
    held only the outputs; `we ird[x].csv` printed as `we ird.csv`."""
    folder = tmp_path / "odd[/b]"
    (folder / "p[").mkdir(parents=True)
    (folder / "t.csv").write_text("submit_time,duration,num_gpus,queue\n0,600,2,a\n")
    (folder / "p[/i].yaml").write_text("# the default policy\n")  # its name heads a progress bar
    out = gpupool(
        "sim", "run", "--trace", "csv:t.csv", "--cluster", "4x8", "--policy", "fifo,p[/i].yaml",
        "--json", "o.json", "--report", "rep", cwd=folder,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "p[/i].yaml" in out.stderr  # the progress bars
    assert out.stdout.startswith("1 job from t.csv on 32 GPUs (4 nodes), 1 queue\n"), out.stdout
    assert "figures written to o.json\n" in out.stdout and "report written to rep/report.md\n" in out.stdout
    assert "| p[/i].yaml |" in (folder / "rep" / "report.md").read_text()
    (tmp_path / "we ird[x].csv").write_text("submit_time,duration,num_gpus,queue\n0,600,2,a\n")
    out = gpupool("sim", "run", "--trace", "csv:we ird[x].csv", "--cluster", "4x8", "-q", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("1 job from we ird[x].csv on "), out.stdout
    out = gpupool("sim", "place", "--trace", PODS, "--cluster", "4x8", "--policy", "binpack", "-q",
                  "--json", str(folder / "place.json"), "--report", str(folder / "plot"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (
        f"figures written to {folder / 'place.json'}\nplot written to {folder / 'plot' / 'place.png'}\n"
        in (out.stdout)
    )


def test_an_output_path_through_a_file_names_that_file(tmp_path: Path) -> None:
    """`--json afile/x.json` said "cannot create afile: File exists"."""
    (tmp_path / "afile").write_text("")
    base = ["sim", "run", "--trace", f"csv:{FIXTURES / 'jobs.csv'}", "--cluster", "2x8", "-q"]
    out = gpupool(*base, "--json", "afile/x.json", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "error: --json: afile is a file, not a folder; give --json a path in a folder"
    ]
    out = gpupool(*base, "--report", "afile/deeper/report", cwd=tmp_path)
    assert out.stderr.splitlines() == [
        "error: --report: afile is a file, not a folder; give --report a path in a folder"
    ]


def test_sim_run_warns_of_jobs_a_policy_never_finished(tmp_path: Path) -> None:
    """A job larger than its queue's limit never starts under gpupool: the table's averages cover fewer jobs
    than fifo's, which the output said nowhere."""
    queues = tmp_path / "queues.yaml"
    queues.write_text("- {name: a, resources: {gpu: {quota: 1, limit: 1}}}\n- {name: b}\n")
    trace = tmp_path / "jobs.csv"
    trace.write_text("submit_time,duration,num_gpus,queue\n0,600,1,a\n10,600,2,a\n20,600,1,b\n")
    out = gpupool("sim", "run", "--trace", f"csv:{trace}", "--cluster", "1x8", "--queues", str(queues),
                  "--policy", "fifo,gpupool", "-q")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "warning: gpupool: 1 job of 3 never finished (in queue a), asking for more GPUs than a limit of the "
        "queue (--queues), so never started; its averages, percentiles and slowdowns cover the 2 that "
        "finished (policies.gpupool.unfinished in --json)"
    ]


def test_sim_place_refuses_an_empty_policy_list_and_is_quiet_when_asked(tmp_path: Path) -> None:
    out = gpupool("sim", "place", "--trace", PODS, "--cluster", "4x8", "--policy", ",")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "error: --policy: no placement given; one or more of binpack, spread, fragmentation"
    ]
    loud = gpupool("sim", "place", "--trace", PODS, "--cluster", "4x8", "--policy", "binpack,spread")
    assert loud.returncode == 0 and "binpack" in loud.stderr and "pods" in loud.stderr  # one bar a placement
    out = gpupool("sim", "place", "--trace", PODS, "--cluster", "4x8", "--policy", "binpack,spread", "-q")
    assert out.returncode == 0 and out.stderr == "" and out.stdout == loud.stdout


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--add", "1x8", "--since", "7"], "--since: '7' has no unit; give one, e.g. 7d (days) or 7h"),
        (["--policy", "server", "--policy-after", "server"],
         "--policy-after: 'server' is the --policy too: nothing to compare; give another policy, or a change "
         "of cluster (--add 4x8:H100, --remove NODE, --quota QUEUE=GPUS)"),
        (["--add", "1x8", "--policy-after", "bad.yaml"],
         "--policy-after: bad.yaml: placement: 'sprad' is not one of 'binpack', 'spread', 'fragmentation' "
         "(did you mean 'spread'?); e.g. binpack"),
        (["--add", "1x8", "--policy-after", "all"],
         "--policy-after: whatif replays one policy; give one name, e.g. --policy-after gpupool"),
        (["--add", "1x8", "--policy-after", "lottery"],
         "--policy-after: unknown policy 'lottery'; one of fifo,"),
    ],
)  # fmt: skip
def test_whatif_names_the_option_at_fault_before_asking_the_server(
    flags: list[str], said: str, tmp_path: Path
) -> None:
    (tmp_path / "bad.yaml").write_text("placement: sprad\n")
    out = gpupool("sim", "whatif", *flags, cwd=tmp_path)
    assert out.returncode == 1
    assert len(out.stderr.splitlines()) == 1 and out.stderr.startswith(f"error: {said}"), out.stderr
