"""`gpupool bench collective` beside a plain torch.distributed timing loop, in the same processes.

Does our harness report the bandwidth a hand-written loop sees? Per size, the same gloo processes time
the operation in rounds; each round has three timings, back to back, in an order that cycles through all
six permutations so every timing runs first, second and third equally often:

- ours: exactly what the CLI runs for one cell (`collective_torch.OpBuffers` + `time_op` + `mean_over_ranks`
  + `collective.cell`): warm-up, barrier, n launches, one wall-clock reading, mean over ranks;
- plain: `PlainLoop` below, written from the torch.distributed docs and importing nothing of ours:
      x = torch.ones(count); ...warm-up...; dist.barrier(); t0 = perf_counter()
      for _ in range(n): dist.all_reduce(x)
      t = (perf_counter() - t0) / n        # then the mean over ranks, busbw by nccl-tests' formula
- plain again: a second, independent PlainLoop with its own buffers. It is the control: plain again /
  plain is what two identical loops differ by on this machine at this moment (the noise floor).

Each round gives a paired ratio ours/plain (busbw; the two ran seconds apart, so they share the machine's
state) and a control ratio plain again/plain. Per size the table shows the median of each, the spread of
the rounds (25th to 75th percentile) and a distribution-free 95% confidence interval of the median (order
statistics of the binomial). Target: the median paired ratio within 5% at every size; the interval says
whether the run resolves that. The JSON also holds each round, the ratio with the max over ranks instead of
the mean (nccl-tests `-a 3`), the ratio split by which of ours and plain ran first, and each rank's CPU
share (CPU seconds of the process, gloo's threads included, per wall second) during the timings.

    .venv/bin/python benchmarks/bench_collective_vs_plain.py --nproc 2     # gloo, 1 KiB .. 64 MiB by x4
    .venv/bin/python benchmarks/bench_collective_vs_plain.py --nproc 2 4 --maxbytes 1M --seconds-per-size 5
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import harness
import torch
import torch.distributed as dist
from rich.table import Table

from gpupool.bench import launch_torch
from gpupool.bench.collective import DTYPES, OPS, cell, parse_size, plan_sizes, size_steps
from gpupool.bench.collective_torch import CollectiveConfig, OpBuffers, mean_over_ranks, time_op
from gpupool.bench.launch_torch import Rank

NAME = "bench_collective_vs_plain"
ARMS = ("ours", "plain", "plain_again")
ORDERS = list(itertools.permutations(range(len(ARMS))))  # six: each arm in each position twice
TOLERANCE = 0.05


class PlainLoop:
    """The loop a person writes from the torch.distributed docs: one tensor, warm-up, barrier, n calls.

    Independent of gpupool on purpose: its own buffers, its own size and bus-bandwidth arithmetic
    (nccl-tests' doc/PERFORMANCE.md), its own reduction of the time over the ranks.
    """

    BUS_FACTOR = {  # busbw / algbw for n ranks
        "all_reduce": lambda n: 2 * (n - 1) / n,
        "all_gather": lambda n: (n - 1) / n,
        "reduce_scatter": lambda n: (n - 1) / n,
        "alltoall": lambda n: (n - 1) / n,
        "broadcast": lambda n: 1.0,
    }

    def __init__(self, op: str, nranks: int, count: int) -> None:
        if op not in self.BUS_FACTOR:
            raise ValueError(f"no plain loop for {op}")
        self.op, self.nranks = op, nranks
        spread = op in ("all_gather", "reduce_scatter", "alltoall")  # a buffer holds every rank's part
        self.x = torch.ones(count * (nranks if op in ("reduce_scatter", "alltoall") else 1))
        self.y = torch.empty(count * (nranks if op in ("all_gather", "alltoall") else 1))
        self.size_bytes = count * (nranks if spread else 1) * 4  # float32; the larger buffer, as nccl-tests

    def once(self) -> None:
        x, y = self.x, self.y
        if self.op == "all_reduce":
            dist.all_reduce(x)
        elif self.op == "all_gather":
            dist.all_gather_into_tensor(y, x)
        elif self.op == "reduce_scatter":
            dist.reduce_scatter_tensor(y, x)
        elif self.op == "alltoall":
            dist.all_to_all_single(y, x)
        else:
            dist.broadcast(x, src=0)

    def seconds(self, iters: int, warmup: int) -> float:
        """Seconds per operation on this rank."""
        self.x.fill_(1.0)
        for _ in range(warmup):
            self.once()
        dist.barrier()
        began = time.perf_counter()
        for _ in range(iters):
            self.once()
        return (time.perf_counter() - began) / iters

    def busbw(self, seconds: float) -> float:
        """GB/s, from the time of one operation."""
        return self.size_bytes / seconds / 1e9 * self.BUS_FACTOR[self.op](self.nranks)


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: order statistics k and n-k+1, k the largest
    with P(Binomial(n, 1/2) < k) <= (1-level)/2; the whole range when n is too small for the level."""
    ordered = sorted(values)
    n = len(ordered)
    tail, k, below = (1 - level) / 2, 0, 0.0
    while k < n // 2:
        below += math.comb(n, k) / 2**n  # P(X <= k) after adding term k, i.e. P(X < k+1)
        if below > tail:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def summary(values: list[float]) -> dict[str, float]:
    low, high = median_ci(values)
    return {
        "median": statistics.median(values),
        "q25": harness.percentile(values, 25),
        "q75": harness.percentile(values, 75),
        "ci95_low": low,
        "ci95_high": high,
        "geomean": math.exp(statistics.fmean(math.log(v) for v in values)),
    }


def _more_rounds(done: int, began: float, args: argparse.Namespace) -> bool:
    """Whole cycles of the six orders until the size's time budget is spent (the same answer on every
    rank: the slowest rank's clock decides), at least --rounds-min and at most --rounds-max rounds."""
    if done % len(ORDERS):
        return True
    if done < args.rounds_min:
        return True
    if done >= args.rounds_max:
        return False
    elapsed = torch.tensor([time.perf_counter() - began], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed[0]) < args.seconds_per_size


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def calibrate(ctx: Rank, loop: PlainLoop, args: argparse.Namespace) -> tuple[int, int]:
    """Timed and warm-up iterations for one size, the same for every arm and rank: --iters and --warmup,
    or, where one timing of those would last over --max-timing-seconds, as many timed iterations as fit
    (at least 2) after one warm-up, as nccl-tests' one untimed iteration per size: more, shorter rounds."""
    probe = torch.tensor([loop.seconds(1, 1)], dtype=torch.float64)
    dist.all_reduce(probe, op=dist.ReduceOp.MAX)
    each = max(float(probe[0]), 1e-9)
    if args.max_timing_seconds <= 0 or each * (args.iters + args.warmup) <= args.max_timing_seconds:
        return args.iters, args.warmup
    return max(2, min(args.iters, int(args.max_timing_seconds / each) - 1)), 1


def compare(ctx: Rank, ops: list[str], sizes: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    dtype = DTYPES["float"]
    n = ctx.world_size
    base = CollectiveConfig(
        tuple(ops), "float", sizes[0], sizes[-1], 2, args.iters, args.warmup, False, check=False, table="none"
    )
    results = []
    for name in ops:
        op = OPS[name]
        plans, _ = plan_sizes(op, dtype, n, sizes)
        for plan in plans:
            # Every arm keeps its buffers for all the rounds of the size; only the timing code differs.
            buffers = OpBuffers(ctx, op, plan, torch.float32, in_place=not op.out_of_place)
            plain = PlainLoop(name, n, plan.counts.param)
            plain_again = PlainLoop(name, n, plan.counts.param)
            if plain.size_bytes != plan.size:
                raise RuntimeError(f"plain loop sizes {plain.size_bytes} B where ours sizes {plan.size} B")
            iters, warmup = calibrate(ctx, plain_again, args)
            cfg = dataclasses.replace(base, iters=iters, warmup=warmup)
            rounds_log: list[dict[str, Any]] = []
            loadavg = os.getloadavg()
            began, r = time.perf_counter(), 0
            while _more_rounds(r, began, args):
                order = [ARMS[i] for i in ORDERS[r % len(ORDERS)]]
                seconds, cpu_share, busbw, faults = {}, {}, {}, {}
                for arm in order:
                    wall0, cpu0 = time.perf_counter(), time.process_time()
                    if arm == "ours":
                        buffers.fill()  # as the CLI starts each cell: in-place sums stay finite
                        faults0 = _minor_faults()
                        s = time_op(ctx, buffers.launch, cfg)
                        faults[arm] = _minor_faults() - faults0
                        time_us, _ = mean_over_ranks(ctx, s * 1e6, 0)  # the CLI's reduction
                        busbw[arm] = cell(op, plan.size, n, time_us, 0).busbw
                    else:
                        loop = plain if arm == "plain" else plain_again
                        faults0 = _minor_faults()
                        s = loop.seconds(iters, warmup)
                        faults[arm] = _minor_faults() - faults0
                        mean = torch.tensor([s], dtype=torch.float64)
                        dist.all_reduce(mean)
                        busbw[arm] = loop.busbw(float(mean[0]) / n)
                    seconds[arm] = s
                    cpu_share[arm] = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
                # Per-rank figures, for the max over ranks and the CPU shares.
                mine = torch.tensor(
                    [seconds[a] for a in ARMS] + [cpu_share[a] for a in ARMS] + [faults[a] for a in ARMS],
                    dtype=torch.float64,
                )
                every = [torch.empty_like(mine) for _ in range(n)]
                dist.all_gather(every, mine)
                per_rank = torch.stack(every)
                rounds_log.append(
                    {
                        "order": order,
                        "busbw": busbw,
                        "max_over_ranks_us": dict(
                            zip(ARMS, (per_rank[:, :3].max(0).values * 1e6).tolist(), strict=True)
                        ),
                        "rank_seconds": {a: per_rank[:, i].tolist() for i, a in enumerate(ARMS)},
                        "cpu_share_mean": float(per_rank[:, 3:6].mean()),
                        # page faults per timed or warm-up iteration, mean over ranks: memory the
                        # operation maps afresh (gloo's temporaries when malloc hands out new pages)
                        "faults_per_iter": dict(
                            zip(ARMS, (per_rank[:, 6:].mean(0) / (iters + warmup)).tolist(), strict=True)
                        ),
                    }
                )
                r += 1
            del buffers, plain, plain_again
            if ctx.leader:
                results.append(_size_result(name, n, plan.size, iters, warmup, rounds_log, loadavg))
                row = results[-1]
                harness.console.print(
                    f"[dim]{name} n={n} {plan.size:>10d} B, {row['rounds']} rounds of {iters}+{warmup}: "
                    f"ours/plain "
                    f"{row['ratio']['median']:.3f} [{row['ratio']['q25']:.3f}, {row['ratio']['q75']:.3f}], "
                    f"control {row['control']['median']:.3f} [{row['control']['q25']:.3f}, "
                    f"{row['control']['q75']:.3f}], CPU share {row['cpu_share']:.2f}, "
                    f"load {loadavg[0]:.1f}[/dim]"
                )
    return results


def _size_result(
    op: str, n: int, size: int, iters: int, warmup: int, log: list[dict[str, Any]], loadavg: tuple[float, ...]
) -> dict[str, Any]:
    ratio = [x["busbw"]["ours"] / x["busbw"]["plain"] for x in log]
    control = [x["busbw"]["plain_again"] / x["busbw"]["plain"] for x in log]
    by_max = [x["max_over_ranks_us"]["plain"] / x["max_over_ranks_us"]["ours"] for x in log]
    first = [x["order"].index("ours") < x["order"].index("plain") for x in log]
    ours_first = [q for q, f in zip(ratio, first, strict=True) if f]
    plain_first = [q for q, f in zip(ratio, first, strict=True) if not f]
    s = summary(ratio)
    return {
        "op": op,
        "nranks": n,
        "size": size,
        "rounds": len(log),
        "iters": iters,
        "warmup": warmup,
        "busbw_median": {a: statistics.median(x["busbw"][a] for x in log) for a in ARMS},
        "ratio": s,
        "control": summary(control),
        "ratio_max_over_ranks": summary(by_max),
        "ratio_ours_first_median": statistics.median(ours_first),
        "ratio_plain_first_median": statistics.median(plain_first),
        "cpu_share": statistics.fmean(x["cpu_share_mean"] for x in log),
        "faults_per_iter_median": {a: statistics.median(x["faults_per_iter"][a] for x in log) for a in ARMS},
        "loadavg_at_start": list(loadavg),
        "within": abs(s["median"] - 1) <= TOLERANCE,
        "ci_within": s["ci95_low"] >= 1 - TOLERANCE and s["ci95_high"] <= 1 + TOLERANCE,
        "rounds_log": log,
    }


def _size_label(size: int) -> str:
    for unit, scale in (("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[2, 4], help="rank counts (default 2 4)")
    parser.add_argument(
        "--ops",
        default="all_reduce",
        help="comma list of all_reduce, all_gather, reduce_scatter, alltoall, broadcast (default all_reduce)",
    )
    parser.add_argument("--minbytes", default="1K")
    parser.add_argument("--maxbytes", default="64M")
    parser.add_argument("--stepfactor", type=int, default=4)
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per timing (nccl-tests -n)")
    parser.add_argument(
        "--max-timing-seconds",
        type=float,
        default=0.25,
        help="fewer timed iterations (1 warm-up) where --iters would take longer (default 0.25; 0: never)",
    )
    parser.add_argument("--warmup", type=int, default=5, help="warm-up iterations per timing (-w)")
    parser.add_argument("--rounds-min", type=int, default=6, help="rounds per size, at least (default 6)")
    parser.add_argument("--rounds-max", type=int, default=600, help="... and at most (default 600)")
    parser.add_argument(
        "--seconds-per-size",
        type=float,
        default=30.0,
        help="seconds of rounds per size (default 30), in whole cycles of the 6 orders",
    )
    parser.add_argument("--output", type=Path, default=None, help=f"JSON path (default results/{NAME}.json)")
    args = parser.parse_args()
    ops = [o.strip() for o in args.ops.split(",")]
    unknown = [o for o in ops if o not in PlainLoop.BUS_FACTOR]
    if unknown:
        parser.error(f"--ops {','.join(unknown)}: give {', '.join(PlainLoop.BUS_FACTOR)}")
    sizes = list(
        size_steps(
            parse_size(args.minbytes, "--minbytes"), parse_size(args.maxbytes, "--maxbytes"), args.stepfactor
        )
    )
    machine = harness.machine()
    began = time.time()
    rows: list[dict[str, Any]] = []
    for nproc in args.nproc:
        rows += launch_torch.run(compare, (ops, sizes, args), nproc=nproc, backend="gloo")
    table = Table(
        title="busbw (GB/s), gloo on CPU: gpupool bench collective vs a plain torch.distributed "
        "loop; ratios are medians of paired rounds [25th, 75th percentile]"
    )
    columns = (
        "op",
        "ranks",
        "size",
        "rounds",
        "iters+warm-up",
        "ours",
        "plain",
        "ours/plain",
        "95% CI of median",
        "control plain/plain",
        "CPU share",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for r in rows:
        q, c = r["ratio"], r["control"]
        table.add_row(
            r["op"],
            str(r["nranks"]),
            _size_label(r["size"]),
            str(r["rounds"]),
            f"{r['iters']}+{r['warmup']}",
            f"{r['busbw_median']['ours']:.4f}",
            f"{r['busbw_median']['plain']:.4f}",
            f"{q['median']:.3f} [{q['q25']:.3f}, {q['q75']:.3f}]",
            f"{q['ci95_low']:.3f} .. {q['ci95_high']:.3f}",
            f"{c['median']:.3f} [{c['q25']:.3f}, {c['q75']:.3f}]",
            f"{r['cpu_share']:.2f}",
            style="" if r["within"] else "red",
        )
    harness.console.print(table)
    worst = max(abs(r["ratio"]["median"] - 1) for r in rows)
    met = worst <= TOLERANCE
    resolved = sum(r["ci_within"] for r in rows)
    harness.console.print(
        f"largest deviation of the median paired ratio {worst * 100:.1f}% (target <= 5% at every size): "
        f"{harness.verdict(met)}; {resolved} of {len(rows)} sizes with the 95% interval inside 0.95 .. 1.05; "
        f"loadavg at the end {os.getloadavg()[0]:.1f}, {time.time() - began:.0f} s"
    )
    path = harness.write_results(
        NAME,
        {
            "benchmark": NAME,
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": machine,
            "loadavg_at_end": list(os.getloadavg()),
            "seconds": time.time() - began,
            "rows": rows,
            "largest_deviation": worst,
            "sizes_with_interval_inside": resolved,
            "target": {"largest_deviation": TOLERANCE},
            "target_met": met,
        },
        args.output,
    )
    harness.console.print(f"[dim]wrote {path}[/dim]")


if __name__ == "__main__":
    main()
