"""A submit's store path alone: CPU per `submission.submit` (the spec parsed, the workload and its first event
committed) in one process on a fresh SQLite store, no HTTP, no control loop.

`submit_throughput.py` measures the whole head; this isolates the part a change to `control/submission.py`
moves, with far less noise. Each --code runs in its own child process, the codes alternating round by round.

    python benchmarks/submit_service.py
    git archive COMMIT | tar -x -C /tmp/old
    python benchmarks/submit_service.py --code /tmp/old/src --code src --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from harness import REPO_ROOT, console, write_run

NAME = "submit_service"

# Run in the child: PYTHONPATH selects the code; prints CPU milliseconds per submit.
CHILD = """
import json, sys, tempfile, time
from pathlib import Path
from gpupool.control import queues, submission
from gpupool.spec import parse_workload_spec
from gpupool.store.db import Store
submits, warmup = int(sys.argv[1]), int(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp:
    store = Store(f"sqlite:///{Path(tmp) / 'gpupool.db'}")
    queues.ensure_default_queue(store)
    body = {"commands": ["true"], "resources": {"gpu": 1}}
    for _ in range(warmup):
        submission.submit(store, parse_workload_spec(body))
    began = time.process_time()
    for _ in range(submits):
        submission.submit(store, parse_workload_spec(body))
    print(json.dumps({"cpu_ms_per_submit": (time.process_time() - began) / submits * 1000}))
    store.close()
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--code", action="append", type=Path, help="a folder holding gpupool/ (repeatable)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each code, alternating (default 3)")
    parser.add_argument("--submits", type=int, default=2000, help="timed submits per run (default 2000)")
    parser.add_argument("--warmup", type=int, default=300, help="untimed submits first (default 300)")
    parser.add_argument("--output", type=Path, help=f"JSON path (default benchmarks/results/{NAME}.json)")
    args = parser.parse_args()
    codes = [c.resolve() for c in args.code or [REPO_ROOT / "src"]]
    runs: dict[str, list[float]] = {str(c): [] for c in codes}
    for round_ in range(args.rounds):
        for code in codes if round_ % 2 == 0 else list(reversed(codes)):
            env = {**os.environ, "PYTHONPATH": str(code)}
            done = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.submits), str(args.warmup)],
                env=env, capture_output=True, text=True, timeout=600, check=True,
            )  # fmt: skip
            ms = json.loads(done.stdout.splitlines()[-1])["cpu_ms_per_submit"]
            runs[str(code)].append(ms)
            console.print(f"round {round_ + 1} {ms:6.3f} ms CPU a submit  {code}")
    for code, values in runs.items():
        spread = f"{min(values):.3f} to {max(values):.3f}"
        console.print(f"median {statistics.median(values):.3f} ms ({spread})  {code}")
    console.print(f"wrote {write_run(NAME, args, {'runs': runs})}")


if __name__ == "__main__":
    main()
