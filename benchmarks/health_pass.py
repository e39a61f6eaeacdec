"""One pass of the head's health loop (`HealthMonitor.tick`) over N nodes of 8 simulated GPUs, in-process:
a real SQLite store with the nodes, their latest samples in the telemetry cache, every node healthy and
idle (no active checks due). Prints CPU milliseconds per pass (median of the passes) and per node.

    .venv/bin/python benchmarks/health_pass.py [--nodes 1000] [--passes 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness import console, machine, write_results

from gpupool.control.health import HealthMonitor
from gpupool.control.telemetry import TelemetryCache
from gpupool.gpu.simulated import SimulatedProvider
from gpupool.health.thresholds import HealthConfig
from gpupool.store.db import Store
from gpupool.store.models import Gpu, Node

GPUS = 8


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000, help="nodes of 8 GPUs (default 1000)")
    parser.add_argument("--passes", type=int, default=20, help="passes measured (default 20)")
    parser.add_argument("--output", type=Path, default=None, help="JSON path (default benchmarks/results/)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/gpupool.db")
        provider = SimulatedProvider(f"sim:{GPUS}xH100", seed="bench")
        with store.session() as s:
            for n in range(args.nodes):
                node = Node(name=f"n{n}", state="ready", state_reason="", labels={}, backend="agent")
                node.gpus = [
                    Gpu(index=d.index, uuid=f"{d.uuid}-{n}", model=d.model, product_name=d.name,
                        memory_bytes=d.memory_bytes, last_sample={})
                    for d in provider.devices()
                ]  # fmt: skip
                s.add(node)
        telemetry = TelemetryCache()
        samples = [s.to_dict() for s in provider.sample()]
        monitor = HealthMonitor(
            store, telemetry, HealthConfig(overrides={}), local_node="head", local_gpus=None
        )
        times = []
        for _ in range(args.passes + 1):
            now = time.time()
            for n in range(args.nodes):
                telemetry.put(f"n{n}", [{**r, "at": now, "uuid": f"{r['uuid']}-{n}"} for r in samples])
            began = time.process_time()
            monitor.tick(now)
            times.append(time.process_time() - began)
        store.close()
    per_pass = statistics.median(times[1:]) * 1000
    what = f"health pass over {args.nodes} nodes x {GPUS} GPUs"
    per_node = per_pass / args.nodes * 1000
    console.print(f"{what}: {per_pass:.1f} ms CPU (median of {args.passes}), {per_node:.0f} us per node")
    config = {"nodes": args.nodes, "passes": args.passes}
    passes = [round(t * 1000, 2) for t in times]
    payload = {
        "benchmark": "health_pass",
        "config": config,
        "machine": machine(),
        "pass_cpu_ms_median": per_pass,
    }
    payload["passes_cpu_ms"] = passes
    console.print(f"[dim]wrote {write_results('health_pass', payload, args.output)}[/dim]")


if __name__ == "__main__":
    main()
