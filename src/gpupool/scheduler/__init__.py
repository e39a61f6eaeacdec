"""The pure scheduling core: `decide(snapshot, now) -> Decisions`.

The modules below may run compiled: `tools/build_native.py` (run by `make`) compiles this same source with
mypyc into `_native/`. They are imported from there only while every compiled source is byte for byte the
file next to this one and the ABI is this interpreter's; else, or with GPUPOOL_PURE_PYTHON=1 set, the source
runs as it is (`gpupool.native`). `NATIVE` says which. Reading the manifest at import is the only file
access here; `decide` itself does none.
"""

# ruff: noqa: E402  (the submodules are imported only once `__path__` says where they come from)

from gpupool.native import use_compiled

NATIVE = use_compiled(__file__, __path__)

from gpupool.scheduler.core import Scheduler, decide
from gpupool.scheduler.prepare import ConfigError
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
    "NATIVE",
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
