"""Active health checks: short GPU workloads whose figures `checks.active` judges.

They run as a gpupool job on the node (health/check_job.py, submitted and bound by the head's health loop:
control/health_jobs.py). Two runners behind one interface do the measuring there. `TorchRunner` runs
`python -m gpupool.health.active_torch` (real GPUs: BF16 GEMM, pinned host<->device copies, a memory pattern
test, and at the full level an all-reduce over every GPU through `gpupool bench collective`).
`SimulatedRunner` serves simulated GPUs: it reports the model's typical figures (below) times the slowdown
injected with `gpupool node inject-fault --slow`, and an error for a GPU that fell off the bus, so every
path of the verdicts is exercised here; a check job reads the same conditions from the process that owns
the simulated GPUs (health/simulated_state.py) and computes them with `simulated_result`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gpupool.gpu.simulated import SimulatedProvider
from gpupool.health.checks import ActiveResult, GpuMeasurement
from gpupool.health.simulated_state import conditions
from gpupool.health.thresholds import LEVELS

# Typical healthy figures the simulated runner reports (fractions of the catalog peak; GB/s by PCIe gen).
SIM_GEMM_FRACTION = 0.8  # large BF16 GEMMs on H100/A100 reach 75-85% of the dense peak
SIM_COPY_GBPS = {5: 55.0, 4: 26.0, 3: 12.5}  # pinned copies over x16 links of each PCIe generation
SIM_ALLREDUCE_GBPS = {"H100": 480.0, "H200": 480.0, "B200": 700.0, "A100": 235.0}  # 8-GPU NVLink busbw
TORCH_TIMEOUT = {"quick": 300.0, "full": 900.0}


class ActiveCheckError(RuntimeError):
    """The active checks could not run at all (no torch, no CUDA, a timeout): the message says why."""


class ActiveRunner(Protocol):
    kind: str

    def run(self, level: str) -> ActiveResult: ...


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"--level {level}: unknown level; one of {', '.join(LEVELS)}")


class SimulatedRunner:
    """Active checks of simulated GPUs, from the model's typical figures and the injected faults."""

    kind = "simulated"

    def __init__(self, provider: SimulatedProvider) -> None:
        self.provider = provider

    def run(self, level: str) -> ActiveResult:
        return simulated_result(level, conditions(self.provider))


def simulated_result(level: str, gpus: Sequence[Mapping[str, Any]], seconds: float = 0.0) -> ActiveResult:
    """What the active checks measure on simulated GPUs in these conditions (simulated_state.conditions:
    model, peak, PCIe generation, injected slowdown, lost)."""
    _check_level(level)
    measured = []
    slowest = 1.0
    for g in gpus:
        index, model, peak = int(g["index"]), str(g["model"]), float(g["peak_tflops"])
        if g.get("lost"):
            measured.append(GpuMeasurement(index, model, peak, error="does not answer (fallen off the bus)"))
            slowest = 0.0
            continue
        slow = float(g.get("slow", 1.0))
        slowest = min(slowest, slow)
        copy = SIM_COPY_GBPS.get(int(g.get("pcie_gen") or 3), 12.5) * slow
        measured.append(
            GpuMeasurement(
                index,
                model,
                peak,
                gemm_tflops=round(peak * SIM_GEMM_FRACTION * slow, 1),
                h2d_gbps=round(copy, 1),
                d2h_gbps=round(copy, 1),
                memtest_errors=0,
            )
        )
    busbw = None
    if level == "full" and len(measured) > 1:
        # a ring is as fast as its slowest link: one PCIe GPU (20 GB/s) among NVLink ones sets the figure
        links = min(SIM_ALLREDUCE_GBPS.get(m.model, 20.0) for m in measured)
        busbw = round(links * slowest, 1)
    return ActiveResult(
        level,
        tuple(measured),
        busbw,
        runner="simulated",
        notes=("simulated GPUs: typical figures of the model times any injected slowdown",),
        seconds=seconds,
    )


class TorchRunner:
    """Active checks of this machine's real GPUs, in a child process (CUDA state never enters the caller)."""

    kind = "torch"

    def run(self, level: str) -> ActiveResult:
        _check_level(level)
        command = [sys.executable, "-m", "gpupool.health.active_torch", "--level", level]
        began = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TORCH_TIMEOUT[level])
        except subprocess.TimeoutExpired as exc:
            raise ActiveCheckError(f"active checks ({level}) took over {TORCH_TIMEOUT[level]:.0f}s") from exc
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ActiveCheckError(
                f"active checks ({level}) failed with exit code {done.returncode}: {tail[0]}"
            )
        data = json.loads(done.stdout)
        return ActiveResult(
            level,
            tuple(GpuMeasurement(**g) for g in data["gpus"]),
            data.get("allreduce_busbw_gbps"),
            runner=self.kind,
            notes=tuple(data.get("notes", ())),
            seconds=time.monotonic() - began,
        )
