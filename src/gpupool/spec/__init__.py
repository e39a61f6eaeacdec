"""The user-facing schema: workload and queue specs and the quantities in them ("H100:8", "256GB", "12h").

Pure: no I/O beyond parsing text. Every bad value raises SpecError naming the field, the value and a fix.
"""

from gpupool.spec.errors import SpecError
from gpupool.spec.quantities import (
    GpuRequest,
    format_duration,
    format_gpu_indices,
    format_size,
    parse_duration,
    parse_gpu_request,
    parse_size,
)
from gpupool.spec.queue import QueueResources, QueueSpec, ResourceShare, parse_queue_spec
from gpupool.spec.workload import (
    PRIORITY_CLASSES,
    CheckpointSpec,
    PlacementSpec,
    Resources,
    RetrySpec,
    ScalingSpec,
    WorkloadSpec,
    parse_workload_spec,
)

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
    "format_gpu_indices",
    "format_size",
    "parse_duration",
    "parse_gpu_request",
    "parse_queue_spec",
    "parse_size",
    "parse_workload_spec",
]
