"""A node's active health checks as a gpupool job: `python -m gpupool.health.check_job --level quick`.

The head's health loop submits and binds it on the node, holding every GPU there (control/health_jobs.py).
It measures the GPUs the job holds, prints a table for the job's log, and ends with the result as one
marked line (`bench.results.result_line`, report kind "health_check") that the head reads from the log when
the job ends, as it reads a bench job's. The head judges the figures against its thresholds: exit status 0
means the checks ran (whatever they found), 1 that they could not (the report then carries the error).

`--simulated NODE`: the node's GPUs are simulated; their condition (injected slowdown, a GPU fallen off the
bus) comes from the head or agent that owns them (health/simulated_state.py). Otherwise torch measures the
real GPUs (health/active_torch.py, in a child process with its own timeout).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from gpupool.bench.results import result_line
from gpupool.health.active import ActiveCheckError, TorchRunner, simulated_result
from gpupool.health.checks import ActiveResult
from gpupool.health.simulated_state import SimulatedStateMissing, find
from gpupool.health.thresholds import LEVELS

REPORT_KIND = "health_check"  # the report's "kind": what the head looks for among the job's result lines


def measure(level: str, simulated: str | None) -> ActiveResult:
    began = time.monotonic()
    if simulated is None:
        return TorchRunner().run(level)
    published = find(simulated)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    held = {int(i) for i in visible.split(",") if i.strip().isdigit()} if visible else None
    gpus = [g for g in published["gpus"] if held is None or int(g["index"]) in held]
    return simulated_result(level, gpus, seconds=time.monotonic() - began)


def table(result: ActiveResult) -> str:
    """The figures as the job's log shows them."""
    lines = [
        f"{'GPU':>3}  {'MODEL':8} {'GEMM TFLOPS':>11} {'H2D GB/s':>9} {'D2H GB/s':>9} {'MEMTEST':>7}  ERROR"
    ]
    for g in result.gpus:
        cells = [g.gemm_tflops, g.h2d_gbps, g.d2h_gbps, g.memtest_errors]
        shown = ["-" if c is None else f"{c:g}" for c in cells]
        figures = f"{shown[0]:>11} {shown[1]:>9} {shown[2]:>9} {shown[3]:>7}"
        lines.append(f"{g.index:>3}  {g.model:8} {figures}  {g.error or ''}")
    if result.allreduce_busbw_gbps is not None:
        lines.append(f"all-reduce busbw {result.allreduce_busbw_gbps:g} GB/s over {len(result.gpus)} GPUs")
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--level", choices=LEVELS, default="quick")
    parser.add_argument("--simulated", metavar="NODE", help="the node whose simulated GPUs these are")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("GPUPOOL_NODE_RANK") or 0)
    where = f"node {args.simulated}" if args.simulated else "this node"
    print(f"gpupool health check: {args.level} active checks of {where}'s GPUs", flush=True)
    report: dict[str, Any] = {"kind": REPORT_KIND, "level": args.level}
    try:
        result = measure(args.level, args.simulated)
    except (ActiveCheckError, SimulatedStateMissing, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        print(result_line({**report, "error": str(exc)}, rank), flush=True)
        return 1
    print(table(result), flush=True)
    print(result_line({**report, "result": result.to_dict()}, rank), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
