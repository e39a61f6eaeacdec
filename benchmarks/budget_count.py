"""What counting a budget's GPU-hours costs the control loop (control/budgets.py), in-process on a real
SQLite store: a month of N finished attempts (one every 40 s) plus R running, spread over 8 queues. Prints
the median wall milliseconds of a whole count (`accounting.gpu_hours_by_queue`, what each count read
before 2026-12-04 and what a Tally's first count reads) and of a Tally's later counts, when a few attempts
started and ended since the last (what the loop pays every 10 s), side by side in one run, and checks that
both give the same hours.

    .venv/bin/python benchmarks/budget_count.py [--attempts 50000] [--running 200] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from harness import console, machine, write_results
from sqlalchemy import insert

from gpupool.control.accounting import Tally, gpu_hours_by_queue
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Workload

NAME = "budget_count"
MONTH = datetime(2026, 12, 1, tzinfo=UTC)


def _add(store: Store, first_id: int, starts: list[datetime], hours: float | None) -> None:
    workloads, attempts = [], []
    for i, start in enumerate(starts):
        wid = first_id + i
        state = "running" if hours is None else "succeeded"
        workloads.append({"id": wid, "name": "w", "queue": f"q{wid % 8}", "user": "u", "spec": {},
                          "state": state, "version": 1})  # fmt: skip
        end = None if hours is None else start + timedelta(hours=hours)
        attempts.append({"workload_id": wid, "number": 0, "state": state, "node_name": "n",
                         "gpu_indices": [0, 1], "gpu_fraction": 1.0, "pods": [], "started_at": start,
                         "finished_at": end})  # fmt: skip
    with store.session() as s:
        s.execute(insert(Workload), workloads)
        s.execute(insert(Attempt), attempts)


def one_run(count: int, running: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/gpupool.db")
        _add(store, 1, [MONTH + timedelta(seconds=40 * i) for i in range(count)], 1.0)
        now = MONTH + timedelta(seconds=40 * count + 3600)
        _add(store, count + 1, [now - timedelta(minutes=30)] * running, None)
        tally = Tally(MONTH)
        with store.read() as s:
            began = time.perf_counter()
            tally.count(s, now)
            first_ms = (time.perf_counter() - began) * 1000
        whole, later = [], []
        next_id = count + running + 1
        for _ in range(repeat):
            now += timedelta(seconds=10)  # a loop's worth: 2 attempts ended, 2 started
            _add(store, next_id, [now - timedelta(minutes=20)] * 2, 1 / 6)
            _add(store, next_id + 2, [now - timedelta(seconds=5)] * 2, None)
            next_id += 4
            with store.read() as s:
                began = time.perf_counter()
                expected = gpu_hours_by_queue(s, MONTH, now, now)
                whole.append((time.perf_counter() - began) * 1000)
                began = time.perf_counter()
                got = tally.count(s, now)
                later.append((time.perf_counter() - began) * 1000)
            if any(abs(got.get(q, 0.0) - h) > 1e-6 * max(1.0, h) for q, h in expected.items()):
                raise SystemExit(f"the tally ({got}) differs from the whole count ({expected})")
        return {
            "attempts": count + running,
            "whole_count_ms": statistics.median(whole),
            "tally_first_ms": first_ms,
            "tally_later_ms": statistics.median(later),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=50_000, help="finished attempts in the month")
    parser.add_argument("--running", type=int, default=200, help="attempts running now")
    parser.add_argument("--repeat", type=int, default=5, help="counts of each kind (the median is printed)")
    args = parser.parse_args()
    result = one_run(args.attempts, args.running, args.repeat)
    ratio = result["whole_count_ms"] / max(result["tally_later_ms"], 1e-9)
    console.print(
        f"{result['attempts']:,} attempts: whole count {result['whole_count_ms']:.0f} ms, tally's first "
        f"{result['tally_first_ms']:.0f} ms, tally's later counts {result['tally_later_ms']:.1f} ms "
        f"(medians of {args.repeat}; {ratio:.0f}x less per count)"
    )
    path = write_results(NAME, {"machine": machine(), "args": vars(args), "result": result, "ratio": ratio})
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
