"""What reaching a service through the head costs: the same requests sent to a running service's endpoint
directly and through `/api/v1/workloads/ID/proxy/`, side by side in one run.

A `gpupool server` (127.0.0.1, sim GPUs, fresh home) runs one service: a standard-library HTTP server on
$GPUPOOL_PORT that answers GET /small with 100 bytes and GET /big with --big-mib MiB. Measured, the two
paths alternating in blocks (each round in the other order than the last, so drift and warm-up fall on
both alike):
  * latency: --requests sequential GET /small per path per round, over one kept-alive connection: p50, p99
  * throughput: --threads clients sending GET /small for --seconds per path per round: requests per second
  * transfer: GET /big --big-rounds times per path per round: MiB per second

No target: the figures say what the proxy adds, for docs/benchmarks.md.

    python benchmarks/service_proxy.py                 # 3 rounds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from harness import BenchServer, console, machine, percentile, write_results
from rich.table import Table

NAME = "service_proxy"

SERVICE = """
import http.server, os

SMALL = b"x" * 100
BIG = b"y" * (int(os.environ["BIG_MIB"]) << 20)

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go in two writes: no 40 ms wait for a delayed ACK

    def do_GET(self):
        body = BIG if self.path == "/big" else SMALL
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["GPUPOOL_PORT"])), Handler).serve_forever()
"""


def latency(client: httpx.Client, url: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        began = time.perf_counter()
        answer = client.get(url)
        times.append(time.perf_counter() - began)
        if answer.status_code != 200:
            raise RuntimeError(f"GET {url} answered {answer.status_code}: {answer.text[:200]}")
    return times


def throughput(base: str, headers: dict[str, str], path: str, threads: int, seconds: float) -> float:
    done = [0] * threads
    stop = time.perf_counter() + seconds

    def client(i: int) -> None:
        with httpx.Client(base_url=base, headers=headers, timeout=30) as c:
            while time.perf_counter() < stop:
                if c.get(path).status_code == 200:
                    done[i] += 1

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    began = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(done) / (time.perf_counter() - began)


def transfer(client: httpx.Client, url: str, count: int, mib: int) -> float:
    began = time.perf_counter()
    for _ in range(count):
        size = 0
        with client.stream("GET", url) as answer:
            for chunk in answer.iter_raw():
                size += len(chunk)
        if size != mib << 20:
            raise RuntimeError(f"GET {url} gave {size} bytes, not {mib} MiB")
    return count * mib / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--big-mib", type=int, default=64)
    parser.add_argument("--big-rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="gpupool-service-"))
    (workdir / "service.py").write_text(SERVICE)
    with BenchServer() as server:
        auth = {"Authorization": f"Bearer {server.token}"}
        with server.http() as api:
            created = api.post(
                "/api/v1/workloads",
                json={
                    "kind": "service", "name": "bench", "resources": {"gpu": 1}, "workdir": str(workdir),
                    "env": {"BIG_MIB": args.big_mib}, "readiness_probe": "/small",
                    "commands": [f"exec {sys.executable} service.py"],
                },
            ).json()  # fmt: skip
            deadline = time.monotonic() + 60
            while True:
                w = api.get(f"/api/v1/workloads/{created['id']}").json()
                if w.get("ready"):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"the service never became ready: {w}")
                time.sleep(0.2)
        paths = {
            "direct": (f"http://{w['endpoint']}", {}),
            "proxy": (f"{server.url}/api/v1/workloads/{created['id']}/proxy", auth),
        }
        runs: dict[str, list[dict[str, Any]]] = {"direct": [], "proxy": []}
        for r in range(args.rounds):
            order = list(paths) if r % 2 == 0 else list(reversed(paths))
            for name in order:
                base, headers = paths[name]
                with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
                    latency(client, "/small", 20)  # warm the connection
                    times = latency(client, "/small", args.requests)
                    rate = throughput(base, headers, "/small", args.threads, args.seconds)
                    mib_s = transfer(client, "/big", args.big_rounds, args.big_mib)
                runs[name].append(
                    {
                        "p50_ms": percentile(times, 50) * 1000,
                        "p99_ms": percentile(times, 99) * 1000,
                        "requests_per_s": rate,
                        "mib_per_s": mib_s,
                    }
                )
                console.print(f"round {r + 1} {name:6s} {runs[name][-1]}")
        server_cpu = server.cpu_seconds()
        with server.http() as api:  # the service runs in a session of its own: end it before the server
            api.post(f"/api/v1/workloads/{created['id']}/cancel")
            deadline = time.monotonic() + 60
            while api.get(f"/api/v1/workloads/{created['id']}").json()["state"] != "cancelled":
                if time.monotonic() > deadline:
                    raise SystemExit("the service did not stop within 60 s")
                time.sleep(0.2)
    median = {
        name: {k: statistics.median(run[k] for run in rows) for k in rows[0]} for name, rows in runs.items()
    }
    table = Table(title=f"GET through the head's proxy beside direct, median of {args.rounds} rounds")
    table.add_column("path")
    for title in ("p50 ms", "p99 ms", f"req/s ({args.threads} clients)", f"MiB/s ({args.big_mib} MiB)"):
        table.add_column(title, justify="right")
    for name, m in median.items():
        table.add_row(
            name,
            f"{m['p50_ms']:.2f}",
            f"{m['p99_ms']:.2f}",
            f"{m['requests_per_s']:.0f}",
            f"{m['mib_per_s']:.0f}",
        )
    console.print(table)
    added = median["proxy"]["p50_ms"] - median["direct"]["p50_ms"]
    console.print(f"the proxy adds {added:.2f} ms at p50; the server used {server_cpu:.1f} CPU s in all")
    path = write_results(
        NAME,
        {"benchmark": NAME, "config": {k: str(v) for k, v in vars(args).items()}, "machine": machine(),
         "runs": runs, "median": median, "added_p50_ms": added},
        args.output,
    )  # fmt: skip
    console.print(f"[dim]wrote {path}[/dim]")


if __name__ == "__main__":
    main()
