"""The queue spec: a team or project, in a hierarchy, with a guaranteed quota and a cap per resource."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpupool.spec.document import validate_spec
from gpupool.spec.errors import SpecError
from gpupool.spec.fields import Name, Number, Seconds, Whole, check_name, field_name, refuse_bool
from gpupool.spec.quantities import parse_size

MAX_QUEUE_PRIORITY: Final = 1000
# gpupool's own work (the nodes' health check jobs, placed by the head, not the scheduler); a top-level
# queue with no quota, made when first needed
SYSTEM_QUEUE: Final = "gpupool-system"

QUEUE_FIELD_EXAMPLES: Final[dict[str, str]] = {
    "": "{name: nlp, resources: {gpu: {quota: 16, limit: 32}}}",
    "name": "nlp",
    "parent": "research",
    "priority": "10",
    "description": "NLP team",
    "resources": "{gpu: {quota: 16, limit: 32, over_quota_weight: 2}}",
    "resources.gpu": "{quota: 16, limit: 32, over_quota_weight: 1}",
    "resources.gpu.quota": "16",
    "resources.gpu.limit": "32",
    "resources.gpu.over_quota_weight": "1",
    "resources.cpu": "{quota: 256, limit: 512}",
    "resources.cpu.quota": "256",
    "resources.cpu.limit": "512",
    "resources.cpu.over_quota_weight": "1",
    "resources.memory": "{quota: 2TB, limit: 4TB}",
    "resources.memory.quota": "2TB",
    "resources.memory.limit": "4TB",
    "resources.memory.over_quota_weight": "1",
    "ordering": "fifo",
    "min_runtime_preempt": "10m",
    "min_runtime_reclaim": "30m",
    "user_limits": "{gpus: 8, workloads: 4}",
    "user_limits.gpus": "8",
    "user_limits.workloads": "4",
    "budget": "{gpu_hours: 5000, period: month}",
    "budget.gpu_hours": "5000",
    "budget.period": "month (or week, day)",
    "budget.when_spent": "stop (or wait)",
    "max_priority": "50",
}
"""A valid example for each field path, shown in every error about that field."""


# The most a quota or limit may say (1e18: an exabyte of memory; far past any GPU or CPU count), so that
# quotas add up to a number, not to infinity (two of 1e308 made every other queue's guarantee void).
MAX_AMOUNT = 1e18


class ResourceShare(BaseModel):
    """A queue's share of one resource (GPUs, CPU cores, or bytes of memory)."""

    model_config = ConfigDict(extra="forbid")

    quota: Number = Field(
        default=0.0,
        ge=0,
        le=MAX_AMOUNT,
        description="Guaranteed ('deserved') amount, never reclaimed from the queue; default 0.",
    )
    limit: (
        Annotated[float, Field(ge=0, le=MAX_AMOUNT, allow_inf_nan=False), BeforeValidator(refuse_bool)] | None
    ) = Field(
        default=None,
        description="Hard cap, including borrowed capacity; must be >= quota; default null: no cap.",
    )
    over_quota_weight: Number = Field(
        default=1.0,
        ge=0,
        le=1e6,
        description="Share of idle capacity beyond quota, relative to other queues; default 1.",
    )

    @model_validator(mode="after")
    def _limit_covers_quota(self) -> ResourceShare:
        if self.limit is not None and self.limit < self.quota:
            raise SpecError(
                "limit", self.limit, f"is below the quota ({self.quota:g}); a limit must be >= quota", ""
            )
        return self


BudgetPeriod = Literal["day", "week", "month"]
# What a used budget does to the running work of its queue tree: lets it run on (wait), or stops it (stop).
BudgetWhenSpent = Literal["wait", "stop"]
GpuHours = Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False), BeforeValidator(refuse_bool)]


class BudgetSpec(BaseModel):
    """GPU-hours a queue (with the queues below it) may use per calendar period (UTC): Slurm's
    GrpTRESMins, but renewed each period."""

    model_config = ConfigDict(extra="forbid")

    gpu_hours: GpuHours = Field(
        description="GPU-hours per period, counted as `gpupool usage` counts them (GPUs held, fractions "
        "as fractions); once used, the queue's pending work waits until the next period (required)."
    )
    period: BudgetPeriod = Field(
        default="month",
        description="day, week (from Monday) or month, in UTC; default month.",
    )
    when_spent: BudgetWhenSpent = Field(
        default="wait",
        description="What becomes of the running work of the queue and the queues below it once the budget "
        "is used: wait (it runs on, only new work waits) or stop (its work holding GPUs is stopped as "
        "`gpupool requeue` stops it, SIGTERM then SIGKILL after its grace period, and waits pending, "
        "reason budget, until the next period or a raised budget; no restart used: Slurm's GrpTRESMins); "
        "default wait.",
    )

    @model_validator(mode="before")
    @classmethod
    def _hours_given(cls, data: Any) -> Any:
        """A period or when_spent alone (`--budget-when-spent stop` on a queue with no budget) is no budget:
        said as such, not as a missing field."""
        if isinstance(data, dict) and "gpu_hours" not in data and data:
            raise SpecError(
                "budget",
                data,
                "has no gpu_hours: a budget is GPU-hours per period, and a queue with none yet needs them "
                "given too (`--budget 5000`, or 200/week, beside --budget-when-spent)",
                "{gpu_hours: 5000, when_spent: stop}",
            )
        return data


class UserLimits(BaseModel):
    """What one user's running work in a queue may hold at once (Slurm's MaxTRESPerUser and
    MaxJobsPerUser): one person cannot take all of a team's GPUs."""

    model_config = ConfigDict(extra="forbid")

    gpus: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False), BeforeValidator(refuse_bool)] | None = (
        Field(
            default=None,
            description="GPUs one user's running work in the queue may hold; default null: no cap.",
        )
    )
    workloads: Whole | None = Field(
        default=None,
        ge=1,
        description="Workloads one user may have running in the queue; default null: no cap.",
    )


class QueueResources(BaseModel):
    """A queue's share of each resource kind."""

    model_config = ConfigDict(extra="forbid")

    gpu: ResourceShare = Field(
        default_factory=ResourceShare, description="GPUs; default: quota 0, no cap, weight 1."
    )
    cpu: ResourceShare = Field(
        default_factory=ResourceShare, description="CPU cores; default: quota 0, no cap, weight 1."
    )
    memory: ResourceShare = Field(
        default_factory=ResourceShare,
        description='Memory in bytes; quota and limit accept "256GB"; default: quota 0, no cap, weight 1.',
    )

    @field_validator("memory", mode="before")
    @classmethod
    def _memory_sizes(cls, value: Any, info: ValidationInfo) -> Any:
        """Size text in memory's quota and limit ("256GB") becomes bytes."""
        field = field_name(info, "memory")
        if isinstance(value, dict):
            value = dict(value)
            for key in ("quota", "limit"):
                if isinstance(value.get(key), str):
                    value[key] = float(parse_size(value[key], f"{field}.{key}"))
        return value


class QueueSpec(BaseModel):
    """A queue (team or project): where workloads wait, and what share of the pool it deserves."""

    model_config = ConfigDict(extra="forbid")

    name: Name = Field(
        description="DNS-label-like name (1-63 lowercase letters, digits or '-'; not digits alone), e.g. nlp "
        "(required)."
    )
    parent: Name | None = Field(
        default=None,
        description="Name of the parent queue (e.g. a department); default null: a top-level queue.",
    )
    priority: Whole = Field(
        default=0,
        ge=0,
        le=MAX_QUEUE_PRIORITY,
        description="Queues of higher priority get their fair share first, 0..1000; default 0.",
    )
    resources: QueueResources = Field(
        default_factory=QueueResources,
        description="Quota, limit and weight per resource; default: none guaranteed.",
    )
    description: str = Field(default="", description="Free text for people; default empty.")
    ordering: Literal["fifo", "attained", "las", "estimate"] | None = Field(
        default=None,
        description="Order of its pending work after priority: fifo (submit time), attained (least GPU-time "
        "received first), las (Tiresias' banded attained service), estimate (shortest estimated GPU-time "
        "first); default null: the server's policy (las, in preemptive bands; docs/scheduler.md).",
    )
    min_runtime_preempt: Seconds | None = Field(
        default=None,
        description="Work in this queue runs at least this long before a higher priority may preempt it, "
        'e.g. "10m"; default null: the parent\'s, else 0.',
    )
    min_runtime_reclaim: Seconds | None = Field(
        default=None,
        description="Work in this queue runs at least this long before another queue may reclaim it, "
        'e.g. "30m"; default null: the parent\'s, else 0.',
    )
    max_priority: Whole | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="The highest priority a user may give work in this queue, at submit or by moving work "
        "here (as a Slurm QOS caps it); admins are not held to it; default null: any, 0..1000.",
    )
    user_limits: UserLimits | None = Field(
        default=None,
        description="Caps on what each user's running work in this queue and the queues below it holds, "
        "e.g. {gpus: 8, workloads: 4}; a user's work beyond them waits (reason user-limit), oldest first; "
        "default null: none.",
    )
    budget: BudgetSpec | None = Field(
        default=None,
        description="GPU-hours it and the queues below it may use per day, week or month (UTC); once "
        "used, their pending work waits (reason budget) and running work goes on, or is stopped with "
        "`when_spent: stop`; default null: no budget.",
    )

    @model_validator(mode="after")
    def _not_its_own_parent(self) -> QueueSpec:
        if self.parent is not None and self.parent == self.name:
            raise SpecError(
                "parent", self.parent, "is the queue itself; a queue cannot be its own parent", ""
            )
        return self


def parse_queue_spec(data: object) -> QueueSpec:
    """A QueueSpec from a mapping or YAML text; SpecError (the first problem, with its path) if invalid."""
    return validate_spec(QueueSpec, data, QUEUE_FIELD_EXAMPLES, "queue spec")


__all__ = [
    "QUEUE_FIELD_EXAMPLES",
    "BudgetSpec",
    "BudgetWhenSpent",
    "QueueResources",
    "QueueSpec",
    "ResourceShare",
    "UserLimits",
    "check_name",
    "parse_queue_spec",
]
