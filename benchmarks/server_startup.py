"""Head start-up: seconds from `gpupool server` being started to its port accepting connections, side by side
across codes, on a home whose store already exists (a restart, not a first start).

Each round starts `gpupool server --gpus sim:8xH100` once with each code (`--code`, a folder holding
`gpupool/`, e.g. the `src/` of a `git archive` of an older commit; default: this checkout's src/), each
round in the other order than the last, on one GPUPOOL_HOME (the first start, which creates the store, is
not counted), and records the wall seconds until 127.0.0.1:PORT accepts and the server process's CPU
seconds by then (psutil). Medians per code and their ratio to the first code.

    python benchmarks/server_startup.py
    git archive COMMIT src | tar -x -C /tmp/old
    python benchmarks/server_startup.py --code /tmp/old/src --code src --rounds 7
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from harness import console, free_port, replay_codes, write_run
from rich.table import Table

NAME = "server_startup"


def start_once(code: Path, home: Path, port: int, limit: float) -> tuple[float, float]:
    """(wall seconds until the port accepts, the server's CPU seconds by then); the server is stopped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update({"GPUPOOL_HOME": str(home), "PYTHONPATH": str(code)})
    began = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, "-m", "gpupool.main", "server", "--gpus", "sim:8xH100", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        watched = psutil.Process(server.pid)
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.05).close()
                break
            except OSError:
                if server.poll() is not None or time.perf_counter() - began > limit:
                    said = f"gpupool server with {code} did not listen within {limit:g} s"
                    raise SystemExit(said) from None
                time.sleep(0.01)
        wall = time.perf_counter() - began
        times = watched.cpu_times()
        return wall, times.user + times.system
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--code", action="append", type=Path, help="a folder holding gpupool/ (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-seconds", type=float, default=60.0, help="bound on one start")
    parser.add_argument("--output", type=Path, help=f"JSON path (default benchmarks/results/{NAME}.json)")
    args = parser.parse_args()
    codes = replay_codes(args)
    runs: dict[str, list[tuple[float, float]]] = {str(c): [] for c in codes}
    with tempfile.TemporaryDirectory(prefix="gpupool-start-") as home:
        port = free_port()
        start_once(codes[0], Path(home), port, args.max_seconds)  # creates the store: not counted
        for r in range(args.rounds):
            for code in codes if r % 2 == 0 else codes[::-1]:
                runs[str(code)].append(start_once(code, Path(home), port, args.max_seconds))
    table = Table(title=f"gpupool server to listening: median of {args.rounds} starts, existing store")
    for column in ("code", "wall s", "CPU s", "wall / first"):
        table.add_column(column, justify="left" if column == "code" else "right")
    summary = {}
    for code in codes:
        samples = runs[str(code)]
        wall = statistics.median(w for w, _ in samples)
        cpu = statistics.median(c for _, c in samples)
        summary[str(code)] = {"wall_s": wall, "cpu_s": cpu, "runs": samples}
        first = summary[str(codes[0])]["wall_s"]
        table.add_row(f"{code.parent.name}/{code.name}", f"{wall:.2f}", f"{cpu:.2f}", f"{wall / first:.2f}")
    console.print(table)
    console.print(f"wrote {write_run(NAME, args, {'summary': summary})}")


if __name__ == "__main__":
    main()
