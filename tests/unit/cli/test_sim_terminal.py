"""`gpupool sim` as a new user meets it: a file it cannot read is one error line and nothing written; a
setting the replay cannot honour is a warning; the results table shows every figure whole in an
80-column terminal, or a narrower one."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
ENV = {"GPUPOOL_SERVER": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def gpupool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.main", *args], env=ENV, capture_output=True, text=True, timeout=120,
        cwd=cwd,
    )  # fmt: skip


def in_terminal(columns: int, *args: str) -> str:
    """What `gpupool ARGS` shows in a terminal `columns` wide (as `script` with `stty cols` shows it)."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "gpupool.main", *args], stdin=subprocess.DEVNULL, stdout=child, stderr=child,
        env={**ENV, "TERM": "xterm"},  # not "dumb": Rich takes a dumb terminal for 80 columns
    )  # fmt: skip
    os.close(child)
    shown = b""
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if not select.select([main], [], [], 1.0)[0]:
                if process.poll() is not None:
                    break
                continue
            try:
                data = os.read(main, 65536)
            except OSError:  # the terminal's other end closed: the command ended
                break
            if not data:
                break
            shown += data
    finally:
        os.close(main)
        process.wait(timeout=30)
    assert process.returncode == 0, shown.decode(errors="replace")
    return ANSI.sub("", shown.decode()).replace("\r\n", "\n")


def run_figures(policies: str, json_out: Path) -> list[str]:
    """The figures `sim run` prints for each policy, formatted as the table formats them, from its JSON."""
    figures = []
    for m in json.loads(json_out.read_text())["policies"].values():
        figures += [f"{m[k] / 3600:.2f}" for k in ("avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s")]
        figures += [f"{m['mean_slowdown']:.2f}", f"{m['gpu_util']:.1%}", f"{m['jain']:.3f}",
                    f"{m['quota_violation']:.2%}", str(m["preemptions"])]  # fmt: skip
    return figures


@pytest.mark.parametrize("columns", [80, 40])
def test_sim_run_shows_every_figure_whole_in_a_narrow_terminal(columns: int, tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    shown = in_terminal(
        columns, "sim", "run", "--trace", f"philly:{FIXTURES / 'philly_small.csv'}", "--cluster", "4x8",
        "--policy", "las,gpupool", "--jobs", "1", "-q", "--json", str(out),
    )  # fmt: skip
    assert "…" not in shown, shown
    lines = shown.splitlines()
    table = [line for line in lines if line.startswith((" las", "las", " gpupool", "gpupool", " p99", "p99"))]
    assert table, shown
    words = {word for line in lines for word in line.split()}
    missing = [figure for figure in run_figures("las,gpupool", out) if figure not in words]
    assert not missing, shown
    assert "vs fifo" not in shown and "vs" not in words  # no fifo ran: nothing to compare with


def test_sim_run_compares_with_fifo_when_fifo_ran(tmp_path: Path) -> None:
    out = gpupool("sim", "run", "--trace", f"philly:{FIXTURES / 'philly_small.csv'}", "--cluster", "4x8",
                  "--policy", "fifo,las", "--jobs", "1", "-q")  # fmt: skip
    assert out.returncode == 0, out.stderr
    (header,) = [line for line in out.stdout.splitlines() if "avg JCT" in line]
    assert "vs fifo" in header
    (fifo,) = [line.split() for line in out.stdout.splitlines() if line.split()[:1] == ["fifo"]]
    assert fifo[2] == "1.00"


def test_sim_place_shows_every_figure_whole_in_a_narrow_terminal(tmp_path: Path) -> None:
    out = tmp_path / "place.json"
    shown = in_terminal(
        40, "sim", "place", "--trace", f"alibaba-openb:{FIXTURES / 'openb_pods.csv'}",
        "--nodes", f"alibaba-openb:{FIXTURES / 'openb_nodes.csv'}", "--json", str(out),
    )  # fmt: skip
    shown = shown[shown.index("GPU allocation when") :]  # the table (the progress bar above may shorten)
    assert "…" not in shown
    words = {word for line in shown.splitlines() for word in line.split()}
    for name, r in json.loads(out.read_text())["policies"].items():
        figures = [f"{r['alloc_ratio_at_100']:.2%}", f"{r['alloc_ratio_at_end']:.2%}",
                   f"{r['pods_placed']:,}/{r['pods_drawn']:,}"]  # fmt: skip
        assert name in words and set(figures) <= words, shown


@pytest.mark.parametrize(
    "args",
    [
        ["sim", "run", "--cluster", "2x8", "--trace", "csv:b.csv"],
        ["sim", "run", "--cluster", "tiresias:b.csv", "--trace", "csv:b.csv"],
        ["sim", "place", "--trace", "alibaba-openb:b.csv",
         "--nodes", f"alibaba-openb:{FIXTURES / 'openb_nodes.csv'}"],
    ],
)  # fmt: skip
def test_a_file_that_is_not_utf8_is_one_error_line_and_nothing_is_written(
    args: list[str], tmp_path: Path
) -> None:
    (tmp_path / "b.csv").write_bytes(b"\xff\xfe\x00garbage")
    out = gpupool(*args, "--json", "out.json", cwd=tmp_path)
    flag = "--cluster" if "tiresias:b.csv" in args else "--trace"
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"error: {flag}: b.csv line 1: not UTF-8 text (byte 0xff at column 1: the file is UTF-16); save it "
        "as UTF-8, e.g. iconv -f UTF-16 -t UTF-8 b.csv > b-utf8.csv"
    ]
    assert not (tmp_path / "out.json").exists() and out.stdout == ""


def test_queue_quotas_beyond_the_cluster_are_replayed_with_a_warning(tmp_path: Path) -> None:
    out = gpupool("sim", "run", "--trace", f"csv:{FIXTURES / 'jobs.csv'}", "--cluster", "1x8:A100",
                  "--queues", str(FIXTURES / "queues.yaml"), "--policy", "gpupool", "--first", "5",
                  "-q")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "warning: --queues: the GPU quotas of top-level queues add up to 16, but the cluster has 8: more "
        "than the cluster can guarantee; when all of them want their quota, each gets less (fair shares "
        "scale the quotas down)"
    ]


def test_whatif_refuses_a_queue_given_two_quotas_before_asking_the_server() -> None:
    out = gpupool("sim", "whatif", "--quota", "nlp=8", "--quota", "nlp=4")
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "error: --quota: queue 'nlp' is given twice ('nlp=8' and 'nlp=4'); give one --quota nlp=GPUS"
    ]
