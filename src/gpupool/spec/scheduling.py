"""The scheduling policy: gpupool's default, how an operator changes it, and how it reaches the scheduler.

`DEFAULT_POLICY` is the one definition of the default policy: the server runs it (unless
`$GPUPOOL_HOME/scheduling.yaml` changes it, see `SchedulingSpec`) and the simulator's `gpupool` policy is
this very object, so what docs/benchmarks.md measures is what a server runs. It is the product's default
actions (quotas, fair share by water-filling, reclaim, consolidation, preemption) with, inside each queue,
least attained GPU-service first in bands (Tiresias' discretized LAS, Gu et al., NSDI'19, with a short first
band), preemptive, and over-quota weights that follow each queue's young work.

Two of its knobs are applied by whoever builds the scheduler's snapshot (the server's control loop and the
simulator's engine), through the functions below, so that `decide` stays a pure function of priorities
and weights:
- `las_preempt`: a workload's priority becomes `effective_priority`: its own priority x (bands + 1) + its
  band, so a higher user priority always outranks a lower one whatever the bands, and among equal user
  priorities work that has had less GPU-time outranks work that has had more (and `preempt` acts on it).
- `young_weights`: a queue's over-quota weight becomes its spec's weight x the sum of `young_weight` over
  its pending and running workloads (`weighted_by_young`).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from gpupool.scheduler import QueueView, SchedulerConfig
from gpupool.spec.document import load_yaml, validate_spec
from gpupool.spec.errors import SpecError
from gpupool.spec.fields import Number, Seconds
from gpupool.spec.quantities import format_duration, parse_duration

HOUR: Final = 3600.0
EPSILON: Final = 1e-9
# Bands inside a queue: a short first band lets a new job start at once by preempting work of its own queue
# that has had more than 2 GPU-minutes, so short jobs finish before long ones in a busy queue while a
# preempted job loses little; 16 GPU-hours as Tiresias' second threshold. Chosen on the Philly week
# (docs/simulator.md: 1, 2, 5 and 15 minutes tried).
DEFAULT_LAS_THRESHOLDS: Final = (2 * 60.0, 16 * HOUR)
# A workload under 2 GPU-minutes of service counts 4 + 1 toward its queue's over-quota weight, one under 1
# GPU-hour 1 (chosen on two Philly weeks, docs/simulator.md: the top band alone, 1 GPU-hour alone, and this).
DEFAULT_YOUNG_WEIGHTS: Final = ((2 * 60.0, 4.0), (1 * HOUR, 1.0))

DEFAULT_POLICY: Final = SchedulerConfig(
    ordering="las",
    blocking="skip",
    fair_share=True,
    las_thresholds=DEFAULT_LAS_THRESHOLDS,
    las_preempt=True,
    young_weights=DEFAULT_YOUNG_WEIGHTS,
)
"""gpupool's default scheduling policy: the server's unless scheduling.yaml says otherwise, and the
simulator's `gpupool` policy."""


# -- applied by the caller (control loop, simulator) ---------------------------------------------------


def service_band(attained: float, thresholds: Sequence[float]) -> int:
    """The band of `attained` GPU-seconds: len(thresholds) below the first threshold (the highest), one
    less for each threshold reached, as `ordering: las` ranks them."""
    return len(thresholds) - bisect.bisect_right(thresholds, attained)


def banded(config: SchedulerConfig, ordering: str | None) -> bool:
    """Whether the workloads of a queue with this `ordering` (None: the config's) get band priorities."""
    return config.las_preempt and bool(config.las_thresholds) and (ordering or config.ordering) == "las"


def effective_priority(priority: int, attained: float, config: SchedulerConfig, ordering: str | None) -> int:
    """The priority the scheduler sees for a workload of user priority `priority` that has had `attained`
    GPU-seconds, in a queue with `ordering`: priority x (bands + 1) + band where bands apply, so the user
    priority dominates; a queue without bands has every workload in the top band; without `las_preempt`,
    the user priority itself."""
    if not config.las_preempt or not config.las_thresholds:
        return priority
    thresholds = config.las_thresholds
    band = service_band(attained, thresholds) if banded(config, ordering) else len(thresholds)
    return priority * (len(thresholds) + 1) + band


def priority_parts(effective: int, config: SchedulerConfig) -> tuple[int, int | None]:
    """(user priority, band) of an `effective_priority`; band None when the config has no bands."""
    if not config.las_preempt or not config.las_thresholds:
        return effective, None
    user, band = divmod(effective, len(config.las_thresholds) + 1)
    return user, band


def young_weight(attained: float, young: Sequence[tuple[float, float]]) -> float:
    """What a pending or running workload that has had `attained` GPU-seconds adds to its queue's over-quota
    weight: each weight whose threshold it is still below."""
    total = 0.0
    for below, weight in young:
        if attained < below - EPSILON:
            total += weight
    return total


def weighted_by_young(queues: Sequence[QueueView], counts: Mapping[str, float]) -> tuple[QueueView, ...]:
    """The queues with each GPU over-quota weight multiplied by the sum of the young weights of the
    workloads in it or below it (`counts`: each queue's own workloads' sum, by queue name; a queue with
    no young work gets weight 0: nothing above its quota while others want it). Queues whose weight would
    not change are returned as they are."""
    total = young_totals(queues, counts)
    return tuple(young_weighted(q, total.get(q.name, 0)) for q in queues)


def young_totals(queues: Sequence[QueueView], counts: Mapping[str, float]) -> dict[str, float]:
    """Each queue's young-work sum with its descendants' added (`counts`: each queue's own, by name)."""
    parents = {q.name: q.parent for q in queues}
    total = dict(counts)
    for name, count in counts.items():
        seen = {name}
        parent = parents.get(name)
        while parent is not None and parent not in seen:  # a parent splits among its children's work
            total[parent] = total.get(parent, 0.0) + count
            seen.add(parent)
            parent = parents.get(parent)
    return total


def young_weighted(queue: QueueView, total: float) -> QueueView:
    """`queue` with its GPU over-quota weight multiplied by `total` (from `young_totals`); the queue
    itself when that changes nothing."""
    weight = queue.gpu.weight * total
    return queue if weight == queue.gpu.weight else replace(queue, gpu=replace(queue.gpu, weight=weight))


def band_text(thresholds: Sequence[float], band: int) -> str:
    """A band in words: 'under 2 GPU-minutes', 'at least 2 GPU-minutes', 'at least 16 GPU-hours'."""
    passed = len(thresholds) - band  # thresholds reached
    if passed <= 0:
        return f"under {gpu_time_text(thresholds[0])}"
    return f"at least {gpu_time_text(thresholds[passed - 1])}"


def gpu_time_text(seconds: float) -> str:
    """GPU-seconds as people say them: '2 GPU-minutes', '16 GPU-hours', '90 GPU-seconds'."""
    for unit, size in (("GPU-hour", HOUR), ("GPU-minute", 60.0)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}" + ("s" if count != 1 else "")
    return f"{seconds:g} GPU-seconds"


# -- the operator's file ---------------------------------------------------------------------------------

SCHEDULING_FIELD_EXAMPLES: Final[dict[str, str]] = {
    "": "{ordering: las, las_thresholds: [2m, 16h], las_preempt: true}",
    "ordering": "las",
    "blocking": "skip",
    "placement": "binpack",
    "las_thresholds": "[2m, 16h]",
    "las_preempt": "true (or false: las orders pending work but never preempts)",
    "young_weights": "[{below: 2m, weight: 4}, {below: 1h, weight: 1}] (or [] for the queues' own weights)",
    "young_weights.below": "2m",
    "young_weights.weight": "4",
    "max_stopping_gpus": "64 (or null: no limit)",
}
"""A valid example for each field path, shown in every error about that field."""

PositiveSeconds = Annotated[Seconds, Field(gt=0)]


class YoungWeight(BaseModel):
    """One step of the over-quota weight by young work."""

    model_config = ConfigDict(extra="forbid")

    below: PositiveSeconds = Field(description='GPU-time a workload is still below: GPU-seconds, or "2m".')
    weight: Annotated[Number, Field(gt=0)] = Field(description="What each such workload adds to its queue.")


class SchedulingSpec(BaseModel):
    """The server's scheduling policy ($GPUPOOL_HOME/scheduling.yaml); every field defaults to gpupool's
    default policy (`DEFAULT_POLICY`), so an empty file changes nothing."""

    model_config = ConfigDict(extra="forbid")

    ordering: Literal["fifo", "attained", "las", "estimate"] = Field(
        default="las",
        description="Order of pending work inside a queue (after priority) where the queue's spec does not "
        "say: fifo, attained, las (Tiresias' bands of attained GPU-service) or estimate; default las.",
    )
    blocking: Literal["skip", "backfill", "strict"] = Field(
        default="skip",
        description="A workload that does not fit: skip (others pass it), backfill (others pass unless they "
        "would delay its reservation; needs max_duration) or strict (nothing passes); default skip.",
    )
    placement: Literal["binpack", "spread", "fragmentation"] = Field(
        default="binpack",
        description="binpack, spread or fragmentation (docs/scheduler.md); default binpack.",
    )
    las_thresholds: list[float] = Field(
        default_factory=lambda: list(DEFAULT_LAS_THRESHOLDS),
        description='Band thresholds of attained GPU-time, increasing, e.g. ["2m", "16h"] (GPU-minutes, '
        "GPU-hours); default [2m, 16h].",
    )
    las_preempt: StrictBool = Field(
        default=True,
        description="In queues ordered by las, work of a higher band preempts work of its own queue in a "
        "lower one (among equal user priorities); default true.",
    )
    young_weights: list[YoungWeight] = Field(
        default_factory=lambda: [YoungWeight(below=b, weight=w) for b, w in DEFAULT_YOUNG_WEIGHTS],
        description="A queue's over-quota weight is its spec's weight x the sum, over its pending and "
        "running workloads, of each weight whose `below` the workload's GPU-time is still under; [] uses "
        "the queues' own weights; default [{below: 2m, weight: 4}, {below: 1h, weight: 1}].",
    )

    max_stopping_gpus: Annotated[Number, Field(gt=0)] | None = Field(
        default=None,
        description="At most this many GPUs may be held at once by work that preempt, reclaim and "
        "consolidation stopped for waiting work; more is stopped only as they are released (the first "
        "eviction with nothing stopping always goes ahead); default null: no limit.",
    )

    @field_validator("las_thresholds", mode="before")
    @classmethod
    def _gpu_times(cls, value: Any) -> Any:
        """Each threshold as GPU-seconds ("2m" is 120), above 0."""
        if not isinstance(value, list):
            return value  # pydantic says it is not a list
        out = []
        for i, item in enumerate(value):
            seconds = parse_duration(item, f"las_thresholds[{i}]")
            if seconds <= 0:
                raise SpecError(f"las_thresholds[{i}]", item, "must be above 0 GPU-seconds", "2m")
            out.append(seconds)
        return out

    @model_validator(mode="after")
    def _consistent(self) -> SchedulingSpec:
        for i in range(1, len(self.las_thresholds)):
            if self.las_thresholds[i] <= self.las_thresholds[i - 1]:
                raise SpecError(
                    f"las_thresholds[{i}]",
                    format_duration(self.las_thresholds[i]),
                    f"is not above the threshold before it ({format_duration(self.las_thresholds[i - 1])}); "
                    "list them in increasing order",
                    "",
                )
        if self.las_preempt and not self.las_thresholds:
            raise SpecError(
                "las_preempt",
                True,
                "needs las_thresholds to make bands of; give them (e.g. las_thresholds: [2m, 16h]) or set "
                "las_preempt: false",
                "",
            )
        belows = [y.below for y in self.young_weights]
        if len(set(belows)) != len(belows):
            raise SpecError(
                "young_weights",
                [format_duration(b) for b in belows],
                "gives one `below` twice; give each threshold once with the sum of its weights",
                "",
            )
        return self

    def config(self, usage_weight: float = 0.0) -> SchedulerConfig:
        """The scheduler's config for this policy (`usage_weight` comes from `gpupool server`)."""
        return replace(
            DEFAULT_POLICY,
            ordering=self.ordering,
            blocking=self.blocking,
            placement=self.placement,
            las_thresholds=tuple(self.las_thresholds),
            las_preempt=self.las_preempt,
            young_weights=tuple(sorted((y.below, y.weight) for y in self.young_weights)),
            usage_weight=usage_weight,
            max_stopping_gpus=self.max_stopping_gpus,
        )


def scheduling_fields(config: SchedulerConfig) -> dict[str, Any]:
    """The fields of a scheduling.yaml that gives `config` (`SchedulingSpec.config` read backwards), GPU-times
    in GPU-seconds: what `GET /api/v1/scheduling` shows, and what `parse_scheduling_spec` takes back. A
    config's other settings (its actions, fair share) are the default policy's for every file."""
    return {
        "ordering": config.ordering,
        "blocking": config.blocking,
        "placement": config.placement,
        "las_thresholds": list(config.las_thresholds),
        "las_preempt": config.las_preempt,
        "young_weights": [{"below": below, "weight": weight} for below, weight in config.young_weights],
        "max_stopping_gpus": config.max_stopping_gpus,
    }


def field_texts(config: SchedulerConfig) -> dict[str, str]:
    """Each field of `config`'s scheduling.yaml as YAML text that gives it back, durations as people write
    them: {"las_thresholds": "[2m, 16h]", "max_stopping_gpus": "null", ...}, in the file's order."""
    fields = scheduling_fields(config)
    young = ", ".join(
        f"{{below: {format_duration(y['below'])}, weight: {y['weight']:g}}}" for y in fields["young_weights"]
    )
    stopping = fields["max_stopping_gpus"]
    return {
        "ordering": fields["ordering"],
        "blocking": fields["blocking"],
        "placement": fields["placement"],
        "las_thresholds": "[" + ", ".join(format_duration(t) for t in fields["las_thresholds"]) + "]",
        "las_preempt": "true" if fields["las_preempt"] else "false",
        "young_weights": f"[{young}]",
        "max_stopping_gpus": "null" if stopping is None else f"{stopping:g}",
    }


def changed_fields(config: SchedulerConfig) -> list[str]:
    """What of `config`'s scheduling.yaml differs from the default policy, in words ("placement spread"),
    in the file's order; empty: the default policy's fields."""
    default = field_texts(DEFAULT_POLICY)
    return [f"{name} {text}" for name, text in field_texts(config).items() if text != default[name]]


def parse_scheduling_spec(data: object) -> SchedulingSpec:
    """A SchedulingSpec from a mapping or YAML text (an empty file, or one whose every line is commented
    out, is the default policy); SpecError (the first problem, with its field) if invalid."""
    if isinstance(data, str):
        data = load_yaml(data, SCHEDULING_FIELD_EXAMPLES[""])
    if data is None or (isinstance(data, bytes) and not data.strip()):
        return SchedulingSpec()
    return validate_spec(SchedulingSpec, data, SCHEDULING_FIELD_EXAMPLES, "scheduling policy")
