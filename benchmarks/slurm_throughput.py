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

Where the time goes: after each phase, slurmctld's log (SlurmctldLogFile) gives each job's submit, start
and completion; for gpupool, the API gives when each job was accepted, bound and seen finished. The medians
of each step, the number of Slurm scheduling passes that started jobs (and how many of them came within
0.2 s of a job's completion, i.e. were triggered by it rather than periodic), and the Slurm commands the
head ran (squeue, sbatch, ... and libslurm's slurm_complete_job, which ends a finished job's hand-off) are
reported. --gpupool-env GPUPOOL_SLURM_LIBRARY=none runs gpupool without libslurm (docs/slurm.md).

Target (issue 8): gpupool's time within 10% of plain Slurm's.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import datetime as dt
import json
import os
import re
import shutil
import statistics
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


def slurmctld_log(conf: Path) -> Path | None:
    for line in conf.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip().lower() == "slurmctldlogfile":
            return Path(value.strip())
    return None


def log_size(path: Path | None) -> int:
    return path.stat().st_size if path is not None and path.exists() else 0


LOG_EVENTS = (
    (re.compile(r"submit_batch_job: JobId=(\d+) "), "submit"),
    (re.compile(r"(?:sched: Allocate|_start_job: Started) JobId=(\d+) "), "start"),
    (re.compile(r"_job_complete: JobId=(\d+) done"), "done"),
)


def slurm_events(path: Path | None, offset: int) -> dict[int, dict[str, float]]:
    """Job id -> {submit, start, done}: times from slurmctld's log (written from `offset` on)."""
    events: dict[int, dict[str, float]] = {}
    if path is None or not path.exists():
        return events
    with path.open(errors="replace") as log:
        log.seek(offset)
        for line in log:
            if not line.startswith("[") or "]" not in line:
                continue
            stamp, _, message = line[1:].partition("] ")
            for pattern, kind in LOG_EVENTS:
                found = pattern.search(message)
                if found:
                    try:
                        at = dt.datetime.fromisoformat(stamp).timestamp()
                    except ValueError:
                        break
                    events.setdefault(int(found.group(1)), {}).setdefault(kind, at)
                    break
    return events


def median_step(pairs: list[tuple[float | None, float | None]]) -> float:
    steps = [b - a for a, b in pairs if a is not None and b is not None]
    return statistics.median(steps) if steps else float("nan")


def scheduling_passes(events: dict[int, dict[str, float]], ids: set[int]) -> tuple[int, int]:
    """Slurm passes that started some of `ids` (starts within 50 ms count as one pass), and how many
    of them began within 0.2 s after one of them completed (triggered by a completion, not periodic)."""
    starts = sorted(e["start"] for j, e in events.items() if j in ids and "start" in e)
    dones = sorted(e["done"] for j, e in events.items() if j in ids and "done" in e)
    passes: list[float] = []
    for at in starts:
        if not passes or at - passes[-1] >= 0.05:
            passes.append(at)
    triggered = 0
    for at in passes:
        before = bisect.bisect_left(dones, at) - 1
        if before >= 0 and at - dones[before] <= 0.2:
            triggered += 1
    return len(passes), triggered


def wait_idle(env: dict[str, str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while squeue_names(env):
        if time.monotonic() > deadline:
            raise RuntimeError("the Slurm cluster is not idle; cancel its jobs first (scancel)")
        time.sleep(0.25)


def plain_slurm(
    args: argparse.Namespace, env: dict[str, str], workdir: Path, ctld_log: Path | None
) -> dict[str, Any]:
    """sbatch every job from --clients threads, then poll squeue until none of them is left."""
    errors: list[str] = []
    job_ids: set[int] = set()
    offset = log_size(ctld_log)
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
            elif result.stdout.strip().split(";")[0].isdigit():
                with lock:
                    job_ids.add(int(result.stdout.strip().split(";")[0]))

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
    time.sleep(0.5)  # slurmctld's last log lines
    events = slurm_events(ctld_log, offset)
    ours = [events.get(j, {}) for j in job_ids]
    passes, triggered = scheduling_passes(events, job_ids)
    return {
        "plain_seconds": done if done is not None else float("nan"),
        "plain_complete": done is not None,
        "plain_submit_s": submitted,
        "plain_errors": len(errors),
        "plain_submit_to_start_s": median_step([(e.get("submit"), e.get("start")) for e in ours]),
        "plain_start_to_done_s": median_step([(e.get("start"), e.get("done")) for e in ours]),
        "plain_slurm_passes": passes,
        "plain_passes_after_completion": triggered,
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
        details = [await _detail(conn, wid) for wid in ids]
    finally:
        if not submitting.done():
            submitting.cancel()
        await conn.close()
    states: dict[str, int] = {}
    for w in rows.values():
        states[w["state"]] = states.get(w["state"], 0) + 1
    return {
        "details": details,
        "gpupool_seconds": done if done is not None else float("nan"),
        "gpupool_complete": done is not None,
        "gpupool_succeeded": states.get("succeeded", 0),
        "gpupool_states": states,
        "gpupool_errors": len(errors),
        "pending_explained": explained,
        "pending_unexplained": unexplained,
    }


async def _detail(conn: RawConnection, workload_id: int) -> dict[str, Any]:
    status, data = await conn.request("GET", f"/api/v1/workloads/{workload_id}")
    return dict(json.loads(data)) if status == 200 else {}


def _at(text: str | None) -> float | None:
    return dt.datetime.fromisoformat(text).timestamp() if text else None


def gpupool_steps(details: list[dict[str, Any]], events: dict[int, dict[str, float]]) -> dict[str, Any]:
    """Median seconds of each step of a job's way through gpupool and Slurm, from the API and the log."""
    steps: dict[str, list[tuple[float | None, float | None]]] = {
        "accept_to_bind": [],
        "bind_to_sbatch": [],
        "sbatch_to_start": [],
        "start_to_done": [],
        "done_to_seen": [],
    }
    job_ids = set()
    for workload in details:
        attempts = workload.get("attempt_list") or []
        if not attempts or not attempts[-1].get("slurm_job_id"):
            continue
        attempt = attempts[-1]
        job_id = int(attempt["slurm_job_id"])
        job_ids.add(job_id)
        slurm = events.get(job_id, {})
        bound = _at(attempt.get("started_at"))
        steps["accept_to_bind"].append((_at(workload.get("created_at")), bound))
        steps["bind_to_sbatch"].append((bound, slurm.get("submit")))
        steps["sbatch_to_start"].append((slurm.get("submit"), slurm.get("start")))
        steps["start_to_done"].append((slurm.get("start"), slurm.get("done")))
        steps["done_to_seen"].append((slurm.get("done"), _at(attempt.get("finished_at"))))
    passes, triggered = scheduling_passes(events, job_ids)
    result: dict[str, Any] = {f"gpupool_{k}_s": median_step(v) for k, v in steps.items()}
    result.update({"gpupool_slurm_passes": passes, "gpupool_passes_after_completion": triggered})
    return result


def commands_run(log_text: str) -> dict[str, int]:
    """The head's count of Slurm commands, from its `event=slurm_commands_run` line at shutdown."""
    found = re.findall(r"event=slurm_commands_run(.*)", log_text)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", found[-1])} if found else {}


def server_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--gpupool-env {pair!r}: write NAME=VALUE, e.g. GPUPOOL_SLURM_LIBRARY=none")
        env[name] = value
    return env


def one_run(args: argparse.Namespace, conf: Path) -> dict[str, Any]:
    env = slurm_env(conf)
    wait_idle(env)
    ctld_log = slurmctld_log(conf)
    result: dict[str, Any] = {"jobs": args.jobs}
    phases = ["plain", "gpupool"] if args.order == "plain-first" else ["gpupool", "plain"]
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-slurm-") as workdir:
        for phase in phases:
            if phase == "plain":
                result.update(plain_slurm(args, env, Path(workdir), ctld_log))
            else:
                extra = ["--backend", "slurm"] + (["--partition", args.partition] if args.partition else [])
                server = BenchServer(
                    db_url=args.db,
                    log_level=args.log_level,
                    keep_home=True,
                    extra_args=extra,
                    extra_env={"SLURM_CONF": str(conf), **server_env(args.gpupool_env)},
                )
                offset = log_size(ctld_log)
                try:
                    with server:
                        measured = asyncio.run(through_gpupool(server, args))
                    log_text = (server.home / "server.log").read_text(errors="replace")
                finally:
                    shutil.rmtree(server.home, ignore_errors=True)
                time.sleep(0.5)  # slurmctld's last log lines
                details = measured.pop("details")
                result.update(measured)
                result.update(gpupool_steps(details, slurm_events(ctld_log, offset)))
                calls = commands_run(log_text)
                result["gpupool_commands"] = calls
                result["gpupool_sbatch_calls"] = calls.get("sbatch", 0)
                result["gpupool_squeue_calls"] = calls.get("squeue", 0)
                result["gpupool_complete_calls"] = calls.get("slurm_complete_job", 0)
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
STEPS = [
    Column("plain_submit_to_start_s", "plain: sbatch -> RUNNING", lambda v: f"{v:.2f}"),
    Column("plain_start_to_done_s", "plain: RUNNING -> done", lambda v: f"{v:.2f}"),
    Column("plain_slurm_passes", "plain: Slurm passes", lambda v: f"{v:.0f}"),
    Column("plain_passes_after_completion", "of them after a completion", lambda v: f"{v:.0f}"),
    Column("gpupool_accept_to_bind_s", "gpupool: accept -> bind", lambda v: f"{v:.2f}"),
    Column("gpupool_bind_to_sbatch_s", "bind -> sbatch", lambda v: f"{v:.2f}"),
    Column("gpupool_sbatch_to_start_s", "sbatch -> RUNNING", lambda v: f"{v:.2f}"),
    Column("gpupool_start_to_done_s", "RUNNING -> done", lambda v: f"{v:.2f}"),
    Column("gpupool_done_to_seen_s", "done -> gpupool sees it", lambda v: f"{v:.2f}"),
    Column("gpupool_slurm_passes", "gpupool: Slurm passes", lambda v: f"{v:.0f}"),
    Column("gpupool_passes_after_completion", "of them after a completion", lambda v: f"{v:.0f}"),
    Column("gpupool_sbatch_calls", "sbatch calls", lambda v: f"{v:.0f}"),
    Column("gpupool_squeue_calls", "squeue calls", lambda v: f"{v:.0f}"),
    Column("gpupool_complete_calls", "slurm_complete_job calls", lambda v: f"{v:.0f}"),
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
    parser.add_argument(
        "--gpupool-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="one more environment variable for the gpupool server (GPUPOOL_SLURM_LIBRARY=none); repeatable",
    )
    parser.add_argument(
        "--slurm-option",
        action="append",
        default=[],
        metavar="LINE",
        help="one more slurm.conf line for the testbed, for both phases (e.g. Epilog=/bin/true); repeatable",
    )
    add_run_options(parser, NAME, max_seconds=900.0, max_seconds_help="give up on a phase after this long")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    server_env(args.gpupool_env)  # a malformed one fails now, not after the plain phase
    warn_shared_db(args.db, args.repeat)
    testbed = None
    conf = args.slurm_conf
    if conf is not None and args.slurm_option:
        raise SystemExit("--slurm-option applies to the testbed this script starts; drop --slurm-conf")
    if conf is None:
        base = Path(tempfile.mkdtemp(prefix="gpupool-bench-slurmd-"))
        testbed = SlurmCluster(base, options=tuple(args.slurm_option)).start()
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
    keys = [c.key for c in COLUMNS + STEPS]
    median = median_of_runs(runs, keys)
    met = median["ratio"] <= TARGET_RATIO and all(
        r["gpupool_complete"] and r["plain_complete"] and r["gpupool_succeeded"] == args.jobs for r in runs
    )
    print_runs(f"Slurm throughput: {args.jobs} x {args.command!r}, 1 GPU each", runs, COLUMNS, median)
    print_runs("Where the time goes: median seconds per job, passes, commands", runs, STEPS, median)
    console.print(
        f"target gpupool within {100 * (TARGET_RATIO - 1):.0f}% of plain sbatch: {verdict(met)} "
        f"(median ratio {median['ratio']:.3f}: "
        f"{median['gpupool_seconds']:.1f} s vs {median['plain_seconds']:.1f} s)"
    )
    save_report(NAME, args, runs, keys, median, {"ratio_max": TARGET_RATIO}, met)


if __name__ == "__main__":
    main()
