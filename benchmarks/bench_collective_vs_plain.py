"""`gpupool bench collective` beside a plain torch.distributed timing loop, in the same processes.

Does our harness (prebuilt buffers and launch closures, the nccl-tests timing, the averaging over ranks)
report the bandwidth a hand-written loop sees? For every size, each round times the same operation twice
on the same ranks, in alternating order: once through gpupool.bench.collective_torch (`OpBuffers` +
`time_op`, exactly what the CLI runs) and once through a plain loop (`PlainLoop`):

    x = torch.ones(count); ...warm-up...; dist.barrier(); t0 = perf_counter()
    for _ in range(n): dist.all_reduce(x)
    t = (perf_counter() - t0) / n

Both keep their buffers for all the rounds of a size and refill them before each timing, so only the
timing code differs. Both times are averaged over the ranks and busbw computed with the same formula.
The table shows, per size, the median busbw of the rounds and three ratios ours / plain: of the medians;
the median of the per-round ratios (each pair ran back to back, so it shares the machine's state); and
of the best rounds (the highest busbw of each: the rounds least disturbed by other work, since
interference only ever adds time). Rounds per size: as many as --seconds-per-size allows, between
--rounds-min and --rounds-max. Target: the median paired ratio within 5% at every size. (On a shared
2-core machine a gloo round takes 1x or 10x its usual time depending on whether a rank was descheduled,
so the medians of ours and plain, taken over different rounds, move more than the paired ratio.)

    .venv/bin/python benchmarks/bench_collective_vs_plain.py                  # gloo, 2 and 4 ranks
    .venv/bin/python benchmarks/bench_collective_vs_plain.py --nproc 2 --rounds-max 9 --maxbytes 1M
"""

from __future__ import annotations

import argparse
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
from gpupool.bench.collective_torch import CollectiveConfig, OpBuffers, time_op
from gpupool.bench.launch_torch import Rank

NAME = "bench_collective_vs_plain"


class PlainLoop:
    """The loop a person writes from the torch.distributed docs: one tensor, warm-up, barrier, n calls."""

    def __init__(self, ctx: Rank, op: str, count: int) -> None:
        n = ctx.world_size
        self.op = op
        self.x = torch.ones(count * (n if op in ("reduce_scatter", "alltoall") else 1))
        self.y = torch.empty(count * (n if op == "all_gather" else 1))

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
        elif self.op == "broadcast":
            dist.broadcast(x, src=0)
        else:
            raise ValueError(f"no plain loop for {self.op}")

    def seconds(self, iters: int, warmup: int) -> float:
        """Seconds per operation."""
        self.x.fill_(1.0)
        for _ in range(warmup):
            self.once()
        dist.barrier()
        began = time.perf_counter()
        for _ in range(iters):
            self.once()
        return (time.perf_counter() - began) / iters


def compare(ctx: Rank, ops: list[str], sizes: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    dtype = DTYPES["float"]
    cfg = CollectiveConfig(
        tuple(ops), "float", sizes[0], sizes[-1], 2, args.iters, args.warmup, False, table="none"
    )
    results = []
    for name in ops:
        op = OPS[name]
        plans, _ = plan_sizes(op, dtype, ctx.world_size, sizes)
        for plan in plans:
            # Both keep their buffers for every round of the size: what differs is only the timing code.
            buffers = OpBuffers(ctx, op, plan, torch.float32, in_place=not op.out_of_place)
            plain_loop = PlainLoop(ctx, name, plan.counts.param)
            ours: list[float] = []
            plain: list[float] = []
            rounds, r = args.rounds_min, 0
            while r < rounds:
                began = time.perf_counter()
                # Alternate which goes first, so neither always runs on a warmer cache or a quieter moment.
                order = ("ours", "plain") if r % 2 == 0 else ("plain", "ours")
                seconds = {}
                for which in order:
                    if which == "ours":
                        buffers.fill()  # as the CLI starts each size: in-place sums stay finite
                        seconds[which] = time_op(ctx, buffers.launch, cfg)
                    else:
                        seconds[which] = plain_loop.seconds(args.iters, args.warmup)
                times = torch.tensor([seconds["ours"], seconds["plain"]], dtype=torch.float64)
                dist.all_reduce(times)  # mean over the ranks, as nccl-tests reports
                o, p = (
                    cell(op, plan.size, ctx.world_size, t / ctx.world_size * 1e6, 0).busbw
                    for t in times.tolist()
                )
                ours.append(o)
                plain.append(p)
                if r == 0:  # as many rounds as the time budget allows, the same number on every rank
                    took = torch.tensor([time.perf_counter() - began], dtype=torch.float64)
                    dist.all_reduce(took, op=dist.ReduceOp.MAX)
                    fit = int(args.seconds_per_size / max(float(took[0]), 1e-6))
                    rounds = max(args.rounds_min, min(args.rounds_max, fit))
                r += 1
            del buffers, plain_loop
            if ctx.leader:
                ratios = [a / b for a, b in zip(ours, plain, strict=True)]
                mo, mpl = statistics.median(ours), statistics.median(plain)
                results.append(
                    {
                        "op": name,
                        "nranks": ctx.world_size,
                        "size": plan.size,
                        "rounds": len(ours),
                        "ours_busbw": mo,
                        "plain_busbw": mpl,
                        "ratio_of_medians": mo / mpl,
                        "median_paired_ratio": statistics.median(ratios),
                        "ratio_of_best": max(ours) / max(plain),  # the rounds least disturbed by other work
                        "ours_rounds": ours,
                        "plain_rounds": plain,
                    }
                )
                harness.console.print(
                    f"[dim]{name} n={ctx.world_size} {plan.size:>10d} B, {len(ours)} rounds: ours {mo:.4f} "
                    f"plain {mpl:.4f} GB/s, ratio of medians {mo / mpl:.3f}, "
                    f"median paired ratio {statistics.median(ratios):.3f}[/dim]"
                )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[2, 4], help="rank counts (default 2 4)")
    parser.add_argument("--ops", default="all_reduce", help="comma list of all_reduce, all_gather, "
                        "reduce_scatter, alltoall, broadcast (default all_reduce)")  # fmt: skip
    parser.add_argument("--minbytes", default="1K")
    parser.add_argument("--maxbytes", default="64M")
    parser.add_argument("--stepfactor", type=int, default=4)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds-min", type=int, default=7, help="alternating pairs per size, at least")
    parser.add_argument("--rounds-max", type=int, default=61, help="... and at most (default 61)")
    parser.add_argument(
        "--seconds-per-size", type=float, default=8.0, help="time budget that sets the rounds"
    )
    parser.add_argument("--output", type=Path, default=None, help=f"JSON path (default results/{NAME}.json)")
    args = parser.parse_args()
    ops = [o.strip() for o in args.ops.split(",")]
    sizes = list(size_steps(parse_size(args.minbytes, "--minbytes"), parse_size(args.maxbytes, "--maxbytes"),
                            args.stepfactor))  # fmt: skip
    machine = harness.machine()
    rows: list[dict[str, Any]] = []
    for nproc in args.nproc:
        rows += launch_torch.run(compare, (ops, sizes, args), nproc=nproc, backend="gloo")
    table = Table(
        title="busbw (GB/s), gloo on CPU: gpupool bench collective vs a plain torch.distributed loop"
    )
    columns = (
        "op",
        "ranks",
        "size (B)",
        "rounds",
        "ours",
        "plain",
        "ratio of medians",
        "median paired ratio",
        "ratio of best",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for r in rows:
        style = "" if abs(r["median_paired_ratio"] - 1) <= 0.05 else "red"
        ratios = (r["ratio_of_medians"], r["median_paired_ratio"], r["ratio_of_best"])
        table.add_row(r["op"], str(r["nranks"]), str(r["size"]), str(r["rounds"]), f"{r['ours_busbw']:.4f}",
                      f"{r['plain_busbw']:.4f}", *(f"{x:.3f}" for x in ratios), style=style)  # fmt: skip
    harness.console.print(table)
    worst = max(abs(r["median_paired_ratio"] - 1) for r in rows)
    met = worst <= 0.05
    harness.console.print(f"largest deviation {worst * 100:.1f}% (target <= 5%): {harness.verdict(met)}")
    path = harness.write_results(
        NAME,
        {
            "benchmark": NAME,
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": machine,
            "rows": rows,
            "largest_deviation": worst,
            "target": {"largest_deviation": 0.05},
            "target_met": met,
        },
        args.output,
    )
    harness.console.print(f"[dim]wrote {path}[/dim]")


if __name__ == "__main__":
    main()
