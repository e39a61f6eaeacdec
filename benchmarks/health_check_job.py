"""What running the active health checks as a job costs: `POST /api/v1/health/run` of one idle node, one
check at a time, on `gpupool server --gpus sim:8xH100` (simulated GPUs, so the checks themselves take
milliseconds and what is measured is the path: submit and bind by the control loop, the job's process,
its end observed, its result read from its log, the verdict).

    .venv/bin/python benchmarks/health_check_job.py [--checks 10] [--repeat 3]

Per run: p50 and max of the request's wall time, and the median of the job's own time (its attempt's start
to its end as the store records them). The code under test is the `gpupool` on the path: give
PYTHONPATH=<exported snapshot>/src to measure another commit (before check jobs, the same request ran the
simulated checks in the head's process).
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import datetime
from typing import Any

from harness import (
    NODE,
    BenchServer,
    Column,
    add_run_options,
    console,
    median_of_runs,
    percentile,
    print_runs,
    save_report,
)

NAME = "health_check_job"
KEYS = ("p50_s", "max_s", "job_s")


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    with BenchServer(db_url=args.db, log_level=args.log_level) as server, server.http() as client:
        times, job_times = [], []
        for _ in range(args.checks):
            began = time.perf_counter()
            answer = client.post("/api/v1/health/run", json={"node": NODE, "level": "quick"}, timeout=600)
            times.append(time.perf_counter() - began)
            answer.raise_for_status()
            (report,) = answer.json()
            if report["health"] != "healthy":
                raise RuntimeError(f"check not healthy: {report['evidence']}")
            job = (report.get("active") or {}).get("job")
            if job is not None:
                attempt = client.get(f"/api/v1/workloads/{job}").json()["attempt_list"][-1]
                started = datetime.fromisoformat(attempt["started_at"])
                finished = datetime.fromisoformat(attempt["finished_at"])
                job_times.append((finished - started).total_seconds())
        return {
            "p50_s": percentile(times, 50),
            "max_s": max(times),
            "job_s": statistics.median(job_times) if job_times else 0.0,
            "checks": args.checks,
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checks", type=int, default=10, help="checks per run, one at a time (default 10)")
    add_run_options(parser, NAME, max_seconds=600, max_seconds_help="unused")
    args = parser.parse_args()
    runs = [one_run(args) for _ in range(args.repeat)]
    median = median_of_runs(runs, KEYS)
    columns = [
        Column("p50_s", "health run p50 s", lambda v: f"{v:.2f}"),
        Column("max_s", "max s", lambda v: f"{v:.2f}"),
        Column("job_s", "job start to end s", lambda v: f"{v:.2f}"),
    ]
    print_runs(f"quick health check of an idle 8-GPU node, {args.checks} per run", runs, columns, median)
    save_report(NAME, args, runs, KEYS, median, {}, True)
    console.print(f"median p50 {median['p50_s']:.2f} s")


if __name__ == "__main__":
    main()
