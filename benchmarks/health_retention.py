"""What pruning finished check jobs costs the health loop (`CheckJobs.prune`, docs/telemetry.md "Retention"),
in-process on a real SQLite store: N nodes with K finished check jobs each (one every 6 hours, the newest
6 hours ago), default retention (newest 10 per node, 7 days). Prints the CPU and wall milliseconds of one
prune round (the selection, then up to 5,000 deletions in transactions of 500) and of the selection alone
once the round is done: the steady cost when nothing is past retention, the backlog cost when much is.

    .venv/bin/python benchmarks/health_retention.py [--nodes 1000] [--per-node 17] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import console, machine, write_results
from sqlalchemy import insert

from gpupool.control.health_jobs import CheckJobs, ensure_system_queue
from gpupool.health.thresholds import CheckJobRetention
from gpupool.spec.queue import SYSTEM_QUEUE
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Workload

SPACING = 6 * 3600.0  # seconds between a node's check jobs


def one_run(nodes: int, per_node: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/gpupool.db")
        ensure_system_queue(store)
        now = time.time()
        workloads, attempts = [], []
        for k in range(per_node):
            end = datetime.fromtimestamp(now - (per_node - k) * SPACING, UTC)
            for n in range(nodes):
                wid = len(workloads) + 1
                workloads.append({"id": wid, "name": f"health-quick-n{n}", "queue": SYSTEM_QUEUE,
                                  "user": "health", "spec": {}, "state": "succeeded", "created_at": end,
                                  "updated_at": end, "finished_at": end, "version": 1})  # fmt: skip
                attempts.append({"workload_id": wid, "number": 0, "state": "succeeded", "node_name": f"n{n}",
                                 "gpu_indices": list(range(8)), "pods": [], "started_at": end,
                                 "finished_at": end, "log_path": "", "run_dir": ""})  # fmt: skip
        with store.session() as s:
            s.execute(insert(Workload), workloads)
            s.execute(insert(Attempt), attempts)
        jobs, retention = CheckJobs(store), CheckJobRetention()
        cpu, wall = time.process_time(), time.perf_counter()
        deleted = jobs.prune(now, retention)
        round_cpu, round_wall = time.process_time() - cpu, time.perf_counter() - wall
        cpu, wall = time.process_time(), time.perf_counter()
        left = len(jobs.past_retention(now, retention, 1 << 30))
        select_cpu, select_wall = time.process_time() - cpu, time.perf_counter() - wall
        store.close()
    return {
        "deleted": deleted,
        "past_retention_after": left,
        "round_cpu_ms": round_cpu * 1000,
        "round_wall_ms": round_wall * 1000,
        "select_after_cpu_ms": select_cpu * 1000,
        "select_after_wall_ms": select_wall * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000, help="nodes (default 1000)")
    parser.add_argument("--per-node", type=int, default=17, help="finished check jobs per node (default 17)")
    parser.add_argument("--repeat", type=int, default=3, help="runs, each on a fresh store (default 3)")
    parser.add_argument("--output", type=Path, default=None, help="JSON path (default benchmarks/results/)")
    args = parser.parse_args()
    runs = [one_run(args.nodes, args.per_node) for _ in range(args.repeat)]
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    jobs = args.nodes * args.per_node
    console.print(
        f"{jobs:,} finished check jobs ({args.nodes} nodes x {args.per_node}), median of {args.repeat}: "
        f"a prune round deleted {median['deleted']:.0f} in {median['round_cpu_ms']:.0f} ms CPU "
        f"({median['round_wall_ms']:.0f} ms wall); then {median['past_retention_after']:.0f} left past "
        f"retention, selected in {median['select_after_cpu_ms']:.0f} ms CPU "
        f"({median['select_after_wall_ms']:.0f} ms wall)"
    )
    payload = {
        "benchmark": "health_retention",
        "config": {"nodes": args.nodes, "per_node": args.per_node, "repeat": args.repeat},
        "machine": machine(),
        "median": median,
        "runs": runs,
    }
    console.print(f"[dim]wrote {write_results('health_retention', payload, args.output)}[/dim]")


if __name__ == "__main__":
    main()
