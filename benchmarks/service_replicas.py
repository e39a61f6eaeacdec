"""What a service's replicas buy: requests per second through the head's proxy to a service that serves
one request at a time (as a model server on one GPU serves one batch at a time), with 1, 2 and 4 replicas.

A `gpupool server` (127.0.0.1, sim GPUs, fresh home) runs the service with `replicas: N`: a standard-library
`ThreadingHTTPServer` on $GPUPOOL_PORT that spends --work-ms sleeping on each GET /work under one lock, so
one request's work at a time, as a request's GPU time would. --threads clients send GET /work through
`/api/v1/workloads/ID/proxy/` for --seconds; the answers' `X-Gpupool-Workload` header says which replica
served each, so the spread is counted too. Rounds run the replica counts in the other order than the last.

No target: the figures show the proxy's round robin turning replicas into throughput, for
docs/benchmarks.md.

    python benchmarks/service_replicas.py              # 3 rounds of 1, 2, 4 replicas
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from harness import BenchServer, console, machine, write_results
from rich.table import Table

NAME = "service_replicas"

SERVICE = """
import http.server, os, threading, time

WORK = float(os.environ["WORK_MS"]) / 1000
GPU = threading.Lock()  # one request's work at a time, as on one GPU

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self):
        if self.path == "/work":
            with GPU:
                time.sleep(WORK)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["GPUPOOL_PORT"])), Handler).serve_forever()
"""


def load(base: str, headers: dict[str, str], threads: int, seconds: float) -> tuple[float, dict[str, int]]:
    """Requests per second answered 200 by `threads` clients in `seconds`, and how many each replica
    (by workload id) served."""
    served: list[collections.Counter[str]] = [collections.Counter() for _ in range(threads)]
    stop = time.perf_counter() + seconds

    def client(i: int) -> None:
        with httpx.Client(base_url=base, headers=headers, timeout=60) as c:
            while time.perf_counter() < stop:
                answer = c.get("/work")
                if answer.status_code == 200:
                    served[i][answer.headers["x-gpupool-workload"]] += 1

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    began = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    total: collections.Counter[str] = sum(served, collections.Counter())
    return sum(total.values()) / (time.perf_counter() - began), dict(total)


def run_service(
    api: httpx.Client, server: BenchServer, workdir: Path, replicas: int, args: argparse.Namespace
) -> dict[str, Any]:
    created = api.post(
        "/api/v1/workloads",
        json={
            "kind": "service", "name": f"work-{replicas}", "replicas": replicas, "resources": {"gpu": 1},
            "workdir": str(workdir), "env": {"WORK_MS": args.work_ms}, "readiness_probe": "/health",
            "commands": [f"exec {sys.executable} service.py"],
        },
    ).json()  # fmt: skip
    sid = created["id"]
    deadline = time.monotonic() + 60
    while True:
        w = api.get(f"/api/v1/workloads/{sid}").json()
        if all(r["ready"] for r in w["replica_list"]):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"the replicas never all became ready: {w['replica_list']}")
        time.sleep(0.2)
    auth = {"Authorization": f"Bearer {server.token}"}
    rate, served = load(f"{server.url}/api/v1/workloads/{sid}/proxy", auth, args.threads, args.seconds)
    api.post(f"/api/v1/workloads/{sid}/cancel")
    deadline = time.monotonic() + 60
    while any(r["state"] != "cancelled" for r in api.get(f"/api/v1/workloads/{sid}").json()["replica_list"]):
        if time.monotonic() > deadline:
            raise SystemExit("the replicas did not stop within 60 s")
        time.sleep(0.2)
    return {"requests_per_s": rate, "served": sorted(served.values(), reverse=True)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", default="1,2,4", help="replica counts to compare")
    parser.add_argument("--work-ms", type=float, default=20.0, help="time each request takes the service")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    counts = [int(n) for n in args.replicas.split(",")]

    workdir = Path(tempfile.mkdtemp(prefix="gpupool-replicas-"))
    (workdir / "service.py").write_text(SERVICE)
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    with BenchServer() as server, server.http() as api:
        for r in range(args.rounds):
            for n in counts if r % 2 == 0 else list(reversed(counts)):
                runs[n].append(run_service(api, server, workdir, n, args))
                console.print(f"round {r + 1} replicas {n}: {runs[n][-1]}")
        server_cpu = server.cpu_seconds()
    median = {n: statistics.median(run["requests_per_s"] for run in rows) for n, rows in runs.items()}
    bound = 1000 / args.work_ms
    table = Table(title=f"GET /work ({args.work_ms:g} ms each, one at a time per replica) through the head, "
                        f"{args.threads} clients, median of {args.rounds} rounds")  # fmt: skip
    for title in (
        "replicas",
        "requests/s",
        "x one replica",
        "bound (replicas x 1/work)",
        "served, last round",
    ):
        table.add_column(title, justify="right")
    for n in counts:
        table.add_row(
            str(n),
            f"{median[n]:.0f}",
            f"{median[n] / median[counts[0]]:.2f}",
            f"{n * bound:.0f}",
            " / ".join(map(str, runs[n][-1]["served"])),
        )
    console.print(table)
    console.print(f"the server used {server_cpu:.1f} CPU s in all")
    path = write_results(
        NAME,
        {"benchmark": NAME, "config": {k: str(v) for k, v in vars(args).items()}, "machine": machine(),
         "runs": {str(n): rows for n, rows in runs.items()}, "median_requests_per_s": median},
        args.output,
    )  # fmt: skip
    console.print(f"[dim]wrote {path}[/dim]")


if __name__ == "__main__":
    main()
