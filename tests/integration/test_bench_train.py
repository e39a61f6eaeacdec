"""`gpupool bench gemm|train|prepare-data` for real on the CPU, and a bench submitted as a gpupool job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.app import app
from tests.support.bench import tiny_gemm_submit
from tests.support.server import ServerProcess

pytest.importorskip("torch")

TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "-n", "2", "-w", "1"]


def bench(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.main", "bench", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_gemm_on_the_cpu_reports_tflops_and_says_there_is_no_peak(tmp_path: Path) -> None:
    out = tmp_path / "gemm.json"
    args = [
        "bench",
        "gemm",
        "--device",
        "cpu",
        "--sizes",
        "64,32x48x16",
        "-n",
        "3",
        "-w",
        "1",
        "--json",
        str(out),
    ]
    result = CliRunner().invoke(app, args)  # in this process: gemm starts no other process
    assert result.exit_code == 0, result.stderr
    assert "no peak table for CPUs; TFLOPS only" in result.stdout
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [(r["m"], r["n"], r["k"]) for r in rows] == [(64, 64, 64), (32, 48, 16)]
    for r in rows:
        assert r["dtype"] == "float" and r["peak_tflops"] is None and r["fraction_of_peak"] is None
        assert r["tflops"] == pytest.approx(2 * r["m"] * r["n"] * r["k"] / (r["time_us"] * 1e-6) / 1e12)
    assert report["best_tflops"] == max(r["tflops"] for r in rows)


def test_prepare_data_then_train_on_it_with_ddp_on_two_ranks(tmp_path: Path) -> None:
    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        "".join(json.dumps({"text": f"document {i}: " + "tokens " * 20}) + "\n" for i in range(30))
    )
    args = ["bench", "prepare-data", str(docs), "--output", str(tmp_path / "corpus")]
    prepared = CliRunner().invoke(app, args)  # in this process: no torch
    assert prepared.exit_code == 0, prepared.stderr
    assert "30 documents" in prepared.stdout and (tmp_path / "corpus.bin").exists()

    out = tmp_path / "train.json"
    result = bench(
        "train", *TINY, "--nproc", "2", "--micro-batch", "2", "--global-batch", "8",
        "--data", str(tmp_path / "corpus"), "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "gradient accumulation 2" in result.stdout and "TFLOP/s per GPU" in result.stdout
    r = json.loads(out.read_text())
    assert r["world_size"] == 2 and r["grad_accumulation"] == 2 and r["parallel"] == "ddp"
    assert r["model"]["vocab"] == 257  # the byte-level file's vocabulary
    assert r["data"] == str(tmp_path / "corpus") and len(r["iteration_times_s"]) == 2
    # Megatron-LM's formula by hand: 72 B s l h^2 (1 + s/6h + V/12lh), B = 8, s = 32, l = 2, h = 64, V = 257
    flops = 72 * 8 * 32 * 2 * 64**2 * (1 + 32 / (6 * 64) + 257 / (12 * 2 * 64))
    assert r["flops_per_iteration"] == pytest.approx(flops)
    assert r["tokens_per_s"] == pytest.approx(8 * 32 / r["iteration_time_s"])
    assert r["tflops_per_gpu"] == pytest.approx(flops / r["iteration_time_s"] / 2 / 1e12)
    assert r["mfu"] is None and r["peak_tflops"] is None  # no peak for a CPU


def test_fsdp_training_on_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "train.json"
    result = bench("train", *TINY, "--vocab", "128", "--nproc", "2", "--parallel", "fsdp", "--json", str(out))
    assert result.returncode == 0, result.stderr
    r = json.loads(out.read_text())
    assert r["parallel"] == "fsdp" and r["world_size"] == 2 and r["global_batch"] == 8


def test_train_refuses_a_global_batch_the_ranks_cannot_split() -> None:
    result = bench("train", *TINY, "--nproc", "2", "--micro-batch", "2", "--global-batch", "6")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: --global-batch 6 is not a multiple of --micro-batch 2 x 2 ranks = 4; use --global-batch 4"
    )


def test_a_submitted_bench_runs_as_a_job_and_writes_its_json_in_the_workdir(
    server: ServerProcess, job_dir: Path
) -> None:
    args = tiny_gemm_submit()
    spec = json.loads(server.cli(*args, "--print-spec", cwd=job_dir, check=True).stdout)
    assert spec["workdir"] == str(job_dir) and spec["resources"] == {"gpu": "1"}
    submitted = server.cli(*args, cwd=job_dir, check=True).stdout
    assert "submitted 1 (bench-gemm)" in submitted
    assert server.wait_for(1, timeout=60)["state"] == "succeeded", server.cli("logs", "1").stdout
    report = json.loads((job_dir / "gpupool-bench-gemm-job1-node0.json").read_text())
    assert report["rows"][0]["m"] == 32
