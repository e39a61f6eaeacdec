"""What stored bench results cost the head: the health loop's bench part and a /metrics scrape.

A real SQLite store (a temporary file) with --nodes nodes of 8 H100s, each with the newest results of a
full set of series: `gpupool bench collective --op all` (7 ops, 25 sizes each: 8 B .. 128 MiB), `gemm`
(8 GPUs x 4 sizes, bf16) and `train` (9 series per node). Then, per run:
  * refresh_unchanged_ms: BenchBook.refresh() when nothing new was recorded (the health loop's usual pass:
    the bench-job sweep and one max(id) query)
  * refresh_new_ms: record one new result, then refresh (reads what was added since the last pass)
  * verdicts_ms: BenchBook.verdict for every node, what the loop asks each pass (judged again only for
    nodes whose results changed: one did, in each run)
  * judge_ms: health.bench.judge for every node, without that cache, for comparison
  * metrics_ms: the bench series of one /metrics scrape, rendered as Prometheus text
  * whole_rows_ms: the newest result of every series read from the store with its full report (what
    every refresh after a new result did in the first version), for comparison in the same run

Target (set here, the issue gives none): the pass the loop makes every second (refresh_unchanged +
verdicts) under 100 ms at 1,000 nodes, a tenth of the loop's 1 s interval.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness import Column, console, median_of_runs, print_runs, save_report, verdict
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from gpupool.bench.collective import OPS
from gpupool.bench.results import summarize
from gpupool.control import bench
from gpupool.health.bench import judge
from gpupool.health.thresholds import parse_config
from gpupool.store.db import Store
from gpupool.store.models import BenchResult, Gpu, Node

NAME = "bench_results_health"
TARGET_MS = 100.0


def _cell(busbw: float) -> dict[str, Any]:
    return {"time_us": 100.0, "algbw": busbw, "busbw": busbw, "wrong": 0}


def _reports() -> list[dict[str, Any]]:
    sizes = [8 << i for i in range(25)]
    devices = [f"#  Rank {r} Group 0 Pid 1 on host device {r} [0x00] NVIDIA H100" for r in range(8)]
    rows = [
        dict(size=s, count=s // 4, type="float", redop="sum", root=-1, out_of_place=_cell(450.0),
             in_place=_cell(451.0))
        for s in sizes
    ]  # fmt: skip
    ops = [
        dict(op=op, nccl_test=f"{op}_perf", nranks=8, dtype="float", backend="nccl", device="cuda",
             min_bytes=8, max_bytes=sizes[-1], step_factor=2, iters=20, warmup_iters=5, blocking=False,
             devices=devices, rows=rows, avg_busbw=200.0, wrong=0)
        for op in OPS
    ]  # fmt: skip
    gemm_rows = [
        dict(device=f"cuda:{g}", device_name="NVIDIA H100 80GB HBM3", m=n, n=n, k=n, dtype="bf16",
             time_us=1.0, tflops=750.0, peak_tflops=989.0, fraction_of_peak=750.0 / 989.0)
        for g in range(8)
        for n in (2048, 4096, 8192, 16384)
    ]  # fmt: skip
    gemm = dict(benchmark="gemm", iters=20, warmup_iters=5, notes=[], rows=gemm_rows, best_tflops=750.0,
                best_fraction_of_peak=750.0 / 989.0)  # fmt: skip
    model = dict(layers=12, hidden=768, heads=12, seq=1024, vocab=50304, parameters=124_000_000)
    train = dict(benchmark="train", world_size=8, backend="nccl", device_name="NVIDIA H100 80GB HBM3",
                 model=model, parallel="ddp", precision="bf16", micro_batch=4, global_batch=32,
                 recompute=False, data="synthetic", iters=10, warmup_iters=2, iteration_time_s=0.5,
                 tokens_per_s=65536.0, tflops_per_gpu=400.0, mfu=0.4)  # fmt: skip
    return [{"ops": ops}, gemm, train]


def _fill(store: Store, nodes: int) -> list[str]:
    names = [f"node-{i:05d}" for i in range(nodes)]
    with store.session() as s:
        for name in names:
            node = Node(name=name)
            node.gpus = [Gpu(index=i, uuid=f"GPU-{name}-{i}", model="H100") for i in range(8)]
            s.add(node)
    summaries = [s for report in _reports() for s in summarize(report)]
    for name in names:  # one node at a time, as single-node bench jobs record them
        bench.record(store, summaries, [name], source="benchmark", actor="admin")
    return names


class _BenchSeries(Collector):
    """The bench part of the head's /metrics collector (control/metrics.py)."""

    def __init__(self, book: bench.BenchBook) -> None:
        self.book = book

    def collect(self) -> Iterator[Metric]:
        yield from bench.metric_families(self.book.every_latest())


def _ms(fn: Any) -> float:
    began = time.perf_counter()
    fn()
    return (time.perf_counter() - began) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gpupool-bench-results-") as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'gpupool.db'}")
        began = time.perf_counter()
        names = _fill(store, args.nodes)
        with store.read() as s:
            rows = s.scalar(select(func.count(BenchResult.id)))
        console.print(f"{args.nodes} nodes, {rows} results stored in {time.perf_counter() - began:.1f} s")
        book = bench.BenchBook(store)
        book.refresh()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_BenchSeries(book))
        config = parse_config(None)
        new = summarize(_reports()[1])
        runs = []
        for _ in range(args.repeat):
            run = {"refresh_unchanged_ms": _ms(book.refresh)}
            bench.record(store, new, [names[0]], source="benchmark", actor="admin")
            run["refresh_new_ms"] = _ms(book.refresh)
            now = time.time()
            run["verdicts_ms"] = _ms(lambda now=now: [book.verdict(n, config, now) for n in names])
            run["judge_ms"] = _ms(lambda now=now: [judge(book.latest(n), config, now) for n in names])
            run["metrics_ms"] = _ms(lambda: generate_latest(registry))

            def whole_rows() -> None:
                with store.read() as s:
                    newest = select(func.max(BenchResult.id)).group_by(
                        BenchResult.node_name, BenchResult.kind, BenchResult.key
                    )
                    list(s.scalars(select(BenchResult).where(BenchResult.id.in_(newest))))

            run["whole_rows_ms"] = _ms(whole_rows)
            run["loop_pass_ms"] = run["refresh_unchanged_ms"] + run["verdicts_ms"]
            runs.append(run)
        store.close()

    keys = [
        "refresh_unchanged_ms",
        "verdicts_ms",
        "loop_pass_ms",
        "judge_ms",
        "refresh_new_ms",
        "metrics_ms",
        "whole_rows_ms",
    ]
    median = median_of_runs(runs, keys)
    print_runs(
        f"bench results on the head: {args.nodes} nodes x 9 series (ms)",
        runs,
        [Column(k, k.removesuffix("_ms")) for k in keys],
        median,
    )
    met = median["loop_pass_ms"] < TARGET_MS
    console.print(f"health loop's bench part per pass: {median['loop_pass_ms']:.1f} ms (target < "
                  f"{TARGET_MS:g} ms): {verdict(met)}")  # fmt: skip
    save_report(NAME, args, runs, keys, median, {"loop_pass_ms": TARGET_MS}, met, results=rows)


if __name__ == "__main__":
    main()
