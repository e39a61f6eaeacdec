"""CLI latency: seconds from `gpupool <command>` to its exit, on a real server, side by side across codes.

One `gpupool server` (this checkout's code) runs on 127.0.0.1 with a few jobs in it; each round runs every
command once with each code (`--code`, a folder holding `gpupool/`, e.g. the `src/` of a `git archive` of an
older commit; default: this checkout's src/), each round in the other order than the last, and records
the wall and CPU seconds of the child process. Medians per code and command, and their ratio to the first
code. The client's start-up (Python, imports, argument parsing) is most of a command's time: the request
itself is a few milliseconds on loopback.

    python benchmarks/cli_startup.py
    git archive COMMIT src | tar -x -C /tmp/old
    python benchmarks/cli_startup.py --code /tmp/old/src --code src --rounds 15
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import BenchServer, console, replay_codes, write_run
from rich.table import Table

NAME = "cli_startup"
COMMANDS = (("ps", "--all"), ("nodes",), ("queues",), ("logs", "1"), ("--help",))


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, exit status) of one child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=120)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--code", action="append", type=Path, help="a folder holding gpupool/ (repeatable)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--output", type=Path, help=f"JSON path (default benchmarks/results/{NAME}.json)")
    args = parser.parse_args()
    codes = replay_codes(args)
    runs: dict[str, dict[str, list[tuple[float, float]]]] = {str(c): {} for c in codes}
    with BenchServer() as server:
        with server.http() as http:
            for i in range(3):  # something to list, and a log to read
                job = {"name": f"hello-{i}", "resources": {"gpu": 1}, "commands": [f"echo hello {i}"]}
                http.post("/api/v1/workloads", json=job).raise_for_status()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        env.update(
            {"GPUPOOL_HOME": str(server.home), "GPUPOOL_SERVER": server.url, "GPUPOOL_TOKEN": server.token}
        )
        for r in range(args.rounds):
            for code in codes if r % 2 == 0 else codes[::-1]:
                for command in COMMANDS:
                    wall, cpu, status = timed(
                        [sys.executable, "-m", "gpupool.main", *command], dict(env, PYTHONPATH=str(code))
                    )
                    if status != 0:
                        raise SystemExit(f"gpupool {' '.join(command)} with {code} exited {status}")
                    runs[str(code)].setdefault(" ".join(command), []).append((wall, cpu))
    summary: dict[str, dict[str, Any]] = {}
    table = Table(title=f"gpupool <command>: median seconds of {args.rounds} runs (wall / CPU)")
    table.add_column("command")
    for code in codes:
        table.add_column(f"{code.parent.name}/{code.name}", justify="right")
    if len(codes) > 1:
        table.add_column("last / first (wall)", justify="right")
    for command in COMMANDS:
        key = " ".join(command)
        cells = []
        walls = []
        for code in codes:
            samples = runs[str(code)][key]
            wall = statistics.median(w for w, _ in samples)
            cpu = statistics.median(c for _, c in samples)
            summary.setdefault(key, {})[str(code)] = {"wall_s": wall, "cpu_s": cpu}
            walls.append(wall)
            cells.append(f"{wall:.3f} / {cpu:.3f}")
        if len(codes) > 1:
            cells.append(f"{walls[-1] / walls[0]:.2f}")
        table.add_row(key, *cells)
    console.print(table)
    console.print(f"wrote {write_run(NAME, args, {'summary': summary})}")


if __name__ == "__main__":
    main()
