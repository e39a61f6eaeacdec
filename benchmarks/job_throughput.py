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
from pathlib import Path
from typing import Any

from harness import (
    HOST,
    BenchServer,
    Column,
    HttpError,
    RawConnection,
    console,
    machine,
    median_of_runs,
    percentile,
    print_runs,
    spread_of_runs,
    verdict,
    write_results,
)

NAME = "job_throughput"
TARGET_SECONDS = 60.0
TERMINAL = ("succeeded", "failed", "cancelled")


def _ts(value: str | None) -> float | None:
    return dt.datetime.fromisoformat(value).timestamp() if value else None


async def submit_all(server: BenchServer, args: argparse.Namespace, ids: list[int], errors: list[str]) -> None:
    body = json.dumps({"commands": [args.command], "resources": {"gpu": 1}}).encode()
    remaining = iter(range(args.jobs))

    async def worker() -> None:
        conn = RawConnection(HOST, server.port, server.token)
        try:
            for _ in remaining:
                try:
                    status, data = await conn.request("POST", "/api/v1/workloads", body)
                except (HttpError, OSError) as exc:
                    errors.append(repr(exc))
                    continue
                if status == 201:
                    ids.append(int(json.loads(data)["id"]))
                else:
                    errors.append(f"http {status}")
        finally:
            await conn.close()

    await asyncio.gather(*(worker() for _ in range(args.clients)))


async def drive(server: BenchServer, args: argparse.Namespace) -> dict[str, Any]:
    ids: list[int] = []
    errors: list[str] = []
    poll_ms: list[float] = []
    conn = RawConnection(HOST, server.port, server.token)
    t0 = time.perf_counter()
    submitting = asyncio.create_task(submit_all(server, args, ids, errors))
    deadline = t0 + args.max_seconds
    rows: dict[int, dict[str, Any]] = {}
    done_at = None
    try:
        while time.perf_counter() < deadline:
            await asyncio.sleep(args.poll_s)
            p0 = time.perf_counter()
            status, data = await conn.request("GET", "/api/v1/workloads?all=true&limit=100000")
            poll_ms.append(1000 * (time.perf_counter() - p0))
            if status != 200:
                errors.append(f"poll http {status}")
                continue
            ours = set(ids)
            rows = {int(w["id"]): w for w in json.loads(data) if int(w["id"]) in ours}
            if submitting.done() and len(rows) == len(ids) and all(w["state"] in TERMINAL for w in rows.values()):
                done_at = time.perf_counter()
                break
    finally:
        submitted_in = None
        if submitting.done():
            submitted_in = submitting_time = None  # noqa: F841 - set below when known
        await submitting if submitting.done() else submitting.cancel()
        await conn.close()
    submitted_in = None
    return {"ids": ids, "errors": errors, "poll_ms": poll_ms, "rows": rows, "t0": t0, "done_at": done_at,
            "submitted_in": submitted_in}  # fmt: skip
