"""First-fit placement on one node's GPUs: whole GPUs packed onto one NVLink island, fractions bin-packed."""

from __future__ import annotations

import re
from functools import lru_cache

from gpupool.scheduler.snapshot import GpuDemand, GpuView, NodeView

EPSILON = 1e-9
_MEMORY_SUFFIX = re.compile(r"^(?P<family>.+?)-(?P<gb>\d+)GB$")


@lru_cache(maxsize=256)
def split_model(name: str) -> tuple[str, int | None]:
    """ "A100-80GB" -> ("A100", 80e9 bytes): a family plus an optional minimum memory size."""
    match = _MEMORY_SUFFIX.match(name.upper())
    if match is None:
        return name.upper(), None
    return match["family"], int(match["gb"]) * 1_000_000_000


def gpu_fits(gpu: GpuView, demand: GpuDemand) -> bool:
    if demand.min_memory_bytes is not None and gpu.memory_bytes < demand.min_memory_bytes:
        return False
    if not demand.models:
        return True
    model = gpu.model.upper()
    for wanted in demand.models:
        family, memory = split_model(wanted)
        if family == model and (memory is None or gpu.memory_bytes >= memory):
            return True
    return False


def choose_gpus(node: NodeView, demand: GpuDemand) -> tuple[tuple[int, ...], float] | None:
    """GPU indices and the fraction each one gives, or None when this node cannot hold the demand."""
    if demand.count <= 0:
        return (), 0.0
    eligible = [g for g in node.gpus if gpu_fits(g, demand)]
    if demand.is_fractional:
        # Best fit: the shared GPU with the least room that still holds the fraction keeps whole GPUs free.
        shared = [g for g in eligible if g.free + EPSILON >= demand.count]
        if not shared:
            return None
        best = min(shared, key=lambda g: (g.free, g.index))
        return (best.index,), demand.count
    whole = int(demand.count)
    free = [g for g in eligible if g.allocated <= EPSILON]
    if len(free) < whole:
        return None
    islands: dict[int, list[GpuView]] = {}
    for gpu in free:
        islands.setdefault(gpu.nvlink_island, []).append(gpu)
    # Prefer the smallest island that holds the whole request (NVLink bandwidth, least fragmentation).
    fitting = [gpus for gpus in islands.values() if len(gpus) >= whole]
    if fitting:
        chosen = min(fitting, key=lambda gpus: (len(gpus), gpus[0].index))[:whole]
    else:
        chosen = sorted(free, key=lambda g: g.index)[:whole]
    return tuple(sorted(g.index for g in chosen)), 1.0


def why_not(node: NodeView, demand: GpuDemand) -> str:
    """Why `node` cannot hold `demand`, for the pending explanation."""
    if not node.schedulable:
        return f"{node.name} is {node.state}"
    eligible = [g for g in node.gpus if gpu_fits(g, demand)]
    if not eligible:
        wanted = "|".join(demand.models) or "any model"
        return f"{node.name} has no GPU matching {wanted}" + (
            f" with >= {demand.min_memory_bytes / 1e9:.0f}GB" if demand.min_memory_bytes else ""
        )
    if demand.is_fractional:
        room = max(g.free for g in eligible)
        return f"{node.name}: largest free share of one GPU is {room:.2f}"
    free = sum(1 for g in eligible if g.allocated <= EPSILON)
    return f"{node.name}: {free} of {len(eligible)} matching GPUs free"
