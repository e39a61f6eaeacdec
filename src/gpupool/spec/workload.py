"""The workload spec: what a user submits to run a job or a service on the pool.

Its parts have modules of their own: the sections (resources, retry, scaling, ...) in sections.py, the
priority classes in priority.py, job arrays in arrays.py, replica ranges in replicas.py.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gpupool.spec.arrays import parse_array
from gpupool.spec.document import validate_spec
from gpupool.spec.errors import MISSING, SpecError
from gpupool.spec.fields import Name, Seconds, Whole, field_name
from gpupool.spec.priority import (
    DEFAULT_PRIORITY_CLASS,
    MAX_PRIORITY,
    PRIORITY_CLASSES,
    default_preemptible,
    priority_class_of,
)
from gpupool.spec.quantities import format_duration
from gpupool.spec.replicas import MAX_REPLICAS, replica_range
from gpupool.spec.sections import (
    CheckpointSpec,
    DependencySpec,
    IdleSpec,
    NotifySpec,
    PlacementSpec,
    Resources,
    RetrySpec,
    ScalingSpec,
)

RESERVED_ENV_PREFIX: Final = "GPUPOOL_"
RESERVED_ENV_NAMES: Final = frozenset(
    {"CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK"}
)
"""Set by gpupool for every attempt (the job contract, DESIGN.md); a spec may not set them."""

MAX_NODES: Final = 1024
MAX_GRACE_PERIOD: Final = 3600.0
MAX_PROBE_PATH: Final = 2000
MAX_DEPENDENCIES: Final = 100
_ENV_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_SECRETS: Final = 64
MAX_ENV_NAME: Final = 128
# Who may reach a service through the head's proxy: its owner and admins, any token of the head, or anyone.
ServiceAccess = Literal["private", "pool", "public"]

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
        return replica_range(data)

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
                self.retry.model_dump(exclude_unset=True),
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
    "WorkloadSpec",
    "parse_workload_spec",
]
