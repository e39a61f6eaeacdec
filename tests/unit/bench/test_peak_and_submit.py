"""Peaks come from the catalog; a submitted bench is the same command with --json into the workdir."""

from __future__ import annotations

import pytest

from gpupool.bench.errors import BenchError
from gpupool.bench.peak import peak_for
from gpupool.bench.submit import job_spec, results_path
from gpupool.spec import parse_workload_spec


@pytest.mark.parametrize(
    "name,memory,dtype,peak",
    [
        ("NVIDIA H100 80GB HBM3", 85520809984, "bf16", 989.0),
        ("NVIDIA H200", None, "half", 989.0),
        ("NVIDIA A100-SXM4-40GB", 42949672960, "bf16", 312.0),
        ("NVIDIA H100 PCIe", None, "bf16", 756.0),
        ("Tesla T4", None, "half", 65.0),
    ],
)
def test_dense_peaks_from_the_catalog(name: str, memory: int | None, dtype: str, peak: float) -> None:
    assert peak_for(name, memory, dtype).tflops == peak


def test_no_peak_is_claimed_where_the_table_has_none() -> None:
    assert peak_for(None, None, "float").tflops is None
    assert "CPU" in peak_for(None, None, "float").note
    assert peak_for("NVIDIA H100 80GB HBM3", None, "float").tflops is None
    assert "no BF16" in peak_for("Tesla V100-SXM2-16GB", None, "bf16").note
    assert peak_for("Some Future GPU", None, "bf16").tflops is None


def test_single_node_job_runs_the_same_bench_with_one_process_per_gpu() -> None:
    spec = job_spec(
        "collective", ["--op", "all_reduce", "-b", "8"], distributed=True, nodes=1, gpus="H100:8",
        queue="ops", name=None, workdir="/tmp/w", python="/venv/bin/python",
    )  # fmt: skip
    parse_workload_spec(spec)
    assert (
        spec["resources"] == {"gpu": "H100:8"}
        and spec["queue"] == "ops"
        and spec["name"] == "bench-collective"
    )
    assert spec["commands"] == [
        "/venv/bin/python -m gpupool.main bench collective --op all_reduce -b 8 "
        '--nproc $GPUPOOL_GPUS_PER_NODE --json "gpupool-bench-collective-job${GPUPOOL_JOB_ID}.json" '
        "--emit-result"
    ]


def test_multi_node_jobs_use_torchrun_with_the_job_contract() -> None:
    spec = job_spec("train", ["--layers", "2"], distributed=True, nodes=2, gpus="8", queue="default",
                    name="mfu", workdir="/tmp/w", python="py")  # fmt: skip
    parse_workload_spec(spec)
    command = spec["commands"][0]
    assert command.startswith("py -m torch.distributed.run --nnodes=$NNODES --node-rank=$NODE_RANK")
    assert (
        "--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT -m gpupool.main bench train --layers 2"
        in command
    )
    gemm = job_spec("gemm", [], distributed=False, nodes=2, gpus="8", queue="q", name=None, workdir="/w")
    assert "gpupool-bench-gemm-job${GPUPOOL_JOB_ID}-node${GPUPOOL_NODE_RANK}.json" in gemm["commands"][0]


def test_submit_needs_gpus() -> None:
    with pytest.raises(BenchError, match="--submit needs --gpus"):
        job_spec("gemm", [], distributed=False, nodes=1, gpus=None, queue="q", name=None, workdir="/w")


def test_the_results_file_a_submitted_job_writes_is_named_as_a_person_finds_it() -> None:
    assert results_path("gemm", False, 7, 1) == "gpupool-bench-gemm-job7-node0.json"
    assert results_path("gemm", False, 7, 3) == (
        "gpupool-bench-gemm-job7-node<rank>.json (one per node, <rank> 0..2)"
    )
    assert results_path("train", True, 7, 2) == "gpupool-bench-train-job7.json"  # rank 0 writes for all
