"""The sections of a workload spec: what each node needs (`resources`), `checkpoint`, `retry`, `scaling`,
the workloads it starts after (`after`), `idle`, `notify` and `placement`, each a model of its own.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpupool.spec.errors import SpecError
from gpupool.spec.fields import GpuRequestField, Seconds, SizeBytes, Whole, field_name, refuse_bool
from gpupool.spec.quantities import GpuRequest, format_duration
from gpupool.spec.replicas import MAX_REPLICAS

MAX_SCALING_WINDOW: Final = 3600.0
MAX_SCALING_DELAY: Final = 86400.0
DEPENDENCY_CONDITIONS: Final = ("succeeded", "failed", "ended", "started")
# Slurm's dependency types (sbatch --dependency=TYPE:ID), as the conditions above: `afterok:12` is taken
# as `succeeded:12`, in a spec's `after` as in `gpupool run --after`.
SLURM_DEPENDENCIES: Final = {
    "afterok": "succeeded",
    "afterany": "ended",
    "afternotok": "failed",
    "after": "started",
}
_DEPENDENCY_RE: Final = re.compile(r"\s*(?:([A-Za-z-]+)\s*:)?\s*([0-9]+)\s*")

RetryReason = Literal["failure", "preemption", "node-failure"]
DependencyCondition = Literal["succeeded", "failed", "ended", "started"]
DEFAULT_RETRY_ON: Final[tuple[RetryReason, ...]] = ("preemption", "node-failure")
# How many times a lost node (or one that could not start it) sends a job back to pending without using a
# restart from `max_restarts`: the work was not at fault, as with a preemption, but a job that takes its
# nodes down with it must not go round the whole pool (Slurm requeues a batch job after a node failure
# up to MaxBatchRequeue, 5 by default).
DEFAULT_MAX_NODE_FAILURES: Final = 5


class Resources(BaseModel):
    """What each node of the workload needs."""

    model_config = ConfigDict(extra="forbid")

    gpu: GpuRequestField = Field(
        default=GpuRequest(0),
        json_schema_extra={"default": "0"},
        description='GPUs per node: 8, "H100:8", "A100|H100:2", "80GB:1", 0.5 (of one GPU); default 0.',
    )
    cpu: Annotated[float, Field(gt=0, allow_inf_nan=False), BeforeValidator(refuse_bool)] | None = Field(
        default=None,
        description="CPU cores per node (fractions allowed); default null: no reservation.",
    )
    memory: SizeBytes | None = Field(
        default=None,
        description='Memory per node in bytes; input "256GB" or bytes; default null: no reservation.',
    )

    @field_validator("memory")
    @classmethod
    def _memory_above_zero(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value <= 0:
            raise SpecError(field_name(info, "memory"), value, "must be above 0 bytes", "")
        return value


class CheckpointSpec(BaseModel):
    """Where the workload's program saves checkpoints, so a new attempt resumes from the newest."""

    model_config = ConfigDict(extra="forbid")

    dir: str = Field(
        min_length=1,
        description="Checkpoint directory (required), given to the program as $GPUPOOL_CHECKPOINT_DIR; "
        "a relative path is relative to workdir.",
    )

    @field_validator("dir")
    @classmethod
    def _not_blank(cls, value: str, info: ValidationInfo) -> str:
        if not value.strip():
            raise SpecError(field_name(info, "dir"), value, "must not be blank", "")
        return value


class RetrySpec(BaseModel):
    """When a workload that stopped early gets a new attempt."""

    model_config = ConfigDict(extra="forbid")

    max_restarts: Whole = Field(
        default=0,
        ge=0,
        le=100,
        description="New attempts allowed after the first one ends early, 0..100; default 0.",
    )
    on: list[RetryReason] = Field(
        default_factory=lambda: list(DEFAULT_RETRY_ON),
        description="What ends an attempt early enough to retry: failure (non-zero exit), preemption, "
        "node-failure (its node was lost or could not start it); default [preemption, node-failure].",
    )
    max_node_failures: Whole = Field(
        default=DEFAULT_MAX_NODE_FAILURES,
        ge=0,
        le=100,
        description="Times a node failure sends it back to pending without using a restart, while `on` "
        "holds node-failure, 0..100; after those, a node failure uses a restart; default 5.",
    )

    @field_validator("on")
    @classmethod
    def _once_each(cls, value: list[RetryReason]) -> list[RetryReason]:
        return list(dict.fromkeys(value))


ScalingMetric = Literal["rps", "concurrency"]


class ScalingSpec(BaseModel):
    """How a service's replica count follows its load through the head's proxy (target tracking): it
    wants ceil(load / target) replicas, between min and max."""

    model_config = ConfigDict(extra="forbid")

    metric: ScalingMetric = Field(
        default="rps",
        description="What is measured at the head's proxy, over `window`: rps (requests per second) or "
        "concurrency (requests in flight, on average); default rps.",
    )
    target: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False), BeforeValidator(refuse_bool)] = Field(
        description="The load one replica should carry (required): requests per second, or requests in "
        "flight, per replica."
    )
    min: Whole = Field(
        default=1,
        ge=1,
        le=MAX_REPLICAS,
        description="Fewest replicas, 1..64 (or replicas: MIN..MAX); default 1.",
    )
    max: Whole = Field(
        default=1,
        ge=1,
        le=MAX_REPLICAS,
        description="Most replicas, 1..64 (or replicas: MIN..MAX); default 1.",
    )
    window: Seconds = Field(
        default=60.0, description="How far back the load is averaged, 1s..1h; default 60s."
    )
    scale_up_delay: Seconds = Field(
        default=30.0,
        description="Time since the last change of the replica count before adding replicas, 0..24h; "
        "default 30s.",
    )
    scale_down_delay: Seconds = Field(
        default=300.0,
        description="How long the load must have wanted fewer replicas before removing some (down to the "
        "most wanted in that time), 0..24h; default 5m.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> ScalingSpec:
        if self.min > self.max:
            raise SpecError("scaling.max", self.max, f"is below scaling.min ({self.min})", str(self.min))
        if not 1.0 <= self.window <= MAX_SCALING_WINDOW:
            raise SpecError("scaling.window", format_duration(self.window), "must be 1s..1h", "60s")
        for name, value in (
            ("scale_up_delay", self.scale_up_delay),
            ("scale_down_delay", self.scale_down_delay),
        ):
            if value > MAX_SCALING_DELAY:
                raise SpecError(f"scaling.{name}", format_duration(value), "must be at most 24h", "5m")
        return self


class DependencySpec(BaseModel):
    """A workload this one starts after, and what that one must have done first (Slurm's --dependency).
    Written in full or short: 12 (it succeeded), "ended:12", {workload: 12, when: ended}; Slurm's types
    are taken for the conditions ("afterany:12")."""

    model_config = ConfigDict(extra="forbid")

    workload: Whole = Field(ge=1, description="The workload's id, as `gpupool ps` shows it (required).")
    when: DependencyCondition = Field(
        default="succeeded",
        description="succeeded: it ended with success (Slurm's afterok); failed: it failed (afternotok); "
        "ended: it succeeded, failed or was cancelled (afterany); started: it began running (after); "
        "default succeeded.",
    )

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        if isinstance(data, bool):
            raise SpecError("workload", data, "is true/false, not a workload id", "12")
        if isinstance(data, int):
            return {"workload": data}
        if isinstance(data, str):
            match = _DEPENDENCY_RE.fullmatch(data)
            if match is None:
                raise SpecError("workload", data, "is not a workload id, or WHEN:ID", "12, or ended:12")
            when, number = match.groups()
            when = SLURM_DEPENDENCIES.get(when.lower(), when.lower()) if when else None
            return {"workload": int(number)} | ({"when": when} if when else {})
        if isinstance(data, dict) and isinstance(data.get("when"), str):
            return {**data, "when": SLURM_DEPENDENCIES.get(data["when"].lower(), data["when"])}
        return data


IdleAction = Literal["hold", "cancel"]
MIN_IDLE_TIMEOUT: Final = 10.0
MAX_IDLE_TIMEOUT: Final = 30 * 86400.0


class IdleSpec(BaseModel):
    """What happens to running work whose GPUs all sit idle this long (Run:ai's idle GPU timeout, dstack's
    idle_duration): a notebook left holding GPUs over a weekend gives them back."""

    model_config = ConfigDict(extra="forbid")

    timeout: Seconds = Field(
        description="How long every GPU it holds must stay below `utilization` before the action, 10s..30d "
        "(required), e.g. 2h."
    )
    action: IdleAction = Field(
        default="hold",
        description="hold: stop it (SIGTERM, then SIGKILL after its grace period) and keep it pending until "
        "`gpupool release`, when it resumes from its checkpoint; cancel: stop it and end it; default hold.",
    )
    utilization: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False), BeforeValidator(refuse_bool)] = (
        Field(
            default=1.0,
            description="A GPU below this utilization (percent, as NVML gives it) counts as idle; default 1.",
        )
    )

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        """`idle: 2h` is `idle: {timeout: 2h}`."""
        return (
            {"timeout": data} if isinstance(data, str | int | float) and not isinstance(data, bool) else data
        )

    @model_validator(mode="after")
    def _bounds(self) -> IdleSpec:
        if not MIN_IDLE_TIMEOUT <= self.timeout <= MAX_IDLE_TIMEOUT:
            raise SpecError(
                "idle.timeout",
                format_duration(self.timeout),
                "must be 10s..30d",
                "2h",
            )
        return self


NotifyOn = Literal["started", "succeeded", "failed", "cancelled"]
NOTIFY_ENDS: Final[tuple[NotifyOn, ...]] = ("succeeded", "failed", "cancelled")
MAX_URL: Final = 2000
MIN_SECRET, MAX_SECRET = 16, 256


class NotifySpec(BaseModel):
    """Where the head POSTs a JSON message when the workload starts or ends (Slurm's --mail-type), e.g. a
    chat channel's incoming webhook (control/notify.py)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        max_length=MAX_URL,
        description="An http(s) URL; the head's operator allows its host (`gpupool server --notify-hosts`) "
        "(required).",
    )
    on: list[NotifyOn] = Field(
        default_factory=lambda: list(NOTIFY_ENDS),
        min_length=1,
        description="When: started (each attempt that starts), succeeded, failed, cancelled; default "
        "[succeeded, failed, cancelled].",
    )

    secret: str | None = Field(
        default=None,
        description="A shared secret, 16 to 256 characters without spaces: each message is then signed "
        "(`X-Gpupool-Signature-256`, an HMAC-SHA256 of the timestamp and the body), so its receiver can "
        "tell it came from this head; never shown back by the API.",
    )

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        """`notify: URL` is `notify: {url: URL}`."""
        return {"url": data} if isinstance(data, str) else data

    @field_validator("secret")
    @classmethod
    def _usable_secret(cls, value: str | None) -> str | None:
        if value is not None and not (
            MIN_SECRET <= len(value) <= MAX_SECRET and all(c.isprintable() and not c.isspace() for c in value)
        ):
            raise SpecError(
                "secret",
                "(hidden)",
                f"must be {MIN_SECRET} to {MAX_SECRET} printable characters without spaces",
                "a random string, e.g. from `openssl rand -hex 32`",
            )
        return value

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or any(c.isspace() or not c.isprintable() for c in value)
        ):
            raise SpecError(
                "url",
                value,
                "is not an http or https URL with a host",
                "https://hooks.slack.com/services/T000/B000/XXXX",
            )
        return value

    @field_validator("on")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        for index, kind in enumerate(value):
            if kind in value[:index]:
                raise SpecError(
                    f"on[{index}]", kind, "is listed twice: list each once", "[failed, succeeded]"
                )
        return value


class PlacementSpec(BaseModel):
    """Where the workload may run, and how its pods are grouped."""

    model_config = ConfigDict(extra="forbid")

    nodes: list[str] = Field(
        default_factory=list,
        description="Only these nodes, by the names `gpupool nodes` shows (like Slurm's --nodelist); "
        "default [] = any node.",
    )
    topology: str | None = Field(
        default=None,
        description="A node label every pod of the gang must share, e.g. rack; default null: none.",
    )
    topology_preferred: str | None = Field(
        default=None,
        description="A node label the pods should share when they can, e.g. zone; default null: none.",
    )

    @field_validator("nodes")
    @classmethod
    def _node_names(cls, value: list[str], info: ValidationInfo) -> list[str]:
        field = field_name(info, "nodes")
        for index, name in enumerate(value):
            if not name.strip() or any(c.isspace() for c in name):
                raise SpecError(f"{field}[{index}]", name, "is not a node name (no blanks)", "node-3")
        duplicates = sorted({n for n in value if value.count(n) > 1})
        if duplicates:
            raise SpecError(field, value, f"names {', '.join(duplicates)} more than once", "[node-3, node-4]")
        return value

    @field_validator("topology", "topology_preferred")
    @classmethod
    def _label(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and (not value.strip() or any(c.isspace() for c in value)):
            raise SpecError(field_name(info, str(info.field_name)), value, "is not a node label name", "rack")
        return value


__all__ = [
    "CheckpointSpec",
    "PlacementSpec",
    "Resources",
    "RetrySpec",
    "ScalingSpec",
]
