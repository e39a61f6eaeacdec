"""Submit-to-running latency: how long one job waits on an idle node before the pool starts it.

Jobs (`sleep 0.2`, 1 GPU) are submitted one at a time. After each POST the client polls
GET /api/v1/workloads/{id} every --poll-ms (10 ms) and records:
  * from_201: from the moment the POST returned 201 to the first observation of a state past pending
  * from_post: the same, from just before the POST was sent (includes the submit itself)
  * to_pid: from the 201 to the first observation of the attempt's pid (the process exists)
The next job is submitted only after the previous one has finished, so every job meets an idle node and
an idle control loop: the figure is the latency of a lone submit, not of a backlog. Each run starts its
own `gpupool server --gpus sim:8xH100` on 127.0.0.1 with a fresh GPUPOOL_HOME (SQLite by default).

"Running" is the state the server commits just before it spawns the process; to_pid shows when the
process had been started. Polling adds up to --poll-ms (plus one GET) to every figure.

Target (issue): p50 (from_201) <= 0.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from harness import (
    HOST,
    BenchServer,
    Column,
    HttpError,
    RawConnection,
    add_run_options,
    console,
    median_of_runs,
    percentile,
    print_runs,
    save_report,
    verdict,
    warn_shared_db,
)

NAME = "submit_to_running"
TARGET_P50_S = 0.5
TERMINAL = ("succeeded", "failed", "cancelled")


class Failed(RuntimeError):
    pass


async def one_job(conn: RawConnection, body: bytes, poll: float, finish_timeout: float) -> dict[str, Any]:
    t_post = time.perf_counter()
    status, data = await conn.request("POST", "/api/v1/workloads", body)
    t_201 = time.perf_counter()
    if status != 201:
        raise Failed(f"submit answered {status}: {data[:200]!r}")
    wid = int(json.loads(data)["id"])
    t_running = t_pid = None
    state = "pending"
    deadline = t_201 + finish_timeout
    while time.perf_counter() < deadline:
        status, data = await conn.request("GET", f"/api/v1/workloads/{wid}")
        now = time.perf_counter()
        if status != 200:
            raise Failed(f"GET workload {wid} answered {status}: {data[:200]!r}")
        view = json.loads(data)
        state = view["state"]
        if t_running is None and state != "pending":
            t_running = now
        attempts = view.get("attempt_list") or []
        if t_pid is None and attempts and attempts[-1].get("pid"):
            t_pid = now
        if state in TERMINAL:
            break
        await asyncio.sleep(poll)
    if t_running is None:
        raise Failed(f"workload {wid} still pending after {finish_timeout:g}s")
    return {
        "id": wid,
        "state": state,
        "from_201_s": t_running - t_201,
        "from_post_s": t_running - t_post,
        "to_pid_s": (t_pid - t_201) if t_pid is not None else None,
        "submit_s": t_201 - t_post,
    }


async def drive(server: BenchServer, args: argparse.Namespace) -> tuple[list[dict[str, Any]], int]:
    body = json.dumps({"commands": [args.command], "resources": {"gpu": 1}}).encode()
    conn = RawConnection(HOST, server.port, server.token)
    poll = args.poll_ms / 1000
    try:
        for _ in range(args.warmup):
            await one_job(conn, body, poll, args.job_timeout)
        jobs, errors = [], 0
        deadline = time.monotonic() + args.max_seconds
        while len(jobs) + errors < args.jobs and time.monotonic() < deadline:
            try:
                jobs.append(await one_job(conn, body, poll, args.job_timeout))
            except (Failed, HttpError, OSError) as exc:
                errors += 1
                console.print(f"[red]error:[/red] {exc}")
        return jobs, errors
    finally:
        await conn.close()


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    with BenchServer(db_url=args.db, log_level=args.log_level) as server:
        t0 = time.perf_counter()
        jobs, errors = asyncio.run(drive(server, args))
        wall = time.perf_counter() - t0
    from_201 = [j["from_201_s"] for j in jobs]
    from_post = [j["from_post_s"] for j in jobs]
    to_pid = [j["to_pid_s"] for j in jobs if j["to_pid_s"] is not None]
    return {
        "jobs": len(jobs),
        "errors": errors,
        "not_succeeded": sum(1 for j in jobs if j["state"] != "succeeded"),
        "seconds": wall,
        "p50_s": percentile(from_201, 50),
        "p90_s": percentile(from_201, 90),
        "p99_s": percentile(from_201, 99),
        "max_s": max(from_201) if from_201 else float("nan"),
        "from_post_p50_s": percentile(from_post, 50),
        "from_post_p99_s": percentile(from_post, 99),
        "to_pid_p50_s": percentile(to_pid, 50),
        "to_pid_p99_s": percentile(to_pid, 99),
        "hit_time_limit": len(jobs) + errors < args.jobs,
        "samples": jobs,
    }


def _s(v: float) -> str:
    return f"{v:.3f}"


COLUMNS = [
    Column("jobs", "jobs", lambda v: f"{v:.0f}"),
    Column("errors", "errors", lambda v: f"{v:.0f}"),
    Column("p50_s", "p50 s", _s),
    Column("p90_s", "p90 s", _s),
    Column("p99_s", "p99 s", _s),
    Column("max_s", "max s", _s),
    Column("from_post_p50_s", "p50 from POST s", _s),
    Column("to_pid_p50_s", "p50 to pid s", _s),
    Column("to_pid_p99_s", "p99 to pid s", _s),
    Column("seconds", "run s", lambda v: f"{v:.1f}"),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200, help="measured jobs per run (default 200)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured jobs first (default 3)")
    parser.add_argument("--command", default="sleep 0.2", help="the job's command (default 'sleep 0.2')")
    parser.add_argument("--poll-ms", type=float, default=10.0, help="poll interval in ms (default 10)")
    parser.add_argument(
        "--job-timeout",
        type=float,
        default=60.0,
        help="give up on a job not finished after this many seconds (default 60)",
    )
    add_run_options(
        parser, NAME, max_seconds=300.0, max_seconds_help="stop submitting after this long (default 300)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    warn_shared_db(args.db, args.repeat)
    runs = []
    for i in range(args.repeat):
        console.print(
            f"[dim]run {i + 1}/{args.repeat}: {args.warmup} warm-up + {args.jobs} jobs one at a time, "
            f"poll every {args.poll_ms:g} ms[/dim]"
        )
        runs.append(one_run(args))
    keys = [c.key for c in COLUMNS]
    median = median_of_runs(runs, keys)
    met = median["p50_s"] <= TARGET_P50_S and median["errors"] == 0
    print_runs(
        f"submit to running: {args.jobs} jobs ({args.command!r}), one at a time on an idle node "
        f"(latency from the 201)",
        runs,
        COLUMNS,
        median,
    )
    console.print(f"target p50 <= {TARGET_P50_S:g} s: {verdict(met)} (median p50 {median['p50_s']:.3f} s)")
    save_report(NAME, args, runs, keys, median, {"p50_s_max": TARGET_P50_S}, met)


if __name__ == "__main__":
    main()
