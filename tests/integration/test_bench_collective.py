"""`gpupool bench collective` for real: gloo processes on this machine, nccl-tests' table, checked results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpupool.cli.app import app

pytest.importorskip("torch")

FACTOR = {  # busbw / algbw, nccl-tests' doc/PERFORMANCE.md; in the order of --op all
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "alltoall": lambda n: (n - 1) / n,
    "sendrecv": lambda n: 1.0,
}
TITLES = [
    "#",
    "size",
    "count",
    "type",
    "redop",
    "root",
    "time",
    "algbw",
    "busbw",
    "#wrong",
    "time",
    "algbw",
    "busbw",
    "#wrong",
]


def bench(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.main", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def blocks(stdout: str) -> dict[str, list[str]]:
    """The output split into one nccl-tests block per operation, keyed by the op's name."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("# Collective test starting: "):
            current = found.setdefault(line.split(": ")[1].removesuffix("_perf"), [])
        current.append(line)
    return found


def check_report(report: dict[str, Any], nranks: int) -> None:
    assert report["nranks"] == nranks and report["backend"] == "gloo" and report["wrong"] == 0
    factor = FACTOR[report["op"]](nranks)
    cells = []
    for row in report["rows"]:
        assert {"size", "count", "type", "redop", "root", "out_of_place", "in_place"} <= set(row)
        for c in (row["out_of_place"], row["in_place"]):
            if c is None:
                continue
            assert set(c) == {"time_us", "algbw", "busbw", "wrong"}
            assert c["wrong"] == 0
            assert c["algbw"] == pytest.approx(row["size"] / (c["time_us"] * 1e3))
            assert c["busbw"] == pytest.approx(c["algbw"] * factor)
            cells.append(c["busbw"])
    assert report["avg_busbw"] == pytest.approx(sum(cells) / len(cells))


def test_every_op_on_two_ranks_prints_nccl_tests_tables_and_checks_results(tmp_path: Path) -> None:
    out = tmp_path / "collective.json"
    result = bench(
        "collective", "--op", "all", "--backend", "gloo", "--nproc", "2",
        "-b", "1K", "-e", "64K", "-f", "8", "-n", "3", "-w", "1", "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    tables = blocks(result.stdout)
    assert list(tables) == list(FACTOR)
    for op, lines in tables.items():
        assert lines[1].startswith("# nThread 1 nGpus 1 minBytes 1024 maxBytes 65536 step: 8(factor)")
        assert sum(1 for line in lines if line.startswith("#  Rank ")) == 2
        assert any(line.split() == TITLES for line in lines)
        rows = [line.split() for line in lines if not line.startswith("#")]
        assert [int(r[0]) for r in rows] == [1024, 8192, 65536]
        assert all(len(r) == 13 for r in rows)
        assert all(r[2] == "float" for r in rows)
        if op in ("all_reduce", "reduce", "reduce_scatter"):
            assert all(r[3] == "sum" for r in rows)
        measured = [c for r in rows for c in (r[5:9], r[9:13]) if c[0] != "N/A"]
        assert measured and all(c[3] == "0" for c in measured)  # #wrong
        assert "# Out of bounds values : 0 OK" in lines
        assert any(line.startswith("# Avg bus bandwidth    : ") for line in lines)
    # count = elements of the NCCL call: per rank for all_gather, all of it for all_reduce
    first = {
        op: next(line.split() for line in lines if not line.startswith("#")) for op, lines in tables.items()
    }
    assert (
        first["all_reduce"][1] == "256" and first["all_gather"][1] == "128" and first["broadcast"][4] == "0"
    )
    report = json.loads(out.read_text())
    assert [r["op"] for r in report["ops"]] == list(FACTOR)
    for r in report["ops"]:
        check_report(r, 2)


def test_four_ranks_blocking_half_precision_and_skipped_sizes(tmp_path: Path) -> None:
    out = tmp_path / "collective.json"
    result = bench(
        "collective", "--op", "all_reduce,all_gather,reduce_scatter,alltoall,sendrecv", "--nproc", "4",
        "--backend", "gloo", "--dtype", "half", "-b", "4", "-e", "4K", "-f", "32", "-n", "2", "-w", "1",
        "--blocking", "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "# Blocking Enabled: wait for completion and barrier after each collective" in result.stdout
    # 4 bytes = 2 halves: fewer than one element per rank for the gathers and scatters
    assert "# Skipped sizes (B) smaller than one element per rank: 4" in result.stdout
    for r in json.loads(out.read_text())["ops"]:
        check_report(r, 4)
        assert r["dtype"] == "half"


def test_bad_flags_fail_with_one_line_naming_the_flag() -> None:
    # In this process (typer's runner): these fail before any rank starts.
    for args, flag in (
        (["--op", "allreduce"], "--op"),
        (["-b", "1M", "-e", "1K"], "-e/--maxbytes"),
        (["--backend", "nccl"], "--backend nccl"),
        (["--op", "sendrecv", "--nproc", "1", "--backend", "gloo", "-b", "8", "-e", "8"], "--nproc 2"),
    ):
        result = CliRunner().invoke(app, ["bench", "collective", *args])
        assert result.exit_code == 1, (args, result.stdout)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], result.stderr
