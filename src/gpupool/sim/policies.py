"""Scheduling policies for the simulator: presets of the product's own scheduler, not separate code.

A policy is a `SchedulerConfig` plus how the simulator presents the trace to the scheduler: which queues
(the given quotas, equal queues, or one shared pool), what each workload's priority is (fixed, or a band
of attained / remaining GPU-service as Tiresias discretizes it), and what duration estimate it carries
(none, a learned one, or the truth for the oracle references). The registry is an ordered list; an
unknown name fails before anything runs.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from gpupool.scheduler import SchedulerConfig
from gpupool.sim.errors import SimError

HOUR = 3600.0
# Tiresias' discretized 2D-LAS: a job moves down one band when its attained GPU-service passes a threshold.
LAS_BANDS = (1 * HOUR, 16 * HOUR)
# gpupool's bands inside a queue: a short first band lets a new job start at once by preempting work of its
# own queue that has had more than 2 GPU-minutes, so short jobs finish before long ones in a busy queue
# (most of a queue's slowdown) while a preempted job loses little; 16 GPU-hours as Tiresias' second
# threshold. Chosen on the Philly week (docs/simulator.md: 1, 2, 5 and 15 minutes tried).
GPUPOOL_BANDS = (2 * 60.0, 16 * HOUR)
# gpupool's over-quota weights: a job under 2 GPU-minutes of service counts 4 + 1, one under 1 GPU-hour 1
# (chosen on two Philly weeks, docs/simulator.md: the top band alone, 1 GPU-hour alone, and this).
GPUPOOL_YOUNG = ((2 * 60.0, 4.0), (1 * HOUR, 1.0))
# Remaining GPU-time bands for the preemptive SRTF reference (shorter remaining work = higher band).
SRTF_BANDS = (0.25 * HOUR, 1 * HOUR, 4 * HOUR, 16 * HOUR, 64 * HOUR)
ALLOCATE_ONLY = ("allocate",)
POOL = "pool"  # the one queue of policies that ignore quotas


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    description: str
    config: SchedulerConfig
    queues: str = "quotas"  # "quotas": the given queues; "equal": one per tenant, no quota; "pool": one queue
    bands: tuple[float, ...] = ()  # GPU-second thresholds turning service into priority bands (preemptive)
    band_by: str = "attained"  # "attained": less service = higher band; "remaining": less work left = higher
    estimate: str = "none"  # duration_estimate: "none", "learned" (online, per queue) or "oracle" (the truth)
    oracle: bool = False  # reads true durations: a reference, not a real scheduler
    usage_half_life: float = 7 * 86400.0  # decay of queue usage when config.usage_weight > 0 (the server's)
    # Over-quota weight of each queue by its young work: with (threshold GPU-seconds, weight) pairs, a
    # pending or running job adds each weight whose threshold its attained service is still below, and
    # the queue's over-quota weight is its spec's weight times that sum, so the GPUs left above the quotas
    # go to the queues with new work (LAS across queues, above the quotas only). Empty: the spec's weights.
    young: tuple[tuple[float, float], ...] = ()

    def priority(self, attained: float, remaining_gpu_s: float) -> int:
        """The workload priority the scheduler sees (0 when the policy has no bands)."""
        if not self.bands:
            return 0
        value = attained if self.band_by == "attained" else remaining_gpu_s
        return len(self.bands) - bisect.bisect_right(self.bands, value)


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
        bands=SRTF_BANDS,
        band_by="remaining",
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
        ),
        queues=POOL,
        bands=LAS_BANDS,
    ),
    Policy(
        "drf",
        "per-queue max-min fair share (no quotas, equal weights), reclaim to restore it, FIFO in a queue",
        SchedulerConfig(actions=("allocate", "reclaim"), ordering="fifo", blocking="skip", fair_share=True),
        queues="equal",
    ),
    Policy(
        "gpupool",
        "the product's default actions: quotas, fair share by water-filling, reclaim, consolidation; a "
        "queue's over-quota weight counts its young jobs, pending or running (5 for one under 2 "
        "GPU-minutes of service, 1 under 1 GPU-hour); inside a queue least attained GPU-service first, "
        "preemptive, in bands at 2 GPU-minutes and 16 GPU-hours (Tiresias' discretized LAS with a short "
        "first band), FIFO inside a band",
        SchedulerConfig(ordering="las", blocking="skip", fair_share=True, las_thresholds=GPUPOOL_BANDS),
        bands=GPUPOOL_BANDS,
        young=GPUPOOL_YOUNG,
    ),
    Policy(
        "gpupool-bands",
        "gpupool with the queues' own over-quota weights (1 each with --queues auto): the bands alone",
        SchedulerConfig(ordering="las", blocking="skip", fair_share=True, las_thresholds=GPUPOOL_BANDS),
        bands=GPUPOOL_BANDS,
    ),
    Policy(
        "gpupool-usage",
        "gpupool-bands with usage_weight 1: a queue's over-quota weight halves for each doubling of its "
        "decayed GPU usage over its share (Slurm's classic fair-share factor), half-life 1 day",
        SchedulerConfig(
            ordering="las", blocking="skip", fair_share=True, las_thresholds=GPUPOOL_BANDS, usage_weight=1.0
        ),
        bands=GPUPOOL_BANDS,
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
        "gpupool-las",
        "gpupool-bands with Tiresias' own bands (1 and 16 GPU-hours) inside a queue",
        SchedulerConfig(ordering="las", blocking="skip", fair_share=True, las_thresholds=LAS_BANDS),
        bands=LAS_BANDS,
    ),
)
BY_NAME = {p.name: p for p in POLICIES}
DEFAULT_POLICIES = ("fifo", "las", "gpupool")


def resolve_policies(value: str) -> list[Policy]:
    """`a,b,c` (or `all`) -> the policies, in the order given."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if names == ["all"]:
        return list(POLICIES)
    if not names:
        raise SimError("--policy", f"no policy given; one or more of {', '.join(BY_NAME)} (or all)")
    out = []
    for name in names:
        if name not in BY_NAME:
            raise SimError("--policy", f"unknown policy {name!r}; one of {', '.join(BY_NAME)} (or all)")
        if BY_NAME[name] not in out:
            out.append(BY_NAME[name])
    return out
