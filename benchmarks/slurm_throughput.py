"""Slurm throughput: 500 trivial 1-GPU jobs through gpupool on a Slurm node, next to the same 500 jobs sent
to Slurm directly with sbatch, in one run.

Plain Slurm: --jobs (500) `sbatch --gres=gpu:1 --wrap true` from --clients (8) threads; the clock runs
from just before the first sbatch until a poll of `squeue` (every --poll-s, 0.25 s) finds none of them
left. gpupool: a `gpupool server --backend slurm` on the same cluster; the same jobs are POSTed over
--clients connections and the clock runs until a poll of GET /api/v1/workloads finds all of them finished.
gpupool admits and places each job (quota, fair share, placement); Slurm runs it, pinned to the node.
Also reported: how many pending workloads carried the scheduler's reason code (what `gpupool why` and
`gpupool ps` show) in the polls while the queue drained.

By default a throwaway one-node Slurm (slurmctld, slurmd, munged on loopback; eight GRES GPUs, CPUs=8)
is started for the run (gpupool.backends.slurm_testbed; needs root); --slurm-conf uses an existing one.

Target (issue 8): gpupool's time within 10% of plain Slurm's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness import (
    HOST,
    BenchServer,
    Column,
    RawConnection,
    add_run_options,
    console,
    median_of_runs,
    print_runs,
    save_report,
    submit_jobs,
    verdict,
    warn_shared_db,
)

from gpupool.backends.slurm_testbed import SlurmCluster

NAME = "slurm_throughput"
TARGET_RATIO = 1.10
TERMINAL = ("succeeded", "failed", "cancelled")
PLAIN_NAME = "bench-plain"


def slurm_env(conf: Path) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(conf)}


def squeue_names(env: dict[str, str]) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%j"], env=env, capture_output=True, text=True, timeout=30)
    return out.stdout.split()


def wait_idle(env: dict[str, str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while squeue_names(env):
        if time.monotonic() > deadline:
            raise RuntimeError("the Slurm cluster is not idle; cancel its jobs first (scancel)")
        time.sleep(0.25)


def plain_slurm(args: argparse.Namespace, env: dict[str, str], workdir: Path) -> dict[str, Any]:
    """sbatch every job from --clients threads, then poll squeue until none of them is left."""
    errors: list[str] = []
    remaining = iter(range(args.jobs))
    lock = threading.Lock()
    argv = ["sbatch", "--parsable", f"--job-name={PLAIN_NAME}", "--gres=gpu:1", "--output=/dev/null"]
    if args.partition:
        argv.append(f"--partition={args.partition}")
    argv += [f"--chdir={workdir}", "--wrap", args.command]

    def worker() -> None:
        while True:
            with lock:
                if next(remaining, None) is None:
                    return
            result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            if result.returncode != 0:
                errors.append(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "sbatch")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    submitted = time.perf_counter() - t0
    done = None
    while time.perf_counter() - t0 < args.max_seconds:
        time.sleep(args.poll_s)
        if PLAIN_NAME not in squeue_names(env):
            done = time.perf_counter() - t0
            break
    return {
        "plain_seconds": done if done is not None else float("nan"),
        "plain_complete": done is not None,
        "plain_submit_s": submitted,
        "plain_errors": len(errors),
    }


async def through_gpupool(server: BenchServer, args: argparse.Namespace) -> dict[str, Any]:
    body = json.dumps({"commands": [args.command], "resources": {"gpu": 1}}).encode()
    ids: list[int] = []
    errors: list[str] = []

    conn = RawConnection(HOST, server.port, server.token)
    explained = unexplained = 0
    rows: dict[int, dict[str, Any]] = {}
    done = None
    t0 = time.perf_counter()
    submitting = asyncio.ensure_future(submit_jobs(server, body, args.jobs, args.clients, ids, errors))
    try:
        while time.perf_counter() - t0 < args.max_seconds:
            await asyncio.sleep(args.poll_s)
            status, data = await conn.request("GET", "/api/v1/workloads?all=true&limit=100000")
            if status != 200:
                errors.append(f"poll http {status}")
                continue
            ours = set(ids)
            rows = {int(w["id"]): w for w in json.loads(data) if int(w["id"]) in ours}
            if submitting.done():
                for w in rows.values():
                    if w["state"] == "pending" and w["attempts"] == 0:
                        age = float(w.get("age_seconds", 0.0))
                        if w["reason_code"]:
                            explained += 1
                        elif age > 1.0:  # the scheduler explains within its next pass
                            unexplained += 1
            if (
                submitting.done()
                and len(rows) == len(ids)
                and all(w["state"] in TERMINAL for w in rows.values())
            ):
                done = time.perf_counter() - t0
                break
    finally:
        if not submitting.done():
            submitting.cancel()
        await conn.close()
    states: dict[str, int] = {}
    for w in rows.values():
        states[w["state"]] = states.get(w["state"], 0) + 1
    return {
        "gpupool_seconds": done if done is not None else float("nan"),
        "gpupool_complete": done is not None,
        "gpupool_succeeded": states.get("succeeded", 0),
        "gpupool_states": states,
        "gpupool_errors": len(errors),
        "pending_explained": explained,
        "pending_unexplained": unexplained,
    }


def one_run(args: argparse.Namespace, conf: Path) -> dict[str, Any]:
    env = slurm_env(conf)
    wait_idle(env)
    result: dict[str, Any] = {"jobs": args.jobs}
    phases = ["plain", "gpupool"] if args.order == "plain-first" else ["gpupool", "plain"]
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-slurm-") as workdir:
        for phase in phases:
            if phase == "plain":
                result.update(plain_slurm(args, env, Path(workdir)))
            else:
                extra = ["--backend", "slurm"] + (["--partition", args.partition] if args.partition else [])
                server = BenchServer(
                    db_url=args.db,
                    log_level=args.log_level,
                    extra_args=extra,
                    extra_env={"SLURM_CONF": str(conf)},
                )
                with server:
                    result.update(asyncio.run(through_gpupool(server, args)))
            wait_idle(env)
    result["ratio"] = result["gpupool_seconds"] / result["plain_seconds"]
    return result


COLUMNS = [
    Column("plain_seconds", "plain sbatch s", lambda v: f"{v:.1f}"),
    Column("gpupool_seconds", "gpupool s", lambda v: f"{v:.1f}"),
    Column("ratio", "gpupool / plain", lambda v: f"{v:.3f}"),
    Column("gpupool_succeeded", "gpupool succeeded", lambda v: f"{v:.0f}"),
    Column("plain_submit_s", "sbatch all submitted s", lambda v: f"{v:.1f}"),
    Column("pending_explained", "pending rows explained", lambda v: f"{v:.0f}"),
    Column("pending_unexplained", "unexplained > 1 s", lambda v: f"{v:.0f}"),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=500, help="jobs per phase (default 500)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent submitters (default 8)")
    parser.add_argument("--command", default="true", help="the job's command (default 'true')")
    parser.add_argument("--poll-s", type=float, default=0.25, help="poll interval in seconds (default 0.25)")
    parser.add_argument(
        "--order",
        choices=("plain-first", "gpupool-first"),
        default="plain-first",
        help="which phase goes first",
    )
    parser.add_argument(
        "--slurm-conf",
        type=Path,
        default=None,
        help="an existing cluster's slurm.conf (default: start a testbed)",
    )
    parser.add_argument(
        "--partition", default=None, help="the partition to use (default: the testbed's, gpu)"
    )
    add_run_options(parser, NAME, max_seconds=900.0, max_seconds_help="give up on a phase after this long")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    warn_shared_db(args.db, args.repeat)
    testbed = None
    conf = args.slurm_conf
    if conf is None:
        testbed = SlurmCluster(Path(tempfile.mkdtemp(prefix="gpupool-bench-slurmd-"))).start()
        conf = testbed.conf
        args.partition = args.partition or testbed.partition
    try:
        runs = []
        for i in range(args.repeat):
            console.print(
                f"[dim]run {i + 1}/{args.repeat}: {args.jobs} x {args.command!r} (1 GPU each), "
                f"{args.order}, slurm.conf {conf}[/dim]"
            )
            runs.append(one_run(args, conf))
    finally:
        if testbed is not None:
            testbed.stop()
    keys = [c.key for c in COLUMNS]
    median = median_of_runs(runs, keys)
    met = median["ratio"] <= TARGET_RATIO and all(
        r["gpupool_complete"] and r["plain_complete"] and r["gpupool_succeeded"] == args.jobs for r in runs
    )
    print_runs(f"Slurm throughput: {args.jobs} x {args.command!r}, 1 GPU each", runs, COLUMNS, median)
    console.print(
        f"target gpupool within {100 * (TARGET_RATIO - 1):.0f}% of plain sbatch: {verdict(met)} "
        f"(median ratio {median['ratio']:.3f}: "
        f"{median['gpupool_seconds']:.1f} s vs {median['plain_seconds']:.1f} s)"
    )
    save_report(NAME, args, runs, keys, median, {"ratio_max": TARGET_RATIO}, met)


if __name__ == "__main__":
    main()
