"""The head's telemetry cost, in-process (no server): taking in GPU samples, saving history to disk, reading
it back at a start.

1. `TelemetryCache.put`: N nodes x 8 simulated GPU samples per round (half the GPUs held by a workload),
   one round per simulated second; CPU microseconds per GPU sample (process time, so other load on the
   machine inflates it less than wall time would).
2. `TelemetryLog.append`: the 10 s and 1 min points those rounds completed, saved as the head does every
   10 s; CPU microseconds and bytes on disk per point.
3. A restart: a full day of saved history for M nodes x 8 GPUs is written (the log keeps the last 2 h of
   10 s points and 24 h of 1 min points: 2,160 points per GPU), then read back (`TelemetryLog.load` +
   `TelemetryCache.restore`, what the head's save thread does at start, while the head already serves).

    .venv/bin/python benchmarks/telemetry_history.py [--nodes 1000] [--rounds 120] [--restore-nodes 16]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness import console, machine, write_results
from rich.table import Table

from gpupool.control.telemetry import SAVED_FROM, Holder, SavedPoint, TelemetryCache
from gpupool.control.telemetry_log import TelemetryLog
from gpupool.gpu.simulated import SimulatedProvider

GPUS = 8


def ingest(nodes: int, rounds: int, directory: Path) -> dict[str, float]:
    rows = [s.to_dict() for s in SimulatedProvider(f"sim:{GPUS}xH100", seed="bench").sample(0.0)]
    held = {
        (f"n{n}", i): [Holder(1, "train", "nlp", "alice")] for n in range(nodes) for i in range(GPUS // 2)
    }
    cache = TelemetryCache(allocations=lambda: held, saved_from=SAVED_FROM)
    history = TelemetryLog(directory)
    put_us, saved, save_seconds = [], 0, 0.0
    for second in range(rounds + 1):
        batch = [[{**r, "at": float(second)} for r in rows] for _ in range(nodes)]
        began = time.process_time()
        for n in range(nodes):
            cache.put(f"n{n}", batch[n])
        if second:  # round 0 creates the series
            put_us.append((time.process_time() - began) / (nodes * GPUS) * 1e6)
        if second % 10 == 0:
            points = cache.take_unsaved()
            began = time.process_time()
            history.append(points, now=float(second))
            save_seconds += time.process_time() - began
            saved += len(points)
    return {
        "put_us_per_sample_median": statistics.median(put_us),
        "put_us_per_sample_min": min(put_us),
        "saved_points": saved,
        "save_us_per_point": save_seconds / max(saved, 1) * 1e6,
        "disk_bytes_per_point": history.size() / max(saved, 1),
    }


def restart(nodes: int, directory: Path) -> dict[str, float]:
    history = TelemetryLog(directory, max_bytes=1 << 40)
    day = 86400
    for start in range(0, day, 600):  # ten minutes of points per append, as the head's saves add up to
        batch = [
            SavedPoint(f"n{n}", gpu, resolution, (float(at), 50.0, 4e10, 60.0, 400.0))
            for resolution in (10.0, 60.0)
            for at in range(start, start + 600, int(resolution))
            for n in range(nodes)
            for gpu in range(GPUS)
        ]
        history.append(batch, now=float(start + 600))
    began = time.perf_counter()
    cache = TelemetryCache(saved_from=SAVED_FROM)
    restored = cache.restore(TelemetryLog(directory, max_bytes=1 << 40).load(now=float(day)))
    seconds = time.perf_counter() - began
    return {
        "restore_points": restored,
        "restore_seconds": seconds,
        "restore_bytes": history.size(),
        "restore_us_per_point": seconds / max(restored, 1) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--nodes", type=int, default=1000, help="nodes of 8 GPUs sending samples (default 1000)"
    )
    parser.add_argument(
        "--rounds", type=int, default=120, help="rounds of samples, one per second (default 120)"
    )
    parser.add_argument(
        "--restore-nodes", type=int, default=16, help="nodes in the day restored (default 16)"
    )
    parser.add_argument("--output", type=Path, default=None, help="JSON path (default benchmarks/results/)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures = ingest(args.nodes, args.rounds, Path(tmp) / "ingest")
        figures |= restart(args.restore_nodes, Path(tmp) / "restart")
    title = (
        f"telemetry: {args.nodes} nodes x {GPUS} GPUs, {args.rounds} s; a day of {args.restore_nodes} nodes"
    )
    table = Table(title=title)
    table.add_column("what")
    table.add_column("figure", justify="right")
    table.add_row(
        "put, CPU us per GPU sample (median of rounds)", f"{figures['put_us_per_sample_median']:.2f}"
    )
    table.add_row("save, CPU us per history point", f"{figures['save_us_per_point']:.2f}")
    table.add_row("disk bytes per history point", f"{figures['disk_bytes_per_point']:.1f}")
    table.add_row(
        f"restore {figures['restore_points']:,} points ({figures['restore_bytes'] / 2**20:.0f} MiB), s",
        f"{figures['restore_seconds']:.2f}",
    )
    console.print(table)
    config = {"nodes": args.nodes, "rounds": args.rounds, "restore_nodes": args.restore_nodes}
    payload = {"benchmark": "telemetry_history", "config": config, "machine": machine(), **figures}
    path = write_results("telemetry_history", payload, args.output)
    console.print(f"[dim]wrote {path}[/dim]")


if __name__ == "__main__":
    main()
