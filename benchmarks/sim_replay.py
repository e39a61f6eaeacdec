"""Simulator replay speed: CPU seconds to replay a trace window per policy, side by side across codes.

Each replay runs in a fresh process (`Simulation(...).run()`, the same replay as `gpupool sim run`), timed
by `time.process_time` around the run alone (loading the trace is not counted). Give --code once per code
to compare (a folder holding `gpupool/`, e.g. the `src/` of a `git archive` of a commit with its own
`tools/build_native.py` build; default: this checkout's src/); rounds alternate the codes, each round in
the other order than the last, so drift on a shared machine and the cost of running second fall on all
of them alike. Every replay also hashes every job's outcome (submit, start, finish, time queued,
preemptions, lost work): codes that should replay alike must print the same hash. This box runs the same
replay up to 2.6x slower from one hour to the next, and no fixed piece of work timed beside it was found to
follow that (docs/benchmarks.md, "The box from hour to hour"): compare codes side by side, in one run.

Target (issue 4): the Philly week 2017-10-02..2017-10-09 on `--cluster 64x8 --queues auto` in <= 10 s per
policy on this machine.

    python benchmarks/sim_replay.py                       # the week, all seven policies, 3 rounds
    git archive COMMIT | tar -x -C /tmp/old && (cd /tmp/old && python tools/build_native.py)
    python benchmarks/sim_replay.py --code /tmp/old/src --code src --policies las,gpupool
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import add_replay_options, console, replay_codes, write_run
from rich.table import Table

NAME = "sim_replay"
POLICIES = "fifo,fifo-backfill,sjf-oracle,srtf-oracle,las,drf,gpupool"
TARGET_S = 10.0

# Run in the child: PYTHONPATH selects the code; prints one JSON line.
CHILD = """
import hashlib, json, sys, time
import gpupool.scheduler as scheduler
import gpupool.sim as sim
from gpupool.sim import experiment
trace, window, cluster, queues, policy = sys.argv[1:6]
e = experiment.prepare(trace, cluster, window=window, queues=queues, policies=policy)
began = time.process_time()
experiment.run(e)
cpu = time.process_time() - began
result = e.results[0]
outcome = [
    (j.submit, j.start, j.finish, j.preemptions, round(j.lost_gpu_s, 6), j.queued) for j in result.jobs
]
print(json.dumps({
    "cpu_s": cpu, "decide_s": result.decide_s, "decide_calls": result.cycles,
    "avg_jct_h": e.metrics[policy]["avg_jct_s"] / 3600, "jobs": len(result.jobs),
    "hash": hashlib.sha256(repr(outcome).encode()).hexdigest()[:12],
    "native": bool(getattr(scheduler, "NATIVE", False)),
    "engine_native": bool(getattr(sim, "NATIVE", False)),
}))
"""


def replay(code: Path, args: argparse.Namespace, policy: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    command = [sys.executable, "-c", CHILD, args.trace, args.window, args.cluster, args.queues, policy]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.max_seconds)
    if done.returncode != 0:
        raise SystemExit(f"replay of {policy} with {code} failed:\n{done.stderr[-2000:]}")
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_replay_options(parser, NAME)
    parser.add_argument("--policies", default=POLICIES, help=f"comma-separated (default {POLICIES})")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=600.0, help="bound on one replay")
    args = parser.parse_args()
    codes = replay_codes(args)
    policies = [p for p in args.policies.split(",") if p]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {str(c): {p: [] for p in policies} for c in codes}
    for round_no in range(args.rounds):
        # Each round runs the codes in the other order: on a shared box the later of two back-to-back
        # replays tends to run slower (about 2% here), which would otherwise fall on one code every time.
        order = codes if round_no % 2 == 0 else codes[::-1]
        for policy in policies:
            for code in order:
                row = replay(code, args, policy)
                runs[str(code)][policy].append(row)
                console.print(
                    f"round {round_no + 1} {policy:14s} {row['cpu_s']:6.2f} s  "
                    f"{row['decide_calls']:6d} calls  hash {row['hash']}  {code}"
                )
    table = Table(title=f"{args.window} on {args.cluster}: CPU seconds, median of {args.rounds}")
    table.add_column("policy")
    for code in codes:
        table.add_column(f"{code.parent.name}/{code.name}", justify="right")
    table.add_column("calls", justify="right")
    table.add_column("same jobs", justify="center")
    summary: dict[str, Any] = {}
    for policy in policies:
        medians = [statistics.median(r["cpu_s"] for r in runs[str(c)][policy]) for c in codes]
        hashes = {r["hash"] for c in codes for r in runs[str(c)][policy]}
        calls = " / ".join(str(runs[str(c)][policy][0]["decide_calls"]) for c in codes)
        table.add_row(policy, *(f"{m:.2f}" for m in medians), calls, "yes" if len(hashes) == 1 else "NO")
        summary[policy] = {
            "median_cpu_s": dict(zip(map(str, codes), medians, strict=True)),
            "same_jobs": len(hashes) == 1,
        }
    console.print(table)
    last = [summary[p]["median_cpu_s"][str(codes[-1])] for p in policies]
    console.print(
        f"last code: {sum(m <= TARGET_S for m in last)} of {len(policies)} policies <= {TARGET_S:g} s"
    )
    console.print(f"wrote {write_run(NAME, args, {'summary': summary, 'runs': runs})}")


if __name__ == "__main__":
    main()
