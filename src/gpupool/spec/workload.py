"""The workload spec: what a user submits to run a job or a service on the pool.

Priority (Run:ai semantics): a named class or a number 0..1000, higher runs first and may preempt lower.
The classes are inference (125) > build (100) > interactive (75) > train (50, the default). A workload is
preemptible by default when its priority is at most train's (50): "train" and any number <= 50 are
preemptible; "inference", "build", "interactive" and any number above 50 are not. `preemptible:` overrides.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gpupool.spec.document import validate_spec
from gpupool.spec.errors import MISSING, SpecError
from gpupool.spec.fields import GpuRequestField, Name, Seconds, SizeBytes, Whole, field_name, refuse_bool
from gpupool.spec.quantities import GpuRequest, format_duration

PRIORITY_CLASSES: Final[dict[str, int]] = {"inference": 125, "build": 100, "interactive": 75, "train": 50}
"""Named priority classes and their numbers; higher runs first."""

DEFAULT_PRIORITY_CLASS: Final = "train"
MAX_PRIORITY: Final = 1000
PREEMPTIBLE_AT_OR_BELOW: Final = PRIORITY_CLASSES["train"]
"""A workload whose priority is at most this is preemptible unless its spec says otherwise."""
NON_PREEMPTIBLE_BY_DEFAULT: Final = frozenset(
    name for name, value in PRIORITY_CLASSES.items() if value > PREEMPTIBLE_AT_OR_BELOW
)
"""The classes that are not preemptible unless the spec says so: inference, build, interactive."""

RESERVED_ENV_PREFIX: Final = "GPUPOOL_"
RESERVED_ENV_NAMES: Final = frozenset(
    {"CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK"}
)
"""Set by gpupool for every attempt (the job contract, DESIGN.md); a spec may not set them."""

MAX_NODES: Final = 1024
MAX_REPLICAS: Final = 64
MAX_GRACE_PERIOD: Final = 3600.0
MAX_SCALING_WINDOW: Final = 3600.0
MAX_SCALING_DELAY: Final = 86400.0
RANGE: Final = re.compile(r"\s*([0-9]+)\s*\.\.\s*([0-9]+)\s*")
MAX_PROBE_PATH: Final = 2000
MAX_DEPENDENCIES: Final = 100
MAX_ARRAY_TASKS: Final = 1000  # Slurm's MaxArraySize is 1001 by default
MAX_ARRAY_INDEX: Final = 1_000_000
_ARRAY_PART_RE: Final = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
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
_ENV_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_SECRETS: Final = 64
MAX_ENV_NAME: Final = 128

FIELD_EXAMPLES: Final[dict[str, str]] = {
    "": "{kind: job, commands: [python train.py]}",
    "kind": "job",
    "name": "llama-finetune",
    "queue": "nlp",
    "priority": "train (or inference, build, interactive, or a number 0..1000)",
    "priority_class": "train",
    "preemptible": "true",
    "nodes": "2",
    "resources": "{gpu: 'H100:8', cpu: 32, memory: 256GB}",
    "resources.gpu": "'H100:8'",
    "resources.cpu": "32",
    "resources.memory": "256GB",
    "commands": "['python train.py']",
    "env": "{HF_HOME: /data/hf, NCCL_DEBUG: INFO}",
    "workdir": "/home/me/project",
    "checkpoint": "{dir: ./ckpt}",
    "checkpoint.dir": "./ckpt",
    "retry": "{max_restarts: 3, on: [preemption, node-failure]}",
    "retry.max_restarts": "3",
    "retry.on": "[preemption, node-failure]",
    "retry.max_node_failures": "5",
    "max_duration": "12h",
    "grace_period": "30s",
    "placement": "{nodes: [node-3], topology: rack}",
    "readiness_probe": "/health",
    "access": "private (or pool, public)",
    "replicas": "2 (or a range to scale by load, 1..4, with scaling)",
    "scaling": "{metric: rps, target: 10}",
    "scaling.metric": "rps (or concurrency)",
    "scaling.target": "10",
    "scaling.min": "1",
    "scaling.max": "4",
    "scaling.window": "60s",
    "scaling.scale_up_delay": "30s",
    "scaling.scale_down_delay": "5m",
    "idle": "{timeout: 2h, action: hold} (or 2h)",
    "notify": "{url: 'https://hooks.slack.com/services/T000/B000/XXXX', on: [failed, succeeded]}",
    "notify.url": "https://hooks.slack.com/services/T000/B000/XXXX",
    "notify.on": "[started, succeeded, failed, cancelled]",
    "notify.secret": "a random string of 16 to 256 characters, e.g. from `openssl rand -hex 32`",
    "secrets": "[HF_TOKEN, WANDB_API_KEY] (made with `gpupool secret set NAME`)",
    "idle.timeout": "2h",
    "idle.action": "hold (or cancel)",
    "idle.utilization": "1",
    "array": "0-15%4 (or 1,3,5-9, or 0-99:10)",
    "after": "[12, ended:13] (or [{workload: 12, when: succeeded}], or Slurm's afterany:13)",
    "after.workload": "12",
    "after.when": "succeeded (or failed, ended, started)",
    "placement.nodes": "[node-3, node-4]",
    "placement.topology": "rack",
    "placement.topology_preferred": "zone",
}
"""A valid example for each field path, shown in every error about that field."""

RetryReason = Literal["failure", "preemption", "node-failure"]
DependencyCondition = Literal["succeeded", "failed", "ended", "started"]
DEFAULT_RETRY_ON: Final[tuple[RetryReason, ...]] = ("preemption", "node-failure")
# How many times a lost node (or one that could not start it) sends a job back to pending without using a
# restart from `max_restarts`: the work was not at fault, as with a preemption, but a job that takes its
# nodes down with it must not go round the whole pool (Slurm requeues a batch job after a node failure
# up to MaxBatchRequeue, 5 by default).
DEFAULT_MAX_NODE_FAILURES: Final = 5


class ArrayRange:
    """A job array's task indices and how many of its tasks may run at once (Slurm's --array)."""

    __slots__ = ("indices", "limit")

    def __init__(self, indices: tuple[int, ...], limit: int | None) -> None:
        self.indices = indices  # ascending, each once
        self.limit = limit  # None: no limit

    def text(self) -> str:
        """The canonical form: runs of consecutive indices as A-B, joined by commas, then %LIMIT."""
        parts: list[str] = []
        start = prev = self.indices[0]
        for index in (*self.indices[1:], None):
            if index is not None and index == prev + 1:
                prev = index
                continue
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            if index is not None:
                start = prev = index
        return ",".join(parts) + (f"%{self.limit}" if self.limit is not None else "")


def parse_array(value: object, field: str = "array") -> ArrayRange:
    """Slurm's --array notation: "0-15", "1,3,5-9", "0-99:10" (every 10th), each with an optional "%4"
    (at most 4 tasks running at once)."""
    example = "0-15%4"
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise SpecError(field, value, "is not an array of task indices", example)
    text = str(value).replace(" ", "")
    spec, sep, limit_text = text.partition("%")
    limit: int | None = None
    if sep:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise SpecError(field, value, "has a limit after % that is not a whole number >= 1", example)
        limit = int(limit_text)
    indices: set[int] = set()
    parts = spec.split(",")
    for part in parts:
        # the part at fault, named where the value has several ("0-3,5-1"); a value of one is the part
        named = f"has {part!r}, which is" if len(parts) > 1 else "is"
        match = _ARRAY_PART_RE.fullmatch(part)
        if match is None:
            raise SpecError(field, value, f"{named} not N, N-M or N-M:STEP (task indices)", example)
        first, last, step = match.groups()
        low, high = int(first), int(last if last is not None else first)
        stride = int(step) if step is not None else 1
        if high < low or stride < 1:
            raise SpecError(field, value, f"{named} not a range N-M with N <= M and a step >= 1", example)
        if high > MAX_ARRAY_INDEX:
            raise SpecError(field, value, f"has an index above {MAX_ARRAY_INDEX}", example)
        if (high - low) // stride + 1 > MAX_ARRAY_TASKS:  # checked before the range is made
            raise SpecError(field, value, f"has more than {MAX_ARRAY_TASKS} tasks", "0-999%50")
        indices.update(range(low, high + 1, stride))
        if len(indices) > MAX_ARRAY_TASKS:
            raise SpecError(field, value, f"has more than {MAX_ARRAY_TASKS} tasks", "0-999%50")
    return ArrayRange(tuple(sorted(indices)), limit)


def array_limit(stored: str) -> int | None:
    """The %N of an array as a spec stores it (`ArrayRange.text`), without making its indices."""
    _, sep, limit = stored.rpartition("%")
    return int(limit) if sep else None


def priority_class_of(priority: str) -> str | None:
    """The canonical class name for a name given in any case (" Train " -> "train"), or None."""
    name = priority.strip().lower()
    return name if name in PRIORITY_CLASSES else None


def default_preemptible(priority: int) -> bool:
    """Whether a workload of this priority is preemptible when its spec does not say."""
    return priority <= PREEMPTIBLE_AT_OR_BELOW


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
# Who may reach a service through the head's proxy: its owner and admins, any token of the head, or anyone.
ServiceAccess = Literal["private", "pool", "public"]
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


class WorkloadSpec(BaseModel):
    """A job (runs to completion) or a service (runs until stopped), as a user submits it."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["job", "service"] = Field(
        default="job",
        description="job: runs to completion; service: runs until cancelled, started again whenever it "
        "exits (after a backoff when it exits soon after starting); default job.",
    )
    name: Name | None = Field(
        default=None,
        description="DNS-label-like name (1-63 lowercase letters, digits or '-'; not digits alone, which the "
        "command line reads as an id), e.g. llama-finetune; default null: the server names it.",
    )
    queue: Name = Field(
        default="default",
        description="The queue (team or project) it runs in; default 'default', or the submitting token's "
        "queue when the token is for one queue only.",
    )
    priority: Annotated[
        Whole,
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "integer", "minimum": 0, "maximum": MAX_PRIORITY},
                    {"type": "string", "enum": list(PRIORITY_CLASSES)},
                ]
            },
            mode="validation",
        ),
    ] = Field(
        default=PRIORITY_CLASSES[DEFAULT_PRIORITY_CLASS],
        ge=0,
        le=MAX_PRIORITY,
        description="Priority 0..1000, given as a number or a class name "
        "(inference 125, build 100, interactive 75, train 50); default train.",
    )
    priority_class: str | None = Field(
        default=None,
        description="The class name when priority was given by name (or by default); null when given as a "
        "number. Derived; if given, must agree with priority.",
    )
    preemptible: bool = Field(
        default=True,
        description="Whether the scheduler may stop it for higher-priority work or to restore fair share; "
        "default: true when priority <= 50 (train), else false.",
    )
    nodes: Whole = Field(
        default=1,
        ge=1,
        le=MAX_NODES,
        description="Nodes in the gang, placed all or nothing, 1..1024; default 1.",
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="What each node needs; default: no GPUs, no CPU/memory reservation.",
    )
    commands: list[str] = Field(
        min_length=1,
        description="Shell commands run in order (required, at least one); a single string is one command.",
    )
    env: Annotated[
        dict[str, str],
        WithJsonSchema(
            {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}},
            mode="validation",
        ),
    ] = Field(
        default_factory=dict,
        description="Extra environment variables; numbers and booleans become text; GPUPOOL_* and the "
        "job-contract names are reserved; default none.",
    )
    secrets: list[str] = Field(
        default_factory=list,
        max_length=MAX_SECRETS,
        description="Names of the submitter's secrets (`gpupool secret set NAME`) to put in the environment "
        "under the same names, read when each attempt starts; the spec holds the names only; default none.",
    )
    workdir: str | None = Field(
        default=None,
        min_length=1,
        description="Directory the commands run in; default null: chosen by server/CLI.",
    )
    checkpoint: CheckpointSpec | None = Field(
        default=None,
        description="Checkpoint directory for resume after preemption or node loss; default null: none.",
    )
    retry: RetrySpec = Field(
        default_factory=RetrySpec,
        description="Retry policy; default: no restart after a failure; back to pending after a preemption, "
        "and after up to 5 node failures.",
    )
    max_duration: Seconds | None = Field(
        default=None,
        description='Longest an attempt may run, e.g. "12h", "1h30m", or seconds; default null: no limit.',
    )
    grace_period: Seconds = Field(
        default=30.0,
        description="Seconds between SIGTERM and SIGKILL when stopping, 0..3600 (input like max_duration); "
        "default 30s.",
    )
    placement: PlacementSpec = Field(
        default_factory=PlacementSpec,
        description="Where it may run: named nodes, a topology domain its gang must (or should) share; "
        "default: anywhere.",
    )
    readiness_probe: str | None = Field(
        default=None,
        max_length=MAX_PROBE_PATH,
        description="Services only: a path the head asks for (GET) on the service's port every 2 s; the "
        "head's proxy passes requests on only while it answers 2xx or 3xx, e.g. /health; default null: "
        "no probe (requests pass as soon as the service runs).",
    )
    access: ServiceAccess | None = Field(
        default=None,
        description="Services only: who may reach it through the head's proxy (HTTP, WebSocket, `gpupool "
        "forward`): private, its owner and admins; pool, anyone with a token of this head (a viewer's "
        "only reads); public, anyone, with no token; default null: private.",
    )
    replicas: Whole = Field(
        default=1,
        ge=1,
        le=MAX_REPLICAS,
        description="Services only: copies run at once, 1..64, each scheduled on its own GPUs (on nodes "
        "of their own where there is room) and started again on its own; the head's proxy spreads "
        "requests over the ready ones (round robin); change it with `gpupool scale`; default 1. A range "
        "MIN..MAX (with `scaling`) lets the head add and remove replicas by load, starting at MIN.",
    )
    scaling: ScalingSpec | None = Field(
        default=None,
        description="Services only: follow the load through the head's proxy between scaling.min and "
        "scaling.max replicas (also given as replicas: MIN..MAX), e.g. {metric: rps, target: 10}; "
        "default null: the replica count changes only with `gpupool scale`.",
    )
    notify: NotifySpec | None = Field(
        default=None,
        description="POST a JSON message to this URL when it starts or ends, e.g. {url: https://hooks.example"
        "/x, on: [failed]} or just the URL (succeeded, failed, cancelled); default null: none.",
    )
    idle: IdleSpec | None = Field(
        default=None,
        description="Stop it once every GPU it holds has been idle this long, e.g. {timeout: 2h, action: "
        "hold} or just 2h: hold keeps it pending until `gpupool release`, cancel ends it; needs GPUs; "
        "default null: never.",
    )
    array: str | None = Field(
        default=None,
        description="Jobs only: run it as an array of tasks, one workload each, in Slurm's --array "
        "notation: indices 0-15, 1,3,5-9 or 0-99:10 (every 10th), and %N for at most N running at once, "
        "e.g. 0-15%4; each task sees GPUPOOL_ARRAY_INDEX; at most 1000 tasks; default null: one job.",
    )
    after: list[DependencySpec] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description="Workloads this one waits for before it may start, e.g. [12, ended:13]: each an id "
        "(it must succeed) or WHEN:ID with WHEN succeeded, failed, ended or started; it waits pending "
        "(reason dependency) and is cancelled once one of them can no longer do what it waits for; "
        "at most 100; default []: none.",
    )

    @model_validator(mode="before")
    @classmethod
    def _resolve_priority(cls, data: Any) -> Any:
        """Turn a priority class name into its number and record the class; null preemptible: derive it."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        given_class = data.get("priority_class")
        if given_class is not None:
            if not isinstance(given_class, str) or priority_class_of(given_class) is None:
                raise _unknown_class("priority_class", given_class)
            given_class = priority_class_of(given_class)
            data["priority_class"] = given_class
        priority = data.get("priority")
        if priority is None:
            priority = given_class or DEFAULT_PRIORITY_CLASS
        if isinstance(priority, str) and not re.fullmatch(r"\s*[-+]?[0-9]+\s*", priority):
            name = priority_class_of(priority)
            if name is None:
                raise _unknown_class("priority", priority)
            if given_class is not None and given_class != name:
                raise _class_mismatch(given_class, priority)
            data["priority"] = PRIORITY_CLASSES[name]
            data["priority_class"] = name
        else:
            data["priority"] = priority
            if given_class is not None and PRIORITY_CLASSES[given_class] != _as_number(priority):
                raise _class_mismatch(given_class, priority)
        if data.get("preemptible") is None:
            data.pop("preemptible", None)
        return _replica_range(data)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> WorkloadSpec:
        if "preemptible" not in self.model_fields_set:
            self.preemptible = default_preemptible(self.priority)
        gpu = self.resources.gpu
        if gpu.is_fractional and self.nodes > 1:
            raise SpecError(
                "resources.gpu",
                str(gpu),
                f"is a fraction of one GPU, which only works on a single node (nodes is {self.nodes})",
                "'1' with nodes: 2, or nodes: 1",
            )
        for index, name in enumerate(self.secrets):
            if name in self.env:
                raise SpecError(
                    f"secrets[{index}]",
                    name,
                    "is also set in env: the secret would replace it; keep one of them",
                    "",
                )
        named = self.placement.nodes
        if named and len(named) < self.nodes:
            raise SpecError(
                "placement.nodes",
                named,
                f"lists {len(named)} node(s) but the gang needs {self.nodes} (one pod per node)",
                f"{self.nodes} names, or nodes: {len(named)}",
            )
        if self.kind == "service" and self.retry != RetrySpec():  # the default is what a dump gives back
            raise SpecError(
                "retry",
                self.retry.model_dump(),
                "applies to jobs only (a service starts again whenever it stops, with no limit): remove "
                "it, or use kind: job",
                "{kind: service, commands: [python serve.py]}",
            )
        if self.kind != "service" and self.readiness_probe is not None:
            raise SpecError(
                "readiness_probe",
                self.readiness_probe,
                "applies to services only (a job is not reached through the head's proxy): remove it, or "
                "use kind: service",
                "{kind: service, readiness_probe: /health, commands: [python serve.py]}",
            )
        if self.kind != "service" and self.access is not None:
            raise SpecError(
                "access",
                self.access,
                "applies to services only (a job is not reached through the head's proxy): remove it, or "
                "use kind: service",
                "{kind: service, access: pool, commands: [python serve.py]}",
            )
        if self.kind != "service" and self.replicas != 1:
            raise SpecError(
                "replicas",
                self.replicas,
                "applies to services only (a job runs once; for several copies submit several jobs, or "
                "one gang with nodes): remove it, or use kind: service",
                "{kind: service, replicas: 2, commands: [python serve.py]}",
            )
        if self.kind == "service" and self.array is not None:
            raise SpecError(
                "array",
                self.array,
                "applies to jobs only (a service has replicas instead): remove it, or use kind: job",
                "{kind: job, array: 0-15%4, commands: [python sweep.py]}",
            )
        scaling = self.scaling
        if scaling is not None:
            if self.kind != "service":
                raise SpecError(
                    "scaling",
                    scaling.model_dump(),
                    "applies to services only (a job is not reached through the head's proxy): remove it, "
                    "or use kind: service",
                    "{kind: service, replicas: 1..4, scaling: {metric: rps, target: 10}}",
                )
            if not scaling.min <= self.replicas <= scaling.max:
                raise SpecError(
                    "replicas",
                    self.replicas,
                    f"is outside scaling's range {scaling.min}..{scaling.max}: start within it",
                    f"{scaling.min}..{scaling.max}",
                )
        if self.idle is not None and gpu.count <= 0:
            raise SpecError(
                "idle",
                MISSING,  # the whole setting is at fault, not one of its values
                "needs GPUs to watch, and this workload asks for none: remove it, or ask for GPUs",
                "{resources: {gpu: 1}, idle: 2h}",
            )
        if self.max_duration is not None and self.max_duration <= 0:
            raise SpecError("max_duration", self.max_duration, "must be longer than 0 seconds", "")
        if self.grace_period > MAX_GRACE_PERIOD:
            raise SpecError(
                "grace_period",
                format_duration(self.grace_period),
                f"is too long: at most {format_duration(MAX_GRACE_PERIOD)}",
                "",
            )
        return self

    @field_validator("array", mode="before")
    @classmethod
    def _array(cls, value: Any, info: ValidationInfo) -> Any:
        return None if value is None else parse_array(value, field_name(info, "array")).text()

    @field_validator("after", mode="before")
    @classmethod
    def _one_dependency(cls, value: Any) -> Any:
        return [value] if isinstance(value, int | str) and not isinstance(value, bool) else value

    @field_validator("after")
    @classmethod
    def _after_each_once(cls, value: list[DependencySpec], info: ValidationInfo) -> list[DependencySpec]:
        seen: dict[int, int] = {}
        for index, dependency in enumerate(value):
            first = seen.setdefault(dependency.workload, index)
            if first != index:
                raise SpecError(
                    f"{field_name(info, 'after')}[{index}]",
                    dependency.workload,
                    f"is already listed at after[{first}]: list each workload once, with one condition",
                    "[12, ended:13]",
                )
        return value

    @field_validator("readiness_probe")
    @classmethod
    def _probe_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and (
            not value.startswith("/") or any(c.isspace() or not c.isprintable() for c in value)
        ):
            raise SpecError(
                field_name(info, "readiness_probe"),
                value,
                "is not a path to ask the service for: it starts with / and holds no spaces",
                "/health",
            )
        return value

    @field_validator("commands", mode="before", json_schema_input_type=str | list[str])
    @classmethod
    def _commands(cls, value: Any, info: ValidationInfo) -> Any:
        field = field_name(info, "commands")
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            for index, command in enumerate(value):
                if isinstance(command, bool | int | float):
                    # `commands: [true]` means the shell's `true`, but YAML reads it as a boolean.
                    kind = "a boolean" if isinstance(command, bool) else "a number"
                    raise SpecError(
                        f"{field}[{index}]",
                        command,
                        f"is {kind}, not a command: quote it in YAML",
                        "['true']",
                    )
                if isinstance(command, str) and not command.strip():
                    raise SpecError(f"{field}[{index}]", command, "is an empty command", "")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any, info: ValidationInfo) -> Any:
        field = field_name(info, "env")
        if not isinstance(value, dict):
            return value  # pydantic reports "is not a mapping"
        env: dict[str, str] = {}
        for key, raw in value.items():
            if not isinstance(key, str) or not _ENV_NAME_RE.fullmatch(key):
                raise SpecError(
                    field,
                    key,
                    "is not an environment variable name (letters, digits, '_'; not a digit first)",
                    "",
                )
            check_env_name(key, f"{field}.{key}")
            env[key] = _env_text(raw, f"{field}.{key}")
        return env

    @field_validator("secrets", mode="before")
    @classmethod
    def _secret_names(cls, value: Any, info: ValidationInfo) -> Any:
        field = field_name(info, "secrets")
        if isinstance(value, str):
            value = [value]  # `secrets: HF_TOKEN`
        if not isinstance(value, list):
            return value  # pydantic reports "is not a list"
        seen: set[str] = set()
        for index, name in enumerate(value):
            check_env_name(name, f"{field}[{index}]")
            if name in seen:
                raise SpecError(f"{field}[{index}]", name, "is named twice", "")
            seen.add(name)
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir_not_blank(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not value.strip():
            raise SpecError(field_name(info, "workdir"), value, "must not be blank", "")
        return value

    @field_validator("checkpoint", mode="before", json_schema_input_type=str | CheckpointSpec | None)
    @classmethod
    def _checkpoint_shorthand(cls, value: Any) -> Any:
        return {"dir": value} if isinstance(value, str) else value  # `checkpoint: ./ckpt`


def _as_number(priority: object) -> object:
    if isinstance(priority, str):
        return int(priority)
    return priority


def check_env_name(name: object, field: str) -> str:
    """Refuse (SpecError naming `field`) what cannot be an environment variable's name a spec sets: not a
    name, or one the job contract reserves."""
    if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name) or len(name) > MAX_ENV_NAME:
        raise SpecError(
            field,
            name,
            f"is not an environment variable name (letters, digits, '_'; not a digit first; at most "
            f"{MAX_ENV_NAME})",
            "HF_TOKEN",
        )
    if name.startswith(RESERVED_ENV_PREFIX) or name in RESERVED_ENV_NAMES:
        raise SpecError(field, name, "is reserved: gpupool sets it for every attempt (the job contract)", "")
    return name


def _env_text(value: object, field: str) -> str:
    """An env value as text: booleans as true/false, numbers as written by Python."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    raise SpecError(
        field, value, "is not a text, number or boolean value", "'1' (quote it to keep it as written)"
    )


def _replica_range(data: dict[str, Any]) -> dict[str, Any]:
    """`replicas: MIN..MAX` (dstack's notation) as `replicas: MIN` with `scaling.min` and `scaling.max`; a
    range needs `scaling` (what to follow), and `scaling` needs a range (or its own min and max)."""
    replicas = data.get("replicas")
    scaling = data.get("scaling")
    found = RANGE.fullmatch(replicas) if isinstance(replicas, str) else None
    if found is None:
        if not isinstance(scaling, dict):
            return data
        if "min" not in scaling and "max" not in scaling:
            raise SpecError(
                "replicas",
                replicas if replicas is not None else 1,
                "is one number, but scaling needs a range to scale in: give replicas as MIN..MAX (or "
                "scaling.min and scaling.max)",
                "1..4",
            )
        for bound, other in (("min", "max"), ("max", "min")):
            if bound not in scaling:
                raise SpecError(
                    f"scaling.{bound}",
                    MISSING,
                    f"is required with scaling.{other}",
                    "4" if bound == "max" else "1",
                )
        return data if replicas is not None else {**data, "replicas": scaling["min"]}
    low, high = int(found.group(1)), int(found.group(2))
    given = f"{low}..{high}"
    if low < 1 or high > MAX_REPLICAS or low > high:
        raise SpecError(
            "replicas",
            replicas,
            f"is not a range of replica counts MIN..MAX with 1 <= MIN <= MAX <= {MAX_REPLICAS}",
            "1..4",
        )
    if scaling is None:
        raise SpecError(
            "scaling",
            MISSING,
            f"is required: replicas {given} is a range, so say what load to follow",
            "{metric: rps, target: 10}",
        )
    if not isinstance(scaling, dict):
        return data  # the model says what is wrong with it
    for bound, value in (("min", low), ("max", high)):
        if bound in scaling and scaling[bound] != value:
            raise SpecError(
                f"scaling.{bound}",
                scaling[bound],
                f"disagrees with replicas: {given}; give the range once",
                str(value),
            )
    return {**data, "replicas": low, "scaling": {**scaling, "min": low, "max": high}}


def _unknown_class(field: str, value: object) -> SpecError:
    close = difflib.get_close_matches(str(value).strip().lower(), list(PRIORITY_CLASSES), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    names = ", ".join(PRIORITY_CLASSES)
    return SpecError(field, value, f"is not a priority class ({names}) or a number 0..1000{hint}", "train")


def _class_mismatch(given_class: str, priority: object) -> SpecError:
    return SpecError(
        "priority_class",
        given_class,
        f"does not match priority {priority!r} (it is derived from priority; leave it out)",
        "priority: train with no priority_class",
    )


def parse_workload_spec(data: object) -> WorkloadSpec:
    """A WorkloadSpec from a mapping or YAML text; SpecError (the first problem, with its path) if invalid."""
    return validate_spec(WorkloadSpec, data, FIELD_EXAMPLES, "workload spec")


__all__ = [
    "FIELD_EXAMPLES",
    "NON_PREEMPTIBLE_BY_DEFAULT",
    "PREEMPTIBLE_AT_OR_BELOW",
    "PRIORITY_CLASSES",
    "CheckpointSpec",
    "PlacementSpec",
    "Resources",
    "RetrySpec",
    "ScalingSpec",
    "WorkloadSpec",
    "default_preemptible",
    "parse_workload_spec",
    "priority_class_of",
]
