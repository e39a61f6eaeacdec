"""Submit throughput: N concurrent clients POST jobs to /api/v1/workloads on a cordoned node.

The node is cordoned first so every job stays pending: the figure is the API and store path of a submit
(parse, validate, insert workload + event, commit, wake the loop), not process start-up. Each run starts
its own `gpupool server --gpus sim:8xH100` on 127.0.0.1 with a fresh GPUPOOL_HOME (SQLite by default).

Target (issue): >= 200 submits/s with p99 <= 250 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from typing import Any

import httpx
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

NAME = "submit_throughput"
BODY = {"commands": ["true"], "resources": {"gpu": 1}}
TARGET_RATE, TARGET_P99_MS = 200.0, 250.0
PATH = "/api/v1/workloads"


class Tally:
    """Hands out request numbers to workers and collects latencies; shared by every worker."""

    def __init__(self, total: int, deadline: float) -> None:
        self.total, self.deadline = total, deadline
        self.issued = 0
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.issued >= self.total or time.monotonic() > self.deadline:
                return False
            self.issued += 1
            return True

    def ok(self, seconds: float) -> None:
        self.latencies.append(seconds)

    def error(self, what: str) -> None:
        with self._lock:
            self.errors[what] = self.errors.get(what, 0) + 1


async def _raw_worker(server: BenchServer, tally: Tally, body: bytes) -> None:
    conn = RawConnection(HOST, server.port, server.token)
    try:
        while tally.take():
            t0 = time.perf_counter()
            try:
                status, _ = await conn.request("POST", PATH, body)
            except (HttpError, OSError) as exc:
                tally.error(type(exc).__name__)
                continue
            if status == 201:
                tally.ok(time.perf_counter() - t0)
            else:
                tally.error(f"http {status}")
    finally:
        await conn.close()


async def _httpx_worker(client: httpx.AsyncClient, tally: Tally, body: bytes) -> None:
    headers = {"Content-Type": "application/json"}
    while tally.take():
        t0 = time.perf_counter()
        try:
            response = await client.post(PATH, content=body, headers=headers)
        except httpx.HTTPError as exc:
            tally.error(type(exc).__name__)
            continue
        if response.status_code == 201:
            tally.ok(time.perf_counter() - t0)
        else:
            tally.error(f"http {response.status_code}")


def _thread_worker(server: BenchServer, tally: Tally, body: bytes) -> None:
    headers = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        while tally.take():
            t0 = time.perf_counter()
            try:
                response = client.post(PATH, content=body)
            except httpx.HTTPError as exc:
                tally.error(type(exc).__name__)
                continue
            if response.status_code == 201:
                tally.ok(time.perf_counter() - t0)
            else:
                tally.error(f"http {response.status_code}")


def drive(server: BenchServer, kind: str, clients: int, total: int, max_seconds: float) -> Tally:
    """Send `total` submits over `clients` concurrent connections; stop issuing at the deadline."""
    tally = Tally(total, time.monotonic() + max_seconds)
    body = json.dumps(BODY).encode()
    if kind == "threads":
        threads = [
            threading.Thread(target=_thread_worker, args=(server, tally, body)) for _ in range(clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return tally

    async def main() -> None:
        if kind == "raw":
            await asyncio.gather(*(_raw_worker(server, tally, body) for _ in range(clients)))
            return
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        headers = {"Authorization": f"Bearer {server.token}"}
        async with httpx.AsyncClient(
            base_url=server.url, headers=headers, limits=limits, timeout=60
        ) as client:
            await asyncio.gather(*(_httpx_worker(client, tally, body) for _ in range(clients)))

    asyncio.run(main())
    return tally


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    with BenchServer(db_url=args.db, log_level=args.log_level) as server:
        server.cordon_all()
        if args.warmup:
            drive(server, args.client, args.clients, args.warmup, args.max_seconds)
        cpu_server0, cpu_client0 = server.cpu_seconds(), time.process_time()
        t0 = time.perf_counter()
        tally = drive(server, args.client, args.clients, args.submits, args.max_seconds)
        wall = time.perf_counter() - t0
        cpu_server = server.cpu_seconds() - cpu_server0
        cpu_client = time.process_time() - cpu_client0
        failures = server.count_log_lines("event=reconcile_failed")
    ok = len(tally.latencies)
    ms = [x * 1000 for x in tally.latencies]
    return {
        "submits_ok": ok,
        "submits_attempted": tally.issued,
        "errors": sum(tally.errors.values()),
        "error_kinds": tally.errors,
        "seconds": wall,
        "jobs_per_s": ok / wall if wall else 0.0,
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms) if ms else float("nan"),
        "server_cpu_s": cpu_server,
        "server_cpu_per_submit_ms": 1000 * cpu_server / max(1, tally.issued),
        "client_cpu_per_submit_ms": 1000 * cpu_client / max(1, tally.issued),
        "hit_time_limit": tally.issued < args.submits,
        "reconcile_failures_logged": failures,
    }


COLUMNS = [
    Column("submits_ok", "ok", lambda v: f"{v:.0f}"),
    Column("errors", "errors", lambda v: f"{v:.0f}"),
    Column("seconds", "seconds", lambda v: f"{v:.2f}"),
    Column("jobs_per_s", "jobs/s"),
    Column("p50_ms", "p50 ms"),
    Column("p95_ms", "p95 ms"),
    Column("p99_ms", "p99 ms"),
    Column("max_ms", "max ms"),
    Column("server_cpu_per_submit_ms", "server CPU ms/submit", lambda v: f"{v:.2f}"),
    Column("client_cpu_per_submit_ms", "client CPU ms/submit", lambda v: f"{v:.2f}"),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--submits", type=int, default=3000, help="measured submits per run (default 3000)")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured submits first (default 200)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument(
        "--client",
        choices=["raw", "httpx", "threads"],
        default="raw",
        help="client implementation: raw = minimal asyncio HTTP/1.1 (cheapest, default); "
        "httpx = httpx.AsyncClient on asyncio; threads = one httpx.Client per thread",
    )
    add_run_options(
        parser,
        NAME,
        max_seconds=120.0,
        max_seconds_help="per phase, stop issuing submits after this long (default 120)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    warn_shared_db(args.db, args.repeat)
    runs = []
    for i in range(args.repeat):
        console.print(
            f"[dim]run {i + 1}/{args.repeat}: {args.warmup} warm-up + {args.submits} submits, "
            f"{args.clients} clients ({args.client})[/dim]"
        )
        runs.append(one_run(args))
    keys = [c.key for c in COLUMNS]
    median = median_of_runs(runs, keys)
    met = median["jobs_per_s"] >= TARGET_RATE and median["p99_ms"] <= TARGET_P99_MS and median["errors"] == 0
    print_runs(
        f"submit throughput: {args.clients} clients, {args.submits} submits, cordoned node",
        runs,
        COLUMNS,
        median,
    )
    console.print(
        f"target >= {TARGET_RATE:g} submits/s with p99 <= {TARGET_P99_MS:g} ms: {verdict(met)} "
        f"(median {median['jobs_per_s']:.1f}/s, p99 {median['p99_ms']:.1f} ms)"
    )
    save_report(
        NAME,
        args,
        runs,
        keys,
        median,
        {"jobs_per_s_min": TARGET_RATE, "p99_ms_max": TARGET_P99_MS},
        met,
        body=BODY,
    )


if __name__ == "__main__":
    main()
