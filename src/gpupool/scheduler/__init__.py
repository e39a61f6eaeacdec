"""The pure scheduling core: `decide(snapshot, now) -> Decisions`."""

from gpupool.scheduler.core import Scheduler, decide
from gpupool.scheduler.cycle import ConfigError
from gpupool.scheduler.snapshot import (
    Bind,
    Decisions,
    Eviction,
    Explanation,
    GpuDemand,
    GpuView,
    NodeView,
    PodPlacement,
    QueueView,
    SchedulerConfig,
    Share,
    Snapshot,
    WorkloadView,
)

__all__ = [
    "Bind",
    "ConfigError",
    "Decisions",
    "Eviction",
    "Explanation",
    "GpuDemand",
    "GpuView",
    "NodeView",
    "PodPlacement",
    "QueueView",
    "Scheduler",
    "SchedulerConfig",
    "Share",
    "Snapshot",
    "WorkloadView",
    "decide",
]
