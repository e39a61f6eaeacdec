"""What a replay is given (`SimOptions`) and what it gives back (`SimResult`: every job's record, the
timeline, the counters); metrics.py and report.py read only these."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SimOptions:
    cycle: float = 60.0  # seconds between periodic scheduler cycles
    restart_overhead: float = 60.0  # seconds a restarted job spends before it progresses again
    checkpoint_interval: float = 1800.0  # seconds of progress between checkpoints; 0 = nothing is lost
    seed: int = 0  # kept for reproducibility records; the engine itself draws nothing at random


@dataclass(slots=True)
class JobRecord:
    """What happened to one job (times in seconds since the window start)."""

    id: int
    queue: str  # the tenant
    submit: float
    duration: float
    gpus: float
    start: float | None = None  # first start
    finish: float | None = None
    queued: float = 0.0  # all time pending, time spent preempted included
    preemptions: int = 0
    lost_gpu_s: float = 0.0  # GPU-seconds of work lost since checkpoints, plus restart overheads paid

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.submit


@dataclass(slots=True)
class Sample:
    t: float
    pending: int
    used_gpus: float
    allocated: dict[str, float]  # tenant -> GPUs
    fair_share: dict[str, float]  # tenant -> GPUs (policies with tenant queues)


@dataclass(slots=True)
class SimResult:
    policy: str
    cluster_gpus: int
    arrival_window: float  # seconds from time zero to the last arrival
    jobs: list[JobRecord]
    dropped: list[int]  # trace job ids larger than the cluster
    quotas: dict[str, float]
    busy_gpu_s: float = 0.0  # GPU-seconds in use during the arrival window
    shortfall_gpu_s: dict[str, float] = field(default_factory=dict)  # wanted within quota, not given
    # queues with queues under them: a parent's shortfall is its subtree's, and the overall violation
    # counts the leaves' quotas alone (`metrics.summarize`)
    parents: tuple[str, ...] = ()
    timeline: list[Sample] = field(default_factory=list)
    cycles: int = 0
    decide_s: float = 0.0
    wall_s: float = 0.0
    unfinished: int = 0
