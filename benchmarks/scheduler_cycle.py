"""Scheduler cycle: the time and memory of `gpupool.scheduler.decide(snapshot, now)` on a synthetic cluster.

The cluster comes from `synthetic_cluster.py` (seeded; see its docstring for what it holds).

- full cycle: `decide` on a freshly built snapshot (new objects each cycle, equal values, so no cache keyed
  on object identity can help); p50 and p99 over --cycles. Building the snapshot is timed apart.
- steady-state cycle: the last full cycle's binds are applied (bound workloads run, evicted ones are pending
  again), and `decide` runs on the result, applying its decisions, until a cycle decides nothing (at most
  --settle-rounds). Then the control loop's `Scheduler` decides --cycles more times on that same, unchanged
  snapshot object, the clock advancing --tick seconds a cycle as the control loop's would: it answers from
  memory until something time-dependent could change (its first answer is a full cycle). The JSON also
  has `steady_full_ms_p50`, plain `decide` on that snapshot, and says whether the state settled.
- memory: peak RSS of the process (snapshot, generator and scheduler together), the RSS right after the
  first build for comparison, and, with --tracemalloc, the Python heap peak of one extra `decide`.

Every applied cycle is checked (binds of pending workloads, a placement per pod, no GPU over-committed).

Targets (issue 3), 8 GPUs per node:
- 1,000 nodes, 5,000 pending, 4,000 running, 50 queues: full cycle p50 <= 100 ms; steady p50 <= 20 ms.
- 10,000 nodes, 50,000 pending, 40,000 running, 200 queues: full cycle p50 <= 1.5 s; peak memory <= 2 GB.

    python benchmarks/scheduler_cycle.py --nodes 1000 --gpus-per-node 8 --pending 5000 --running 4000 \\
        --queues 50
    python benchmarks/scheduler_cycle.py --nodes 10000 --gpus-per-node 8 --pending 50000 --running 40000 \\
        --queues 200 --cycles 5
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import resource
import signal
import sys
import time
import traceback
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from harness import RESULTS_DIR, console, machine, percentile, write_results
from rich.table import Table
from synthetic_cluster import NOW, ApplyReport, ClusterSpec, ClusterStats, apply_decisions, build_snapshot

import gpupool.scheduler as scheduler
from gpupool.scheduler import Scheduler, SchedulerConfig, decide
from gpupool.scheduler.snapshot import Decisions, Snapshot
from gpupool.spec.scheduling import DEFAULT_POLICY

Decider = Callable[[Snapshot, float], Decisions]
NAME = "scheduler_cycle"
NATIVE: bool = getattr(scheduler, "NATIVE", False)  # False also for sources from before the compiled build
# (nodes, pending, running, queues) at 8 GPUs per node -> the limits.
TARGETS: dict[tuple[int, int, int, int], dict[str, float]] = {
    (1000, 5000, 4000, 50): {"cycle_ms_p50": 100.0, "steady_ms_p50": 20.0},
    (10000, 50000, 40000, 200): {"cycle_ms_p50": 1500.0, "peak_rss_mb": 2048.0},
}


class CycleTimeout(BaseException):
    """One `decide` ran past --cycle-timeout; a BaseException so that no `except Exception` eats it."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Interrupt the block with CycleTimeout after `seconds` (SIGALRM; the core is pure Python)."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise CycleTimeout(f"decide ran past {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def timed_decide(
    snapshot: Snapshot, now: float, timeout: float, decider: Decider = decide
) -> tuple[Decisions, float]:
    """`decide` and its wall time in ms; garbage from earlier work is collected first, untimed."""
    gc.collect()
    with deadline(timeout):
        start = time.perf_counter()
        decisions = decider(snapshot, now)
        elapsed = time.perf_counter() - start
    return decisions, elapsed * 1000.0


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


@dataclass(slots=True)
class Result:
    """Everything one run measured; becomes the JSON."""

    cycle_ms: list[float] = field(default_factory=list)
    settle_ms: list[float] = field(default_factory=list)
    steady_ms: list[float] = field(default_factory=list)  # through Scheduler (memory of the last answer)
    steady_full_ms: list[float] = field(default_factory=list)  # plain decide on the same snapshot
    steady_answers_from_memory: int = 0
    build_s: list[float] = field(default_factory=list)
    binds: int = 0
    evictions: int = 0
    eviction_codes: dict[str, int] = field(default_factory=dict)
    unexplained_pending: int = 0
    deterministic: bool = True
    settle_rounds: list[dict[str, int]] = field(default_factory=list)
    settled: bool | None = None
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    rss_after_build_mb: float = 0.0
    tracemalloc_peak_mb: float | None = None
    error: str | None = None
    timeouts: list[dict[str, str]] = field(default_factory=list)  # phase, and where the core was
    stopped_early: list[str] = field(default_factory=list)

    def note(self, report: ApplyReport) -> None:
        self.problem_count += report.problem_count
        self.problems.extend(report.problems[: max(0, 10 - len(self.problems))])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000, help="nodes (default 1000)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--pending", type=int, default=5000, help="pending workloads (default 5000)")
    parser.add_argument("--running", type=int, default=4000, help="running workloads (default 4000)")
    parser.add_argument("--queues", type=int, default=50, help="leaf queues, ~10 per department (default 50)")
    parser.add_argument(
        "--cycles",
        type=int,
        default=20,
        help="full cycles, and steady cycles (default 20; pass 5 at 10,000 nodes)",
    )
    parser.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    parser.add_argument(
        "--policy",
        choices=("plain", "default"),
        default="plain",
        help="the snapshot's scheduler config: plain SchedulerConfig() (fifo, backfill; the figures "
        "recorded before the server's default changed) or the server's DEFAULT_POLICY (las, skip; band "
        "priorities are the caller's and not applied here) (default plain)",
    )
    parser.add_argument(
        "--max-stopping-gpus",
        type=float,
        default=None,
        metavar="N",
        help="the config's max_stopping_gpus: at most N GPUs stopping at once (default none: no limit)",
    )
    parser.add_argument(
        "--settle-rounds",
        type=int,
        default=5,
        help="post-bind cycles applied before the steady ones, at most (default 5)",
    )
    parser.add_argument(
        "--tick",
        type=float,
        default=1.0,
        help="seconds the clock advances per post-bind and steady cycle (default 1; 0 = fixed)",
    )
    parser.add_argument(
        "--reuse-snapshot",
        action="store_true",
        help="run every full cycle on the first snapshot object instead of rebuilding it",
    )
    parser.add_argument(
        "--cycle-timeout",
        type=float,
        default=120.0,
        help="abandon one decide after this many seconds (default 120)",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=300.0,
        help="stop starting cycles after this long: full cycles get half (default 300)",
    )
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="also measure the Python heap peak of one extra decide (slow: 2-5x)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="cProfile one extra decide and print its top N functions (default off)",
    )
    parser.add_argument("--json", type=Path, default=None, help=f"JSON path (default results/{NAME}.json)")
    args = parser.parse_args()
    if args.cycles < 1:
        parser.error("--cycles must be >= 1")
    return args


def spec_of(args: argparse.Namespace) -> ClusterSpec:
    return ClusterSpec(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        pending=args.pending,
        running=args.running,
        queues=args.queues,
        seed=args.seed,
        config=replace(
            DEFAULT_POLICY if args.policy == "default" else SchedulerConfig(),
            max_stopping_gpus=args.max_stopping_gpus,
        ),
    )


def build(spec: ClusterSpec, result: Result) -> tuple[Snapshot, ClusterStats]:
    start = time.perf_counter()
    snapshot, stats = build_snapshot(spec)
    result.build_s.append(time.perf_counter() - start)
    return snapshot, stats


@dataclass(slots=True)
class Budget:
    """Whether another decide fits in --max-seconds, guessing it lasts as long as the last one did."""

    seconds: float
    started: float = field(default_factory=time.perf_counter)
    last_s: float = 0.0

    def allows(self, share: float = 1.0) -> bool:
        return time.perf_counter() - self.started + self.last_s <= self.seconds * share


def measure(
    snapshot: Snapshot,
    now: float,
    args: argparse.Namespace,
    budget: Budget,
    series: list[float],
    phase: str,
    result: Result,
    decider: Decider = decide,
) -> Decisions | None:
    """One timed decide appended to `series`; None when it ran past --cycle-timeout (counted as that)."""
    try:
        decisions, ms = timed_decide(snapshot, now, args.cycle_timeout, decider)
    except CycleTimeout as exc:
        series.append(args.cycle_timeout * 1000.0)
        budget.last_s = args.cycle_timeout
        # Where the core was when time ran out: its innermost frames are where it spends its time.
        inside = [f for f in traceback.extract_tb(exc.__traceback__) if "gpupool" in f.filename][-6:]
        # Source lines are read now, from disk: if src/ changed since the import, they may be off.
        where = "".join(traceback.format_list(inside))
        result.timeouts.append({"phase": phase, "where": where})
        console.print(
            f"{phase} cycle {len(series)}: {exc}; interrupted in:\n{where}", markup=False, highlight=False
        )
        return None
    series.append(ms)
    budget.last_s = ms / 1000.0
    return decisions


def full_cycles(
    args: argparse.Namespace, spec: ClusterSpec, result: Result, budget: Budget
) -> tuple[Snapshot, Decisions | None, ClusterStats]:
    """--cycles decides on fresh snapshots; the last snapshot and the decisions of the last completed one."""
    snapshot, stats = build(spec, result)
    result.rss_after_build_mb = rss_mb()
    console.print(
        f"[dim]built snapshot in {result.build_s[0]:.2f}s: {stats.gpus} GPUs "
        f"({stats.schedulable_gpus} schedulable), {stats.running_gpu_units:g} GPUs running, "
        f"{stats.pending_gpu_units:g} GPUs pending, {stats.departments} departments, "
        f"RSS {result.rss_after_build_mb:.0f} MB[/dim]"
    )
    first: Decisions | None = None
    for cycle in range(args.cycles):
        if cycle and not budget.allows(0.5):
            result.stopped_early.append(f"full cycles: {cycle} of {args.cycles} within --max-seconds / 2")
            break
        if cycle and not args.reuse_snapshot:
            del snapshot  # one snapshot alive at a time, so peak RSS is the scheduler's, not the benchmark's
            gc.collect()
            snapshot, _ = build(spec, result)
        decisions = measure(snapshot, NOW, args, budget, result.cycle_ms, "full", result)
        if decisions is None:
            break
        if first is None:
            first = decisions
            result.binds, result.evictions = len(decisions.binds), len(decisions.evictions)
            for eviction in decisions.evictions:
                result.eviction_codes[eviction.code] = result.eviction_codes.get(eviction.code, 0) + 1
            bound = {b.workload_id for b in decisions.binds}
            result.unexplained_pending = sum(
                1 for w in snapshot.pending if w.id not in bound and w.id not in decisions.explanations
            )
        elif decisions.binds != first.binds or decisions.evictions != first.evictions:
            result.deterministic = False
        console.print(
            f"[dim]full cycle {cycle + 1}/{args.cycles}: {result.cycle_ms[-1]:.1f} ms, "
            f"{len(decisions.binds)} binds, {len(decisions.evictions)} evictions[/dim]"
        )
    return snapshot, first, stats


def steady_cycles(
    args: argparse.Namespace, snapshot: Snapshot, decisions: Decisions, result: Result, budget: Budget
) -> None:
    now = NOW
    result.settled = False if args.settle_rounds else None
    for round_ in range(args.settle_rounds):
        if not budget.allows():
            result.stopped_early.append(
                f"post-bind cycles: {round_} of {args.settle_rounds} within --max-seconds; no steady cycles"
            )
            return
        now += args.tick
        snapshot, report = apply_decisions(snapshot, decisions, now)
        result.note(report)
        settled = measure(snapshot, now, args, budget, result.settle_ms, "post-bind", result)
        if settled is None:
            return
        decisions = settled
        result.settle_rounds.append(
            {
                "applied_binds": report.binds,
                "applied_evictions": report.evictions,
                "binds": len(decisions.binds),
                "evictions": len(decisions.evictions),
            }
        )
        console.print(
            f"[dim]post-bind cycle {round_ + 1}: applied {report.binds} binds and {report.evictions} "
            f"evictions; decide {result.settle_ms[-1]:.1f} ms -> {len(decisions.binds)} binds, "
            f"{len(decisions.evictions)} evictions[/dim]"
        )
        if not decisions.binds and not decisions.evictions:
            result.settled = True
            break
    # The last decide's decisions are not applied: from here on the input never changes. The control
    # loop's Scheduler answers from memory while nothing time-dependent has changed; its first answer
    # here is a full cycle. A few plain decides on the same snapshot show the cost without memory.
    memory = Scheduler()
    for _ in range(min(3, args.cycles)):
        if not budget.allows():
            break
        if measure(snapshot, now + args.tick, args, budget, result.steady_full_ms, "steady", result) is None:
            break
    for cycle in range(args.cycles):
        if not budget.allows():
            result.stopped_early.append(f"steady cycles: {cycle} of {args.cycles} within --max-seconds")
            break
        now += args.tick
        steady = measure(snapshot, now, args, budget, result.steady_ms, "steady", result, memory.decide)
        if steady is None:
            break
        result.steady_answers_from_memory = memory.reused
        console.print(
            f"[dim]steady cycle {cycle + 1}/{args.cycles}: {result.steady_ms[-1]:.1f} ms, "
            f"{len(steady.binds)} binds, {len(steady.evictions)} evictions[/dim]"
        )


def heap_peak_mb(snapshot: Snapshot, timeout: float) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        with deadline(timeout):
            decide(snapshot, NOW)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def profile(snapshot: Snapshot, top: int, timeout: float, output: Path) -> None:
    profiler = cProfile.Profile()
    gc.collect()
    with deadline(timeout):
        profiler.runcall(decide, snapshot, NOW)
    profiler.dump_stats(output)
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).strip_dirs().sort_stats(order).print_stats(top)
        console.print(f"[bold]decide profile, top {top} by {order}[/bold]", highlight=False)
        console.print(text.getvalue().split("\n\n", 1)[-1].rstrip(), highlight=False, markup=False)
    console.print(f"[dim]wrote {output} (open with python -m pstats or snakeviz)[/dim]")


def summary(args: argparse.Namespace, result: Result) -> dict[str, Any]:
    def p(values: list[float], q: float) -> float | None:
        return round(percentile(values, q), 3) if values else None

    return {
        "cycle_ms_p50": p(result.cycle_ms, 50),
        "cycle_ms_p99": p(result.cycle_ms, 99),
        "steady_ms_p50": p(result.steady_ms, 50),
        "steady_ms_p99": p(result.steady_ms, 99),
        "steady_full_ms_p50": p(result.steady_full_ms, 50),
        "steady_answers_from_memory": result.steady_answers_from_memory,
        "peak_rss_mb": round(rss_mb(), 1),
    }


def verdicts(
    args: argparse.Namespace, figures: dict[str, Any], result: Result
) -> dict[str, bool | None] | None:
    """Each target met, not met, or None (not measured; or a timeout makes a passing figure meaningless)."""
    limits = TARGETS.get((args.nodes, args.pending, args.running, args.queues))
    if limits is None or args.gpus_per_node != 8:
        return None
    met: dict[str, bool | None] = {}
    for key, limit in limits.items():
        value = figures[key]
        met[key] = None if value is None or (result.timeouts and value <= limit) else value <= limit
    return met


def print_table(args: argparse.Namespace, figures: dict[str, Any], result: Result) -> None:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    table = Table(
        title=f"scheduler cycle (seed {args.seed}; {len(result.cycle_ms)} full, "
        f"{len(result.steady_ms)} steady cycles)"
    )
    columns = [
        "nodes",
        "gpus",
        "pending",
        "running",
        "queues",
        "cycle ms p50",
        "cycle ms p99",
        "steady ms p50",
        "peak RSS MB",
        "binds/cycle",
        "evictions/cycle",
    ]
    for title in columns:
        table.add_column(title, justify="right")
    table.add_row(
        str(args.nodes),
        str(args.nodes * args.gpus_per_node),
        str(args.pending),
        str(args.running),
        str(args.queues),
        ms(figures["cycle_ms_p50"]),
        ms(figures["cycle_ms_p99"]),
        ms(figures["steady_ms_p50"]),
        f"{figures['peak_rss_mb']:.0f}",
        str(result.binds),
        str(result.evictions),
    )
    console.print(table)
    build_p50 = percentile(result.build_s, 50) if result.build_s else float("nan")
    console.print(
        f"scheduler: {'compiled (mypyc)' if NATIVE else 'pure Python'}; "
        f"snapshot build (not in the cycle): p50 {build_p50:.2f}s over {len(result.build_s)} builds; "
        f"RSS after the first build {result.rss_after_build_mb:.0f} MB"
    )
    if result.settled is not None:
        console.print(
            f"steady state: {'settled' if result.settled else 'NOT settled'} after "
            f"{len(result.settle_ms)} post-bind cycle(s) [{', '.join(ms(v) for v in result.settle_ms)}] ms"
        )
    if result.steady_full_ms:
        console.print(
            f"steady cycles: {result.steady_answers_from_memory} of {len(result.steady_ms)} answered from "
            "the "
            f"Scheduler's memory; a full cycle on the same snapshot without it: p50 "
            f"{ms(percentile(result.steady_full_ms, 50))} ms"
        )
    if result.tracemalloc_peak_mb is not None:
        console.print(f"tracemalloc peak of one decide: {result.tracemalloc_peak_mb:.0f} MB")
    if not result.deterministic:
        console.print("[red]decide gave different decisions for equal snapshots[/red]")
    if result.unexplained_pending:
        console.print(
            f"[yellow]{result.unexplained_pending} pending workloads neither bound nor explained[/yellow]"
        )
    if result.problem_count:
        console.print(
            f"[red]{result.problem_count} invalid decisions[/red], e.g. " + "; ".join(result.problems[:3])
        )
    if result.timeouts:
        phases = ", ".join(t["phase"] for t in result.timeouts)
        console.print(
            f"[red]{len(result.timeouts)} decide(s) ran past {args.cycle_timeout:g}s ({phases}); each counts "
            "as the timeout, so the figures above are lower bounds[/red]"
        )
    for note in result.stopped_early:
        console.print(f"[yellow]stopped early: {note}[/yellow]")


def main() -> int:
    args = parse_args()
    spec = spec_of(args)
    result = Result()
    budget = Budget(args.max_seconds)
    stats: ClusterStats | None = None
    last: Snapshot | None = None
    try:
        last, decisions, stats = full_cycles(args, spec, result, budget)
        if decisions is not None:
            steady_cycles(args, last, decisions, result, budget)
    except Exception as exc:  # the core under test may be mid-rewrite: report, don't hide the traceback
        result.error = f"{type(exc).__name__}: {exc}"
        console.print(traceback.format_exc(), markup=False, highlight=False)
    if result.error is None and last is not None and not result.timeouts:
        try:
            if args.tracemalloc:
                result.tracemalloc_peak_mb = heap_peak_mb(last, args.cycle_timeout * 5)
            if args.profile:
                profile(
                    last,
                    args.profile,
                    args.cycle_timeout * 3,
                    (args.json or RESULTS_DIR / NAME).with_suffix(".prof"),
                )
        except CycleTimeout as exc:
            console.print(f"[yellow]tracemalloc/profile run abandoned: {exc}[/yellow]")

    figures = summary(args, result)
    met = verdicts(args, figures, result)
    print_table(args, figures, result)
    if result.error:
        console.print(f"[red]decide failed: {result.error}[/red]", highlight=False)
    if met is not None:
        console.print(
            "targets: "
            + ", ".join(
                f"{key} {'-' if ok is None else ('[green]met[/green]' if ok else '[red]NOT met[/red]')}"
                for key, ok in met.items()
            )
        )
    path = write_results(
        NAME,
        {
            "benchmark": NAME,
            "nodes": args.nodes,
            "gpus_per_node": args.gpus_per_node,
            "pending": args.pending,
            "running": args.running,
            "queues": args.queues,
            "cycles": args.cycles,
            "seed": args.seed,
            "native": NATIVE,  # the mypyc-compiled scheduler (tools/build_native.py) or its source
            **figures,
            "cycle_ms": [round(v, 3) for v in result.cycle_ms],
            "steady_ms": [round(v, 3) for v in result.steady_ms],
            "settle_ms": [round(v, 3) for v in result.settle_ms],
            "settled": result.settled,
            "settle_rounds": result.settle_rounds,
            "steady_definition": "decide on the same snapshot object as the previous call, after applying "
            "post-bind cycles until one decided nothing (or --settle-rounds ran out); "
            f"the clock advances {args.tick:g}s a cycle",
            "snapshot_build_s": [round(v, 3) for v in result.build_s],
            "rss_after_build_mb": round(result.rss_after_build_mb, 1),
            "tracemalloc_peak_mb": None
            if result.tracemalloc_peak_mb is None
            else round(result.tracemalloc_peak_mb, 1),
            "binds_per_cycle": result.binds,
            "evictions_per_cycle": result.evictions,
            "eviction_codes": result.eviction_codes,
            "unexplained_pending": result.unexplained_pending,
            "deterministic": result.deterministic,
            "invalid_decisions": result.problem_count,
            "invalid_examples": result.problems,
            "cluster": None if stats is None else asdict(stats),
            "stopped_early": result.stopped_early,
            "error": result.error,
            "cycle_timeout_s": args.cycle_timeout,
            "timeouts": result.timeouts,
            "targets": TARGETS.get((args.nodes, args.pending, args.running, args.queues)),
            "targets_met": met,
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": machine(),
        },
        args.json,
    )
    console.print(f"[dim]wrote {path}[/dim]")
    return 1 if result.error else 0


if __name__ == "__main__":
    sys.exit(main())
