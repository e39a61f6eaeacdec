"""Scheduling policies for the simulator: presets of the product's own scheduler, not separate code.

A policy is a `SchedulerConfig` plus how the simulator presents the trace to the scheduler: which queues
(the given quotas, equal queues, or one shared pool), what each workload's priority is (fixed, or a band
of attained / remaining GPU-service as Tiresias discretizes it), and what duration estimate it carries
(none, a learned one, or the truth for the oracle references). Bands of attained service and over-quota
weights by young work come from the config (`las_preempt`, `young_weights`) and are applied by the engine
through the same functions as the server's control loop (gpupool/spec/scheduling.py); `gpupool` is the
server's default policy itself (`DEFAULT_POLICY`). The registry is an ordered list; an unknown name fails
before anything runs. A policy may also be an operator's own scheduling.yaml (the server's file, read by
the server's parser: `file_policy`), so a change to it can be replayed before a server runs it.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpupool.scheduler import SchedulerConfig
from gpupool.sim.errors import SimError
from gpupool.sim.input_files import read_text
from gpupool.spec import SpecError, format_duration
from gpupool.spec.scheduling import (
    DEFAULT_POLICY,
    SchedulingSpec,
    changed_fields,
    effective_priority,
    parse_scheduling_spec,
)

HOUR = 3600.0
# Tiresias' discretized 2D-LAS: a job moves down one band when its attained GPU-service passes a threshold.
LAS_BANDS = (1 * HOUR, 16 * HOUR)
# Remaining GPU-time bands for the preemptive SRTF reference (shorter remaining work = higher band).
SRTF_BANDS = (0.25 * HOUR, 1 * HOUR, 4 * HOUR, 16 * HOUR, 64 * HOUR)
# Finer bands of remaining GPU-time for the oracle bound inside quotas (2 and 5 minutes up to 128 hours):
# a band holds jobs of like remaining work, so the order inside the queues is close to exact SRTF.
ORACLE_BANDS = tuple(hours * HOUR for hours in (1 / 30, 1 / 12, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128))
ALLOCATE_ONLY = ("allocate",)
POOL = "pool"  # the one queue of policies that ignore quotas
FILE_SUFFIXES = (".yaml", ".yml")  # a --policy item ending so (or holding a "/") names a scheduling.yaml
USAGE_HALF_LIFE = 7 * 86400.0  # the server's --usage-half-life default


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    description: str
    config: SchedulerConfig
    queues: str = "quotas"  # "quotas": the given queues; "equal": one per tenant, no quota; "pool": one queue
    # GPU-second thresholds of bands of remaining GPU-time (less left = higher), for the SRTF reference;
    # bands of attained service come from the config (`las_preempt` with `las_thresholds`)
    remaining_bands: tuple[float, ...] = ()
    estimate: str = "none"  # duration_estimate: "none", "learned" (online, per queue) or "oracle" (the truth)
    oracle: bool = False  # reads true durations: a reference, not a real scheduler
    usage_half_life: float = USAGE_HALF_LIFE  # decay of queue usage when config.usage_weight > 0

    @property
    def band_by(self) -> str:
        """Bands by "attained" service (less = higher) or by "remaining" work (less left = higher)."""
        return "remaining" if self.remaining_bands else "attained"

    @property
    def bands(self) -> tuple[float, ...]:
        """The GPU-second thresholds whose crossing can change a workload's priority (none: fixed)."""
        if self.remaining_bands:
            return self.remaining_bands
        return self.config.las_thresholds if self.config.las_preempt else ()

    @property
    def young(self) -> tuple[tuple[float, float], ...]:
        """Over-quota weight by young work (empty: the queues' own weights); see `young_weight`."""
        return self.config.young_weights

    def priority(self, attained: float, remaining_gpu_s: float, ordering: str | None = None) -> int:
        """The workload priority the scheduler sees (0 when the policy has no bands) in a queue whose
        ordering is `ordering` (None: the config's)."""
        if self.remaining_bands:
            return len(self.remaining_bands) - bisect.bisect_right(self.remaining_bands, remaining_gpu_s)
        return effective_priority(0, attained, self.config, ordering)


POLICIES: tuple[Policy, ...] = (
    Policy(
        "fifo",
        "one queue, strict submit order, no preemption (YARN capacity scheduler style)",
        SchedulerConfig(actions=ALLOCATE_ONLY, ordering="fifo", blocking="strict", fair_share=False),
        queues=POOL,
    ),
    Policy(
        "fifo-backfill",
        "one queue in submit order; a blocked job reserves nodes and later jobs start elsewhere",
        SchedulerConfig(actions=ALLOCATE_ONLY, ordering="fifo", blocking="backfill", fair_share=False),
        queues=POOL,
    ),
    Policy(
        "sjf-oracle",
        "one queue, shortest true duration first, no preemption (knows durations: reference only)",
        SchedulerConfig(actions=ALLOCATE_ONLY, ordering="sjf-oracle", blocking="skip", fair_share=False),
        queues=POOL,
        estimate="oracle",
        oracle=True,
    ),
    Policy(
        "srtf-oracle",
        "one queue, shortest remaining true duration first, preemptive by remaining GPU-time bands "
        "(knows durations: reference only)",
        SchedulerConfig(
            actions=("allocate", "preempt"), ordering="srtf-oracle", blocking="skip", fair_share=False
        ),
        queues=POOL,
        remaining_bands=SRTF_BANDS,
        estimate="oracle",
        oracle=True,
    ),
    Policy(
        "las",
        "Tiresias' discretized 2D-LAS: one pool, least attained GPU-service band first, preemptive "
        "(bands at 1 and 16 GPU-hours), FIFO inside a band",
        SchedulerConfig(
            actions=("allocate", "preempt"),
            ordering="las",
            blocking="skip",
            fair_share=False,
            las_thresholds=LAS_BANDS,
            las_preempt=True,
        ),
        queues=POOL,
    ),
    Policy(
        "drf",
        "per-queue max-min fair share (no quotas, equal weights), reclaim to restore it, FIFO in a queue",
        SchedulerConfig(actions=("allocate", "reclaim"), ordering="fifo", blocking="skip", fair_share=True),
        queues="equal",
    ),
    Policy(
        "gpupool",
        "the server's default policy (gpupool/spec/scheduling.py): quotas, fair share by water-filling, "
        "reclaim, consolidation; a "
        "queue's over-quota weight counts its young jobs, pending or running (5 for one under 2 "
        "GPU-minutes of service, 1 under 1 GPU-hour); inside a queue least attained GPU-service first, "
        "preemptive, in bands at 2 GPU-minutes and 16 GPU-hours (Tiresias' discretized LAS with a short "
        "first band), FIFO inside a band",
        DEFAULT_POLICY,
    ),
    Policy(
        "gpupool-bands",
        "gpupool with the queues' own over-quota weights (1 each with --queues auto): the bands alone",
        replace(DEFAULT_POLICY, young_weights=()),
    ),
    Policy(
        "gpupool-usage",
        "gpupool-bands with usage_weight 1: a queue's over-quota weight halves for each doubling of its "
        "decayed GPU usage over its share (Slurm's classic fair-share factor), half-life 1 day",
        replace(DEFAULT_POLICY, young_weights=(), usage_weight=1.0),
        usage_half_life=86400.0,
    ),
    Policy(
        "gpupool-estimate",
        "quotas, fair share, reclaim, consolidation; inside a queue shortest learned GPU-time estimate "
        "first (QSSF-style, learned online from the queue's finished jobs), no preemption inside a queue",
        SchedulerConfig(ordering="estimate", blocking="skip", fair_share=True),
        estimate="learned",
    ),
    Policy(
        "gpupool-oracle",
        "gpupool's quotas, fair share, reclaim and young-work weights, with true remaining durations inside "
        "each queue: shortest remaining GPU-time band first, preemptive (12 bands, 2 minutes to 128 "
        "GPU-hours). What any order inside the queues could reach while the quotas hold (knows durations: "
        "reference only)",
        replace(DEFAULT_POLICY, ordering="srtf-oracle", las_preempt=False),
        remaining_bands=ORACLE_BANDS,
        estimate="oracle",
        oracle=True,
    ),
    Policy(
        "gpupool-las",
        "gpupool-bands with Tiresias' own bands (1 and 16 GPU-hours) inside a queue",
        replace(DEFAULT_POLICY, young_weights=(), las_thresholds=LAS_BANDS),
    ),
)
BY_NAME = {p.name: p for p in POLICIES}
DEFAULT_POLICIES = ("fifo", "las", "gpupool")


def resolve_policies(value: str, one: bool = False, flag: str = "--policy") -> list[Policy]:
    """`a,b,c` (or `all`) -> the policies, in the order given; an item that names a scheduling.yaml (it ends
    in .yaml or .yml, or holds a "/") is that file's policy (`file_policy`). `one`: a single policy asked
    for (`sim whatif`): `all` or a list is refused. `flag`: the option named in errors."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    choice = "one of" if one else "one or more of"
    other = "" if one else " (or all)"
    if one and (len(names) > 1 or names == ["all"]):
        raise SimError(flag, f"whatif replays one policy; give one name, e.g. {flag} gpupool")
    if names == ["all"]:
        return list(POLICIES)
    if "all" in names:
        raise SimError(
            flag,
            f"'all' stands alone in {value!r} (it is every policy): give {flag} all, or name the policies "
            f"without it, e.g. {flag} fifo,gpupool",
        )
    if not names:
        raise SimError(flag, f"no policy given; {choice} {', '.join(BY_NAME)}{other}")
    out: list[Policy] = []
    for name in names:
        if any(p.name == name for p in out):
            continue
        if name.endswith(FILE_SUFFIXES) or "/" in name:
            out.append(file_policy(name, flag))
        elif name in BY_NAME:
            out.append(BY_NAME[name])
        else:
            raise SimError(
                flag,
                f"unknown policy {name!r}; one of {', '.join(BY_NAME)}{other}, or a scheduling.yaml file",
            )
    return out


def file_policy(path: str, flag: str = "--policy") -> Policy:
    """The policy of the scheduling.yaml at `path` (docs/scheduler.md), as a server started with it would
    run it with `--usage-weight 0` (its default); named `path`, as given."""
    try:
        text = read_text(Path(path).expanduser(), flag)
    except FileNotFoundError:
        raise SimError(
            flag, f"{path}: no such file; give a scheduling.yaml (docs/scheduler.md) or a policy name"
        ) from None
    except OSError as exc:
        raise SimError(flag, f"cannot read {path}: {exc.strerror}") from None
    try:
        spec = parse_scheduling_spec(text)
    except SpecError as exc:
        raise SimError(flag, f"{path}: {exc}") from None
    return spec_policy(path, spec, f"the scheduling.yaml {path}")


def server_policy(body: Mapping[str, Any]) -> Policy:
    """The policy a server runs, from its `GET /api/v1/scheduling` (`body`): named `server`."""
    source = body.get("source")
    said = f"the server's scheduling.yaml ({source})" if source else "the server's policy"
    return spec_policy(
        "server",
        parse_scheduling_spec(body["policy"]),
        said,
        usage_weight=float(body.get("usage_weight") or 0.0),
        usage_half_life=float(body.get("usage_half_life_s") or USAGE_HALF_LIFE),
    )


def spec_policy(
    name: str,
    spec: SchedulingSpec,
    source: str,
    usage_weight: float = 0.0,
    usage_half_life: float = USAGE_HALF_LIFE,
) -> Policy:
    """A scheduling.yaml's policy as the server runs it (over the given queues; a learned duration estimate
    for `ordering: estimate`), described by `source` and what it changes of the default."""
    config = spec.config(usage_weight)
    changes = changed_fields(config)
    if usage_weight > 0:
        changes.append(f"usage_weight {usage_weight:g} (half-life {format_duration(usage_half_life)})")
    said = ", ".join(changes) if changes else "the default policy's settings (as gpupool)"
    return Policy(
        name,
        f"{source}: {said}",
        config,
        estimate="learned" if config.ordering == "estimate" else "none",
        usage_half_life=usage_half_life,
    )
