"""How fast an autoscaled service follows a step of load, and what it buys: a service that serves one request
at a time (as a model server on one GPU serves one batch at a time) with `replicas: 1..MAX` and
`scaling: {metric: concurrency, target: 1}`, hit by --threads clients for --load seconds, then left quiet.

A `gpupool server` (127.0.0.1, sim GPUs, fresh home) runs the service of benchmarks/service_replicas.py
(--work-ms of work per GET /work, one at a time per replica). Every 0.5 s the run samples the answers so far
and the service's replicas (pending or running, and ready); it reports the seconds from the load's start
until MAX replicas were ready, the requests per second answered in the load's first 5 seconds and in its
last 10, and the seconds from the load's end until the count was back at 1. Each round starts a fresh
service.

No target: the figures say how the autoscaler (control/autoscale.py) reacts, for docs/benchmarks.md.

    python benchmarks/service_autoscale.py              # 2 rounds, replicas 1..4
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
from harness import BenchServer, console, machine, write_results
from rich.table import Table
from service_replicas import SERVICE

NAME = "service_autoscale"
SAMPLE = 0.5  # seconds between two samples


def _ready(w: dict[str, Any]) -> int:
    return sum(1 for r in w["replica_list"] if r["state"] == "running" and r["ready"] and r["id"] is not None)


def one_round(
    api: httpx.Client, server: BenchServer, workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    sid = api.post(
        "/api/v1/workloads",
        json={
            "kind": "service", "name": "autoscaled", "replicas": f"1..{args.max}", "resources": {"gpu": 1},
            "workdir": str(workdir), "env": {"WORK_MS": args.work_ms}, "readiness_probe": "/health",
            "commands": [f"exec {sys.executable} service.py"],
            "scaling": {"metric": "concurrency", "target": 1, "window": args.window, "scale_up_delay": "0s",
                        "scale_down_delay": args.down_delay},
        },
    ).json()["id"]  # fmt: skip
    deadline = time.monotonic() + 60
    while _ready(api.get(f"/api/v1/workloads/{sid}").json()) < 1:
        if time.monotonic() > deadline:
            raise SystemExit("the service never became ready")
        time.sleep(0.2)

    answered = [0] * args.threads
    stop = threading.Event()
    auth = {"Authorization": f"Bearer {server.token}"}

    def client(i: int) -> None:
        with httpx.Client(
            base_url=f"{server.url}/api/v1/workloads/{sid}/proxy", headers=auth, timeout=60
        ) as c:
            while not stop.is_set():
                if c.get("/work").status_code == 200:
                    answered[i] += 1

    workers = [threading.Thread(target=client, args=(i,)) for i in range(args.threads)]
    samples: list[tuple[float, int, int, int]] = []  # seconds since the load began, answers, count, ready
    began = time.monotonic()
    for w in workers:
        w.start()
    ended_at: float | None = None
    while True:
        now = time.monotonic() - began
        w = api.get(f"/api/v1/workloads/{sid}").json()
        samples.append((now, sum(answered), int(w["replicas"]), _ready(w)))
        if ended_at is None and now >= args.load:
            stop.set()
            for t in workers:
                t.join()
            ended_at = time.monotonic() - began
        if ended_at is not None and samples[-1][2] == 1:
            break
        if now > args.load + 120:
            raise SystemExit(f"the service did not come back to 1 replica: {samples[-1]}")
        time.sleep(SAMPLE)
    api.post(f"/api/v1/workloads/{sid}/cancel")

    def rate(start: float, end: float) -> float:
        inside = [s for s in samples if start <= s[0] <= end]
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    full = next((s[0] for s in samples if s[3] >= args.max), None)
    assert ended_at is not None
    return {
        "seconds_to_max_ready": full,
        "first_5s_requests_per_s": rate(0.0, 5.0),
        "last_10s_requests_per_s": rate(args.load - 10.0, args.load),
        "seconds_back_to_1": samples[-1][0] - ended_at,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max", type=int, default=4, help="the most replicas")
    parser.add_argument("--work-ms", type=float, default=20.0, help="time each request takes the service")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--load", type=float, default=30.0, help="seconds of load")
    parser.add_argument("--window", default="10s", help="scaling.window")
    parser.add_argument("--down-delay", default="15s", help="scaling.scale_down_delay")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="gpupool-autoscale-"))
    (workdir / "service.py").write_text(SERVICE)
    runs = []
    with BenchServer() as server, server.http() as api:
        for r in range(args.rounds):
            runs.append(one_round(api, server, workdir, args))
            shown = {k: v for k, v in runs[-1].items() if k != "samples"}
            console.print(f"round {r + 1}: {shown}")
    keys = ("seconds_to_max_ready", "first_5s_requests_per_s", "last_10s_requests_per_s", "seconds_back_to_1")
    median = {k: statistics.median(run[k] for run in runs if run[k] is not None) for k in keys}
    table = Table(
        title=f"{args.threads} clients for {args.load:g} s on a service of 1..{args.max} replicas "
        f"({args.work_ms:g} ms per request, one at a time each; concurrency target 1, window {args.window}, "
        f"down delay {args.down_delay}), median of {args.rounds}"
    )
    for title in ("s to max ready", "req/s first 5 s", "req/s last 10 s", "x", "bound", "s back to 1"):
        table.add_column(title, justify="right")
    table.add_row(
        f"{median['seconds_to_max_ready']:.1f}",
        f"{median['first_5s_requests_per_s']:.0f}",
        f"{median['last_10s_requests_per_s']:.0f}",
        f"{median['last_10s_requests_per_s'] / median['first_5s_requests_per_s']:.2f}",
        f"{args.max * 1000 / args.work_ms:.0f}",
        f"{median['seconds_back_to_1']:.1f}",
    )
    console.print(table)
    path = write_results(
        NAME,
        {"benchmark": NAME, "config": {k: str(v) for k, v in vars(args).items()}, "machine": machine(),
         "runs": runs, "median": median},
        args.output,
    )  # fmt: skip
    console.print(f"[dim]wrote {path}[/dim]")


if __name__ == "__main__":
    main()
