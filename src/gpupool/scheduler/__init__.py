"""The pure scheduling core: `decide(snapshot, now) -> Decisions`."""

from gpupool.scheduler.core import decide
from gpupool.scheduler.snapshot import (
    Bind,
    Decisions,
    GpuDemand,
    GpuView,
    NodeView,
    QueueView,
    Snapshot,
    WorkloadView,
)

__all__ = [
    "Bind",
    "Decisions",
    "GpuDemand",
    "GpuView",
    "NodeView",
    "QueueView",
    "Snapshot",
    "WorkloadView",
    "decide",
]
