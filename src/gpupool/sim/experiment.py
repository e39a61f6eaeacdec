"""One `sim run`: a trace window, a cluster, queues and several policies replayed side by side."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.scheduler import QueueView, Share
from gpupool.sim.cluster import Cluster, load_cluster
from gpupool.sim.engine import CPUS, GPUS, MEMORY, MODEL, drop_reasons
from gpupool.sim.errors import SimError
from gpupool.sim.metrics import summarize
from gpupool.sim.parallel import Progress, Replay, processes, replay_all
from gpupool.sim.policies import Policy, resolve_policies
from gpupool.sim.queues import auto_queues, resolve_queues
from gpupool.sim.results import SimOptions, SimResult
from gpupool.sim.trace import Trace, TraceJob, load_trace, select


@dataclass(slots=True)
class Experiment:
    trace: Trace
    jobs: list[TraceJob]
    origin: float
    cluster: Cluster
    queues: tuple[QueueView, ...]
    policies: list[Policy]
    options: SimOptions
    window: str | None = None
    workers: int = 1  # replays at once, each in a process of its own when more than 1 (`--jobs`)
    cluster_flag: str = "--cluster"  # the option that gave the cluster: --cluster or --nodes
    # why the replays drop jobs, known before they run: reason (`engine.unfit`) -> jobs
    drops: dict[str, int] = field(default_factory=dict)
    results: list[SimResult] = field(default_factory=list)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)


def prepare(
    trace: str,
    cluster: str | None,
    nodes: str | None = None,
    window: str | None = None,
    first: int | None = None,
    queues: str = "auto",
    policies: str = "fifo,las,gpupool",
    options: SimOptions | None = None,
    workers: int | str = 1,
) -> Experiment:
    """Check and load every input before anything runs (a bad flag fails in seconds, not after a run).

    `workers` is `--jobs`: how many policies replay at once (`auto`: one per policy, at most one per CPU)."""
    chosen = resolve_policies(policies)
    at_once = processes(workers, len(chosen))
    if cluster is not None and nodes is not None:
        raise SimError("--nodes", "give either --cluster or --nodes, not both")
    spec = cluster if cluster is not None else nodes
    if spec is None:
        raise SimError("--cluster", "which cluster? e.g. --cluster 64x8 (or --nodes alibaba-openb:NODES.csv)")
    flag = "--cluster" if cluster is not None else "--nodes"
    built = load_cluster(spec, flag)
    if built.gpus <= 0:
        raise SimError(flag, f"{spec!r} has no GPUs")
    loaded = load_trace(trace)
    jobs, origin = select(loaded, window, first)
    reasons = drop_reasons(jobs, built)
    drops = dict(Counter(r for r in reasons if r is not None))
    if sum(drops.values()) == len(jobs):
        raise SimError(
            flag,
            f"{counted(len(jobs), 'job')} selected and none fits {spec!r}: {_why(drops)}; give "
            + ", or ".join(_FIXES[r] for r in DROP_REASONS if r in drops),
        )
    if queues == "auto":
        views = _auto_queues(jobs, [j for j, r in zip(jobs, reasons, strict=True) if r is None], built.gpus)
    else:
        views = resolve_queues(queues, jobs, built.gpus)
    return Experiment(
        loaded, jobs, origin, built, views, chosen, options or SimOptions(), window, at_once, flag, drops
    )


def _auto_queues(
    jobs: Sequence[TraceJob], replayed: Sequence[TraceJob], cluster_gpus: int
) -> tuple[QueueView, ...]:
    """`--queues auto` over the jobs the replays run (a job the cluster cannot hold demands none of its
    GPUs); a tenant all of whose jobs are dropped keeps a queue, with no quota."""
    views = auto_queues(replayed, cluster_gpus)
    idle = {j.queue for j in jobs} - {q.name for q in views}
    return tuple(sorted((*views, *(QueueView(n, gpu=Share(quota=0.0)) for n in idle)), key=lambda q: q.name))


# What each drop reason (`engine.unfit`) says of the jobs, and what would let them run.
DROP_REASONS = {
    GPUS: "more GPUs than the cluster's nodes hold",
    MODEL: "a GPU model none of the nodes with enough GPUs has",
    CPUS: "more CPUs per pod than any node with their GPUs has",
    MEMORY: "more memory per pod than any node with their GPUs has",
}
_FIXES = {
    GPUS: "larger nodes (or more of them)",
    MODEL: "nodes of the GPU models they ask for",
    CPUS: "nodes with more CPUs",
    MEMORY: "nodes with more memory",
}


def _why(drops: dict[str, int]) -> str:
    """The reasons of the drops, counted: "2 ask for more GPUs than the cluster's nodes hold, 1 for ..."."""
    said: list[str] = []
    for reason, text in DROP_REASONS.items():
        if n := drops.get(reason, 0):
            verb = "for" if said else ("asks for" if n == 1 else "ask for")
            said.append(f"{n:,} {verb} {text}")
    return ", ".join(said)


def run(experiment: Experiment, progress: Progress | None = None) -> Experiment:
    """Replay every policy, `experiment.workers` at a time; results in the order of the policies."""
    replays = [
        Replay(p.name, experiment.jobs, experiment.origin, experiment.cluster, experiment.queues, p,
               experiment.options)
        for p in experiment.policies
    ]  # fmt: skip
    results = replay_all(replays, experiment.workers, progress)
    for policy, result in zip(experiment.policies, results, strict=True):
        experiment.results.append(result)
        experiment.metrics[policy.name] = summarize(result)
    return experiment


def as_json(experiment: Experiment) -> dict[str, Any]:
    options = experiment.options
    return {
        "trace": {
            "format": experiment.trace.format,
            "path": str(experiment.trace.path),
            "window": experiment.window,
            "jobs": len(experiment.jobs),
            "skipped": experiment.trace.skipped,
            "dropped": experiment.drops,
            "adjusted": experiment.trace.adjusted,
        },
        "cluster": {
            "spec": experiment.cluster.spec,
            "nodes": len(experiment.cluster.nodes),
            "gpus": experiment.cluster.gpus,
        },
        "queues": {
            q.name: {"quota_gpus": q.gpu.quota, "limit_gpus": q.gpu.limit, "weight": q.gpu.weight}
            for q in experiment.queues
        },
        "options": {
            "cycle_s": options.cycle,
            "restart_overhead_s": options.restart_overhead,
            "checkpoint_interval_s": options.checkpoint_interval,
            "seed": options.seed,
        },
        "policies": {
            name: {"description": p.description, "knows_durations": p.oracle, **experiment.metrics[name]}
            for name, p in ((p.name, p) for p in experiment.policies)
            if name in experiment.metrics
        },
    }


def counted(count: int, noun: str) -> str:
    """`count` and the noun, plural but for one: "1 queue", "14 queues", "1,024 GPUs"."""
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def left_out(experiment: Experiment) -> str | None:
    """The trace rows the loader left out, and why ("3 rows of x.csv left out: 2 with no run time, 1 with
    no GPUs")."""
    skipped = experiment.trace.skipped
    if not skipped:
        return None
    reasons = ", ".join(f"{n:,} with {reason}" for reason, n in sorted(skipped.items(), key=lambda r: -r[1]))
    return f"{counted(sum(skipped.values()), 'row')} of {experiment.trace.path.name} left out: {reasons}"


def dropped(experiment: Experiment) -> str | None:
    """What the replays drop, and why: the jobs no set of the cluster's nodes can hold (the same for every
    policy, known before they run)."""
    total = sum(experiment.drops.values())
    if not total:
        return None
    return (
        f"{counted(total, 'job')} of {len(experiment.jobs):,} dropped ({experiment.cluster_flag}): "
        f"{_why(experiment.drops)}"
    )


def default_report_name(trace: str) -> Path:
    return Path(f"sim-report-{Path(trace.partition(':')[2]).stem}")


def summary_rows(experiment: Experiment) -> Sequence[dict[str, Any]]:
    rows = []
    base = experiment.metrics.get("fifo", {}).get("avg_jct_s")
    for name, m in experiment.metrics.items():
        rows.append({"policy": name, **m, "vs_fifo": (m["avg_jct_s"] / base) if base else None})
    return rows
