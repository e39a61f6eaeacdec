"""`sim place`: GPU fragmentation on alibaba-openb pod lists, measured as the FGD paper (ATC'23) does.

Pods are drawn at random (seeded, with replacement) from the pod list and placed one by one with no
departures until the GPU demand that has arrived (placed or not) reaches `stop` (130%) of the cluster's
GPU capacity. The figure of merit is the share of GPU capacity allocated when arrived demand reached
100% (`alloc_ratio_at_100`). One `decide` call places the whole sequence: with one queue in submit order,
no preemption and `blocking: skip`, the scheduler places pending pods one after another on its tentative
state, exactly as separate calls would with nothing ever leaving.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.scheduler import GpuDemand, SchedulerConfig, Snapshot, WorkloadView, decide
from gpupool.sim.cluster import Cluster
from gpupool.sim.errors import SimError
from gpupool.sim.input_files import MIB, models_field, number_field, read_rows
from gpupool.sim.trace import OPENB_POD_COLUMNS, openb_gpus

PLACEMENTS = ("binpack", "spread", "fragmentation")
CURVE_STEP = 0.05  # the curve's points: every 5% of capacity of arrived demand


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    gpus: float  # GPU units: num_gpu, or gpu_milli / 1000 for a shared GPU
    demand: GpuDemand  # per pod
    cpus: float
    memory_bytes: int


def load_pods(value: str) -> list[Pod]:
    """The pods of an alibaba-openb pod list, CPU-only pods included (0 GPUs): the GPUs of each as
    `trace.load_alibaba_openb` reads them, but a negative figure is an error (no pod is left out here)."""
    fmt, sep, raw = value.partition(":")
    if not sep or fmt != "alibaba-openb":
        raise SimError(
            "--trace", f"sim place reads alibaba-openb pod lists; e.g. --trace alibaba-openb:{raw or value}"
        )
    path = Path(raw)
    pods = []
    for line, row in enumerate(read_rows(path, "alibaba-openb pod list", OPENB_POD_COLUMNS), start=2):
        count, why_not = openb_gpus(row, path, line)
        cpu_milli = number_field(row, "cpu_milli", path, line)
        memory_mib = number_field(row, "memory_mib", path, line)
        negative = next((c for c, v in (("cpu_milli", cpu_milli), ("memory_mib", memory_mib)) if v < 0), None)
        if why_not is not None and why_not.startswith("a negative "):
            negative = why_not.removeprefix("a negative ")
        if negative is not None:
            raise SimError(
                "--trace",
                f"{path} line {line}: {negative} {row[negative].strip()} is negative; a pod asks for 0 or "
                "more: correct the row or delete it",
            )
        models = models_field(row, "gpu_spec", path, line)
        memory = int(memory_mib * MIB)
        pods.append(Pod(row["name"].strip(), count, GpuDemand(count, models), cpu_milli / 1000.0, memory))
    if not pods:
        raise SimError("--trace", f"{path} lists no pods")
    return pods


def draw(pods: list[Pod], capacity: float, seed: int, stop: float = 1.3) -> list[Pod]:
    """Pods drawn with replacement until arrived GPU demand reaches `stop` x capacity."""
    if not any(p.gpus > 0 for p in pods):
        raise SimError("--trace", "the pod list has no GPU pods; nothing to measure")
    rng = random.Random(seed)
    drawn: list[Pod] = []
    arrived = 0.0
    while arrived < stop * capacity:
        pod = pods[rng.randrange(len(pods))]
        drawn.append(pod)
        arrived += pod.gpus
    return drawn


def place(pods: list[Pod], cluster: Cluster, placement: str) -> dict[str, Any]:
    if placement not in PLACEMENTS:
        raise SimError("--policy", f"unknown placement {placement!r}; one of {', '.join(PLACEMENTS)}")
    pending = tuple(
        WorkloadView(
            id=i,
            queue="pool",
            priority=0,
            submit_time=float(i),
            gpus=p.demand,
            cpus=p.cpus,
            memory_bytes=p.memory_bytes,
        )
        for i, p in enumerate(pods)
    )
    config = SchedulerConfig(actions=("allocate",), placement=placement, blocking="skip", fair_share=False)
    began = time.perf_counter()
    decisions = decide(Snapshot(cluster.nodes, pending, (), (), config), 0.0)
    wall = time.perf_counter() - began
    placed = {b.workload_id for b in decisions.binds}
    capacity = float(cluster.gpus)
    arrived = allocated = 0.0
    curve: dict[str, float] = {}
    # the arrived demand each point was read at: the pod that crossed it counts, so it may lie past it
    curve_arrived: dict[str, float] = {}
    at_100: float | None = None
    # every 5% of capacity up to the demand that arrived in all (the draw's --stop, 130% by default)
    total = sum(p.gpus for p in pods) / capacity
    points = [round(CURVE_STEP * i, 2) for i in range(1, int(total / CURVE_STEP + 1e-9) + 1)]
    for i, pod in enumerate(pods):
        arrived += pod.gpus
        if i in placed:
            allocated += pod.gpus
        while points and arrived >= points[0] * capacity - 1e-9:
            key = f"{points.pop(0):.2f}"
            curve[key], curve_arrived[key] = allocated / capacity, arrived / capacity
        if at_100 is None and arrived >= capacity - 1e-9:
            at_100 = allocated / capacity
    gpu_pods = [i for i, p in enumerate(pods) if p.gpus > 0]
    return {
        "alloc_ratio_at_100": at_100 if at_100 is not None else allocated / capacity,
        "alloc_ratio_at_end": allocated / capacity,
        "arrived_ratio_at_end": arrived / capacity,
        "pods_drawn": len(pods),
        "pods_placed": len(placed),
        "gpu_pods_failed": sum(1 for i in gpu_pods if i not in placed),
        "curve": curve,
        "curve_arrived": curve_arrived,
        "wall_s": wall,
    }
