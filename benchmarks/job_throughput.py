"""Job throughput: how fast one simulated 8-GPU node works through a burst of trivial 1-GPU jobs.

--jobs (500) jobs `true` are submitted as fast as --clients (8) concurrent connections allow, while a
poller asks GET /api/v1/workloads?all=true&limit=100000 every --poll-s (0.25 s). The clock runs from
just before the first submit until the poll that sees every one of our jobs finished (succeeded, failed
or cancelled). Each job is a real process (the exit-status shim, then bash), at most 8 at a time since
each takes one of the 8 simulated GPUs. Each run starts its own `gpupool server --gpus sim:8xH100` on
127.0.0.1 with a fresh GPUPOOL_HOME (SQLite by default).

Also reported: the same span from the server's own timestamps (first created_at to last finished_at),
which excludes the poll interval, and the server's CPU time (its job processes included).

Target (issue): all 500 succeeded within 60 s.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import time
from typing import Any

from harness import (
    HOST,
    BenchServer,
    Column,
    RawConnection,
    add_run_options,
    console,
    median_of_runs,
    percentile,
    print_runs,
    save_report,
    submit_jobs,
    verdict,
    warn_shared_db,
)

NAME = "job_throughput"
TARGET_SECONDS = 60.0
TERMINAL = ("succeeded", "failed", "cancelled")


def _ts(value: str | None) -> float | None:
    return dt.datetime.fromisoformat(value).timestamp() if value else None


async def submit_all(
    server: BenchServer, args: argparse.Namespace, ids: list[int], errors: list[str]
) -> float:
    """Submit every job over --clients connections; returns perf_counter() when the last submit returned."""
    body = json.dumps({"commands": [args.command], "resources": {"gpu": 1}}).encode()
    await submit_jobs(server, body, args.jobs, args.clients, ids, errors)
    return time.perf_counter()


async def drive(server: BenchServer, args: argparse.Namespace) -> dict[str, Any]:
    ids: list[int] = []
    errors: list[str] = []
    poll_ms: list[float] = []
    rows: dict[int, dict[str, Any]] = {}
    done_at = None
    conn = RawConnection(HOST, server.port, server.token)
    t0 = time.perf_counter()
    submitting = asyncio.create_task(submit_all(server, args, ids, errors))
    try:
        while time.perf_counter() - t0 < args.max_seconds:
            await asyncio.sleep(args.poll_s)
            p0 = time.perf_counter()
            status, data = await conn.request("GET", "/api/v1/workloads?all=true&limit=100000")
            poll_ms.append(1000 * (time.perf_counter() - p0))
            if status != 200:
                errors.append(f"poll http {status}")
                continue
            ours = set(ids)
            rows = {int(w["id"]): w for w in json.loads(data) if int(w["id"]) in ours}
            finished = all(w["state"] in TERMINAL for w in rows.values())
            if submitting.done() and len(rows) == len(ids) and finished:
                done_at = time.perf_counter()
                break
    finally:
        if not submitting.done():
            submitting.cancel()
        await conn.close()
    submitted_at = submitting.result() if submitting.done() and not submitting.cancelled() else None
    return {
        "ids": ids,
        "errors": errors,
        "poll_ms": poll_ms,
        "rows": rows,
        "t0": t0,
        "done_at": done_at,
        "submitted_at": submitted_at,
    }


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    with BenchServer(db_url=args.db, log_level=args.log_level) as server:
        cpu0 = server.cpu_seconds()
        out = asyncio.run(drive(server, args))
        cpu = server.cpu_seconds() - cpu0
    rows, t0 = out["rows"], out["t0"]
    states: dict[str, int] = {}
    for w in rows.values():
        states[w["state"]] = states.get(w["state"], 0) + 1
    succeeded = states.get("succeeded", 0)
    complete = out["done_at"] is not None
    seconds = (out["done_at"] if complete else time.perf_counter()) - t0
    created = [t for t in (_ts(w.get("created_at")) for w in rows.values()) if t is not None]
    finished = [t for t in (_ts(w.get("finished_at")) for w in rows.values()) if t is not None]
    server_span = max(finished) - min(created) if complete and created and finished else float("nan")
    return {
        "jobs": args.jobs,
        "submitted": len(out["ids"]),
        "succeeded": succeeded,
        "not_succeeded": args.jobs - succeeded,
        "states": states,
        "errors": len(out["errors"]),
        "error_kinds": sorted(set(out["errors"])),
        "complete": complete,
        "seconds": seconds,
        "jobs_per_s": succeeded / seconds if seconds else 0.0,
        "server_span_s": server_span,
        "submit_s": (out["submitted_at"] - t0) if out["submitted_at"] else float("nan"),
        "server_cpu_s": cpu,
        "server_cpu_per_job_ms": 1000 * cpu / max(1, len(out["ids"])),
        "poll_p50_ms": percentile(out["poll_ms"], 50),
        "poll_max_ms": max(out["poll_ms"]) if out["poll_ms"] else float("nan"),
        "polls": len(out["poll_ms"]),
    }


COLUMNS = [
    Column("succeeded", "succeeded", lambda v: f"{v:.0f}"),
    Column("not_succeeded", "not succeeded", lambda v: f"{v:.0f}"),
    Column("seconds", "seconds", lambda v: f"{v:.2f}"),
    Column("jobs_per_s", "jobs/s", lambda v: f"{v:.2f}"),
    Column("server_span_s", "server span s", lambda v: f"{v:.2f}"),
    Column("submit_s", "all submitted s", lambda v: f"{v:.2f}"),
    Column("server_cpu_per_job_ms", "server CPU ms/job", lambda v: f"{v:.1f}"),
    Column("poll_p50_ms", "poll p50 ms", lambda v: f"{v:.1f}"),
    Column("poll_max_ms", "poll max ms", lambda v: f"{v:.1f}"),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=500, help="jobs per run (default 500)")
    parser.add_argument(
        "--clients", type=int, default=8, help="concurrent submitting connections (default 8)"
    )
    parser.add_argument("--command", default="true", help="the job's command (default 'true')")
    parser.add_argument("--poll-s", type=float, default=0.25, help="poll interval in seconds (default 0.25)")
    add_run_options(
        parser, NAME, max_seconds=300.0, max_seconds_help="give up on a run after this long (default 300)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    warn_shared_db(args.db, args.repeat)
    runs = []
    for i in range(args.repeat):
        console.print(
            f"[dim]run {i + 1}/{args.repeat}: {args.jobs} x {args.command!r} on one 8-GPU node, "
            f"{args.clients} submitting connections[/dim]"
        )
        runs.append(one_run(args))
    keys = [c.key for c in COLUMNS]
    median = median_of_runs(runs, keys)
    met = median["seconds"] <= TARGET_SECONDS and all(r["complete"] and r["not_succeeded"] == 0 for r in runs)
    print_runs(
        f"job throughput: {args.jobs} x {args.command!r}, 1 GPU each, one simulated 8xH100 node",
        runs,
        COLUMNS,
        median,
    )
    console.print(
        f"target all {args.jobs} succeeded in <= {TARGET_SECONDS:g} s: {verdict(met)} "
        f"(median {median['seconds']:.1f} s)"
    )
    save_report(NAME, args, runs, keys, median, {"seconds_max": TARGET_SECONDS}, met)


if __name__ == "__main__":
    main()
