"""`gpupool agent` never invents GPUs: without a driver its default (`--gpus nvml`) refuses to start, naming
the choices, where a fallback to simulated GPUs would put real work on fake ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.gpu import GpuUnavailable
from gpupool.gpu.nvml import NvmlProvider


def test_an_agent_on_a_machine_without_a_driver_refuses_to_start_by_default(tmp_path: Path) -> None:
    try:
        NvmlProvider().close()
    except GpuUnavailable:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver: the agent would start")
    env = {"GPUPOOL_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    argv = ["agent", "--server", "http://127.0.0.1:9", "--join-token", "x"]  # no --gpus: nvml
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.main", *argv], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1
    assert out.stderr.startswith("error: --gpus nvml: no NVIDIA driver found")
    assert "--gpus sim:8xH100" in out.stderr and "on a machine without GPUs give --gpus none" in out.stderr
    assert not (tmp_path / "agent").exists()  # nothing joined, nothing kept
