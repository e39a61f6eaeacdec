"""Active health checks: short GPU workloads whose figures `checks.active` judges.

Two runners behind one interface. `TorchRunner` runs `python -m gpupool.health.active_torch` on the node
(real GPUs: BF16 GEMM, pinned host<->device copies, a memory pattern test, and at the full level an
all-reduce over every GPU through `gpupool bench collective`). `SimulatedRunner` serves simulated GPUs:
it reports the model's typical figures (below) times the slowdown injected with `gpupool node inject-fault
--slow`, and an error for a GPU that fell off the bus, so every path of the verdicts is exercised here.
The head runs them for its own GPUs; for an agent node, `AgentRunner` asks the node's agent, which runs the
runner for its GPUs (health/node_tasks.py) and sends the result back on a heartbeat.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Protocol

from gpupool.gpu import GpuProvider, NvmlProvider
from gpupool.gpu.simulated import PCIE_GEN, SimulatedProvider
from gpupool.health.checks import ActiveResult, GpuMeasurement
from gpupool.health.thresholds import LEVELS

# Typical healthy figures the simulated runner reports (fractions of the catalog peak; GB/s by PCIe gen).
SIM_GEMM_FRACTION = 0.8  # large BF16 GEMMs on H100/A100 reach 75-85% of the dense peak
SIM_COPY_GBPS = {5: 55.0, 4: 26.0, 3: 12.5}  # pinned copies over x16 links of each PCIe generation
SIM_ALLREDUCE_GBPS = {"H100": 480.0, "H200": 480.0, "B200": 700.0, "A100": 235.0}  # 8-GPU NVLink busbw
TORCH_TIMEOUT = {"quick": 300.0, "full": 900.0}
AGENT_MARGIN = 30.0  # seconds an agent node's checks may take beyond the torch timeout (heartbeat trips)


class ActiveCheckError(RuntimeError):
    """The active checks could not run at all (no torch, no CUDA, a timeout): the message says why."""


class ActiveRunner(Protocol):
    kind: str

    def run(self, level: str) -> ActiveResult: ...


class NodeAsker(Protocol):
    """Who carries an instruction to a node's agent and returns its reply (backends.agent.AgentBackend)."""

    def ask(self, name: str, instruction: dict[str, Any], timeout: float) -> dict[str, Any]: ...


def runner_for_gpus(gpus: GpuProvider | None) -> ActiveRunner | None:
    """The runner for this machine's GPUs: simulated figures for simulated GPUs, torch for real ones."""
    if isinstance(gpus, SimulatedProvider):
        return SimulatedRunner(gpus)
    if isinstance(gpus, NvmlProvider):
        return TorchRunner()
    return None


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"--level {level}: unknown level; one of {', '.join(LEVELS)}")


class SimulatedRunner:
    """Active checks of simulated GPUs, from the model's typical figures and the injected faults."""

    kind = "simulated"

    def __init__(self, provider: SimulatedProvider) -> None:
        self.provider = provider

    def run(self, level: str) -> ActiveResult:
        _check_level(level)
        began = time.monotonic()
        gpus = []
        slowest = 1.0
        for device in self.provider.devices():
            info, slow, lost = self.provider.condition(device.index)
            if lost:
                gpus.append(
                    GpuMeasurement(
                        device.index,
                        info.family,
                        info.dense_bf16_tflops,
                        error="does not answer (fallen off the bus)",
                    )
                )
                slowest = 0.0
                continue
            slowest = min(slowest, slow)
            copy = SIM_COPY_GBPS.get(PCIE_GEN.get(info.family, 3), 12.5) * slow
            gpus.append(
                GpuMeasurement(
                    device.index,
                    info.family,
                    info.dense_bf16_tflops,
                    gemm_tflops=round(info.dense_bf16_tflops * SIM_GEMM_FRACTION * slow, 1),
                    h2d_gbps=round(copy, 1),
                    d2h_gbps=round(copy, 1),
                    memtest_errors=0,
                )
            )
        busbw = None
        if level == "full" and len(gpus) > 1:
            family = gpus[0].model
            busbw = round(SIM_ALLREDUCE_GBPS.get(family, 20.0) * slowest, 1)
        return ActiveResult(
            level,
            tuple(gpus),
            busbw,
            runner=self.kind,
            notes=("simulated GPUs: typical figures of the model times any injected slowdown",),
            seconds=time.monotonic() - began,
        )


class TorchRunner:
    """Active checks of this machine's real GPUs, in a child process (CUDA state never enters the head)."""

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


class AgentRunner:
    """Active checks of an agent node: its agent runs them on its GPUs when the head asks."""

    kind = "agent"

    def __init__(self, asker: NodeAsker, node: str) -> None:
        self.asker, self.node = asker, node

    def run(self, level: str) -> ActiveResult:
        _check_level(level)
        timeout = TORCH_TIMEOUT[level] + AGENT_MARGIN
        try:
            reply = self.asker.ask(self.node, {"kind": "health_check", "level": level}, timeout)
        except TimeoutError as exc:
            raise ActiveCheckError(f"node {self.node}: {exc}") from exc
        except LookupError as exc:
            raise ActiveCheckError(f"node {self.node}: its agent is not connected to this head") from exc
        if reply.get("error"):
            raise ActiveCheckError(f"node {self.node}'s agent: {reply['error']}")
        return ActiveResult.from_dict(reply["result"])
