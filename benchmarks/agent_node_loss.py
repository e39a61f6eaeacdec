"""Node loss to the job running again elsewhere: a head, two real agents, kill -9 the node running a job.

Each run starts `gpupool server --gpus none --node-lease 10s` (the agent backend, SQLite) on 127.0.0.1 and
two `gpupool agent` processes (simulated GPUs, 1 each) that join with a join token. It submits one job with
`retry: {on: [node-failure]}` whose every attempt first writes the wall time it started (its marker) and
then sleeps. When attempt 0 has started, the node running it dies: kill -9 of its agent and of every
process the agent started (what losing the machine does). Then it records, from the kill:
  * detected: attempt 0 ended as failed with `node-lost` (its finished_at on the head)
  * head_running: the API first showed attempt 1 running on the other node (polled every --poll-ms)
  * restarted: attempt 1's process wrote its marker on the other node (the job runs again)

Target (issue 5): restarted <= 20 s with the node lease at 10 s. The floor is the lease itself: the head
must not declare a node lost before it (a slow network or a paused VM would otherwise lose work).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from typing import Any

from harness import (
    BenchServer,
    Column,
    add_run_options,
    console,
    median_of_runs,
    print_runs,
    save_report,
    verdict,
)

NAME = "agent_node_loss"
TARGET_S = 20.0
AGENTS = ("node-a", "node-b")


class Failed(RuntimeError):
    pass


def _start_agent(server: BenchServer, name: str, token: str) -> subprocess.Popen[bytes]:
    state_dir = server.home / "agents" / name
    state_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    argv = [
        sys.executable, "-m", "gpupool.main", "agent", "--server", server.url, "--join-token", token,
        "--name", name, "--gpus", "sim:1xH100", "--state-dir", str(state_dir),
    ]  # fmt: skip
    with open(server.home / f"{name}.log", "ab") as log:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _rank_groups(server: BenchServer, name: str) -> list[int]:
    """The process groups of the ranks an agent started (each rank runs in a session of its own)."""
    groups = []
    for pid_file in (server.home / "agents" / name / "attempts").glob("*/pid"):
        with contextlib.suppress(ValueError, OSError):
            groups.append(os.getpgid(int(pid_file.read_text().split()[0])))
    return groups


def _wait(predicate: Any, what: str, timeout: float, poll: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)


def _epoch(iso: str | None) -> float | None:
    return dt.datetime.fromisoformat(iso).timestamp() if iso else None


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    poll = args.poll_ms / 1000.0
    extra = ["--gpus", "none", "--node-lease", args.node_lease]
    with BenchServer(db_url=args.db, log_level=args.log_level, extra_args=extra) as server:
        agents: dict[str, subprocess.Popen[bytes]] = {}
        try:
            with server.http() as client:
                token = client.post("/api/v1/join-tokens", json={"ttl": "1h"}).json()["token"]
                for name in AGENTS:
                    agents[name] = _start_agent(server, name, token)

                def ready() -> bool:
                    nodes = client.get("/api/v1/nodes").json()
                    return sum(1 for n in nodes if n["state"] == "ready") == len(AGENTS)

                _wait(ready, "both agents ready", 60, 0.2)
                marks = server.home / "marks"
                marks.mkdir()
                spec = {
                    "name": "node-loss",
                    "resources": {"gpu": 1},
                    "retry": {"max_restarts": 3, "on": ["node-failure"]},
                    "commands": [  # written whole, then renamed: the harness never reads half a marker
                        f"date +%s.%N > {marks}/.attempt-$GPUPOOL_ATTEMPT",
                        f"mv {marks}/.attempt-$GPUPOOL_ATTEMPT {marks}/attempt-$GPUPOOL_ATTEMPT",
                        "sleep 600",
                    ],
                }
                wid = client.post("/api/v1/workloads", json=spec).raise_for_status().json()["id"]
                _wait(lambda: (marks / "attempt-0").exists(), "attempt 0 to start", 60, poll)
                first = client.get(f"/api/v1/workloads/{wid}").json()["attempt_list"][0]
                victim = first["node"]
                groups = _rank_groups(server, victim)
                killed_at = time.time()
                agents[victim].send_signal(signal.SIGKILL)
                for group in groups:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(group, signal.SIGKILL)
                agents[victim].wait(timeout=10)

                def second_running() -> dict[str, Any] | None:
                    attempts = client.get(f"/api/v1/workloads/{wid}").json()["attempt_list"]
                    if len(attempts) > 1 and attempts[1]["state"] == "running":
                        return {"seen_at": time.time(), "attempts": attempts}
                    return None

                seen = _wait(second_running, "attempt 1 running", args.max_seconds, poll)
                marker = _wait(lambda: (marks / "attempt-1").exists(), "attempt 1 to start", 30, poll)
                assert marker
                started = float((marks / "attempt-1").read_text())
                before, after = seen["attempts"][0], seen["attempts"][1]
                if after["node"] == victim or "node-lost" not in (before["reason"] or ""):
                    raise Failed(f"unexpected attempts: {seen['attempts']}")
                client.post(f"/api/v1/workloads/{wid}/cancel")
                detected = _epoch(before["finished_at"])
                return {
                    "detected_s": (detected - killed_at) if detected else float("nan"),
                    "head_running_s": seen["seen_at"] - killed_at,
                    "restarted_s": started - killed_at,
                    "lost_node": victim,
                    "reason": before["reason"],
                }
        finally:
            for name, proc in agents.items():
                groups = _rank_groups(server, name)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=10)
                for group in groups:  # the jobs outlive their agent by design; this run's must not
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(group, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--node-lease", default="10s", help="the head's --node-lease (default 10s)")
    parser.add_argument("--poll-ms", type=float, default=50.0, help="API polling period (default 50 ms)")
    add_run_options(
        parser, NAME, max_seconds=120.0, max_seconds_help="give up on a run after this (default 120)"
    )
    args = parser.parse_args()
    runs = []
    for i in range(args.repeat):
        console.print(f"run {i + 1}/{args.repeat}: kill -9 the node running a job (lease {args.node_lease})")
        runs.append(one_run(args))
    keys = ["detected_s", "head_running_s", "restarted_s"]
    median = median_of_runs(runs, keys)
    columns = [
        Column("detected_s", "node-lost (s)", lambda v: f"{v:.2f}"),
        Column("head_running_s", "attempt 1 running (s)", lambda v: f"{v:.2f}"),
        Column("restarted_s", "attempt 1 process started (s)", lambda v: f"{v:.2f}"),
    ]
    print_runs("node loss to the job running again elsewhere (from the kill -9)", runs, columns, median)
    met = median["restarted_s"] <= TARGET_S
    console.print(f"target restarted <= {TARGET_S:g} s: {verdict(met)}")
    save_report(NAME, args, runs, keys, median, {"restarted_s": TARGET_S}, met)


if __name__ == "__main__":
    main()
