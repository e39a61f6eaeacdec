"""The user-facing schema: workload and queue specs and the quantities in them ("H100:8", "256GB", "12h").

Pure: no I/O beyond parsing text. Every bad value raises SpecError naming the field, the value and a fix.

The quantities and SpecError load with the package; the pydantic models of queue and workload specs (most
of the package's import time: a client command that only reads durations or sizes never needs them) load
on first use of one of their names (PEP 562), so `from gpupool.spec import parse_workload_spec` works as
usual and `import gpupool.spec` alone stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from gpupool.spec.errors import SpecError
from gpupool.spec.quantities import (
    GpuRequest,
    format_duration,
    format_figure,
    format_gpu_indices,
    format_size,
    parse_duration,
    parse_gpu_request,
    parse_size,
)

if TYPE_CHECKING:
    from gpupool.spec.priority import PRIORITY_CLASSES
    from gpupool.spec.queue import QueueResources, QueueSpec, ResourceShare, parse_queue_spec
    from gpupool.spec.sections import CheckpointSpec, PlacementSpec, Resources, RetrySpec, ScalingSpec
    from gpupool.spec.workload import WorkloadSpec, parse_workload_spec

# name -> the submodule that defines it, imported when the name is first asked for
_LAZY = {
    "PRIORITY_CLASSES": "priority",
    **dict.fromkeys(("QueueResources", "QueueSpec", "ResourceShare", "parse_queue_spec"), "queue"),
    **dict.fromkeys(("CheckpointSpec", "PlacementSpec", "Resources", "RetrySpec", "ScalingSpec"), "sections"),
    **dict.fromkeys(("WorkloadSpec", "parse_workload_spec"), "workload"),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # found directly from now on
    return value


__all__ = [
    "PRIORITY_CLASSES",
    "CheckpointSpec",
    "GpuRequest",
    "PlacementSpec",
    "QueueResources",
    "QueueSpec",
    "ResourceShare",
    "Resources",
    "RetrySpec",
    "ScalingSpec",
    "SpecError",
    "WorkloadSpec",
    "format_duration",
    "format_figure",
    "format_gpu_indices",
    "format_size",
    "parse_duration",
    "parse_gpu_request",
    "parse_queue_spec",
    "parse_size",
    "parse_workload_spec",
]
