"""What the scheduler sees: plain, immutable data built by the control loop (or the simulator)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU and how much of it (0..1) is already allocated."""

    index: int
    model: str
    memory_bytes: int
    nvlink_island: int = 0
    allocated: float = 0.0

    @property
    def free(self) -> float:
        return 1.0 - self.allocated


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as placement sees it; only `schedulable` nodes take new work."""

    name: str
    schedulable: bool
    gpus: tuple[GpuView, ...]
    cpus: float = 0.0
    memory_bytes: int = 0
    cpus_allocated: float = 0.0
    memory_allocated: int = 0
    state: str = "ready"
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class GpuDemand:
    """GPUs per node: `count` whole GPUs or a fraction (< 1) of one; optional model and memory constraints."""

    count: float = 0.0
    models: tuple[str, ...] = ()
    min_memory_bytes: int | None = None

    @property
    def is_fractional(self) -> bool:
        return 0 < self.count < 1


@dataclass(frozen=True, slots=True)
class WorkloadView:
    """A workload waiting for placement."""

    id: int
    queue: str
    priority: int
    submit_time: float
    nodes: int = 1
    gpus: GpuDemand = field(default_factory=GpuDemand)
    cpus: float = 0.0
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class QueueView:
    """A queue's hard GPU cap (None = none) and the GPUs its running work already holds."""

    name: str
    gpu_limit: float | None = None
    gpus_allocated: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    pending: tuple[WorkloadView, ...]
    queues: tuple[QueueView, ...] = ()


@dataclass(frozen=True, slots=True)
class Bind:
    """Start `workload_id` on `node` with these GPUs (each taking `gpu_fraction`, 1.0 for whole GPUs)."""

    workload_id: int
    node: str
    gpu_indices: tuple[int, ...]
    gpu_fraction: float = 1.0


@dataclass(slots=True)
class Decisions:
    binds: list[Bind] = field(default_factory=list)
    # For every workload left pending: one sentence a person can act on.
    pending_reasons: dict[int, str] = field(default_factory=dict)
