"""`make demo`: a real gpupool server with 8 simulated H100s running a handful of real jobs.

Starts a server on a free port, or on DEMO_PORT (`make demo DEMO_PORT=8470` for a firewall's one open
port; its own home in .demo/), creates two queues, submits jobs, shows
`gpupool ps` while they run, cancels a checkpointing job and resumes it from its checkpoint, then stops.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gpupool.client.client import Client, load_credentials

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / ".demo"
JOBS = DEMO / "jobs"
GPUPOOL = [sys.executable, "-m", "gpupool.main"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def say(text: str) -> None:
    print(f"\n\033[1;34m== {text}\033[0m", flush=True)


def gpupool(*args: str, show: bool = True, check: bool = True) -> str:
    if show:
        print(f"\033[1m$ gpupool {' '.join(args)}\033[0m", flush=True)
    result = subprocess.run([*GPUPOOL, *args], env=ENV, cwd=JOBS, capture_output=True, text=True)
    if show:
        sys.stdout.write(result.stdout)
        sys.stdout.write(result.stderr)
        sys.stdout.flush()
    if check and result.returncode != 0:
        raise SystemExit(f"demo: `gpupool {' '.join(args)}` failed:\n{result.stderr}")
    return result.stdout


def api() -> Client:
    """The Python SDK, for the demo's own polls: a call takes milliseconds where a CLI process takes a
    second or more on a busy machine, while the jobs it waits for run on the wall clock."""
    global _API
    if _API is None:
        token = load_credentials(DEMO / "home" / "credentials").token
        _API = Client(server=ENV["GPUPOOL_SERVER"], token=token)
    return _API


def workload(workload_id: int) -> dict:
    return api().workload(workload_id)


def output(workload_id: int) -> str:
    """The start of the latest attempt's output (what `gpupool logs` prints first)."""
    return str(api().logs(workload_id)["data"])


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}")
        time.sleep(0.3)


def submit(*args: str) -> int:
    out = gpupool(args[0], "--json", *args[1:], show=False)
    created = json.loads(out)
    shown = " ".join(a for a in args)
    print(
        f"\033[1m$ gpupool {shown}\033[0m\nsubmitted {created['id']} ({created['name']}) "
        f"to queue {created['queue']}: {created['state']}",
        flush=True,
    )
    return int(created["id"])


def main() -> None:
    shutil.rmtree(DEMO, ignore_errors=True)
    # A checkpoint left in examples/jobs by trying the jobs by hand must not make the demo's fine-tune resume.
    shutil.copytree(ROOT / "examples" / "jobs", JOBS, ignore=shutil.ignore_patterns("ckpt", "__pycache__"))
    port = int(os.environ.get("DEMO_PORT") or 0) or free_port()
    ENV.update({"GPUPOOL_HOME": str(DEMO / "home"), "GPUPOOL_SERVER": f"http://127.0.0.1:{port}"})

    (DEMO / "home").mkdir(parents=True)
    # What a GPU-hour costs, for `gpupool usage` (docs/operations.md#prices): read by the server at start.
    (DEMO / "home" / "prices.yaml").write_text("currency: USD\ngpu_hour: {H100: 2.49}\n")
    say(f"Starting a gpupool server on 127.0.0.1:{port} with 8 simulated H100 GPUs (SQLite store)")
    log = open(DEMO / "server.log", "wb")  # noqa: SIM115 - held for the life of the server
    server = subprocess.Popen(
        [*GPUPOOL, "server", "--port", str(port), "--gpus", "sim:8xH100", "--node-name", "demo-node"],
        env=ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: (DEMO / "home" / "credentials").exists() and _healthy(port), 30, "the server")
        print(f"server up; admin token saved to {DEMO / 'home' / 'credentials'} (mode 0600)")
        run_tour()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)
        say("Server stopped")
        print(
            f"Logs: {DEMO / 'home' / 'logs'}/<workload id>/attempt-<n>.log   "
            f"server log: {DEMO / 'server.log'}"
        )


def _healthy(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def run_tour() -> None:
    gpupool("nodes")

    say("Two teams' queues")
    gpupool("queue", "create", "research", "--gpu-quota", "6", "--description", "model research")
    gpupool("queue", "create", "prod", "--gpu-quota", "2", "--gpu-limit", "4", "--priority", "100")
    gpupool("queues")

    say(
        "Submitting work: an eval, a flaky job with retries, a notebook on half a GPU, and a full-node job "
        "that must wait"
    )
    evaluation = submit("submit", "eval.yaml")
    flaky = submit("submit", "flaky.yaml")
    notebook = submit(
        "run",
        "--gpus",
        "0.5",
        "--queue",
        "prod",
        "--name",
        "notebook",
        "--",
        "python3",
        "-c",
        "import time; [print('cell', i, flush=True) or time.sleep(0.5) for i in range(6)]",
    )
    big = submit("submit", "big.yaml")
    # Started, not running: the eval takes about 7 s, and on a busy machine the three submissions after it
    # can take longer than that (it may have finished before the first look).
    wait_until(lambda: workload(evaluation)["state"] != "pending", 20, "the eval to start")
    say("While they run")
    gpupool("ps")
    gpupool("why", str(big))
    gpupool("nodes")

    # The fine-tune runs about 12 s once started, so nothing is shown between its submission and the cancel:
    # a command shown can take seconds on a busy machine (the demo's own polls use the SDK instead).
    say(
        "A checkpointing fine-tune, cancelled once it has checkpointed (SIGTERM; SIGKILL after its 10s grace)"
    )
    train = submit("submit", "train.yaml")
    wait_until(lambda: "step 4/" in output(train), 60, "step 4 of the fine-tune")
    gpupool("cancel", str(train))
    wait_until(lambda: workload(train)["state"] in ("cancelled", "succeeded", "failed"), 30, "the cancel")
    if (state := workload(train)["state"]) != "cancelled":
        raise SystemExit(f"demo: the fine-tune {state} before the cancel reached it (a very busy machine?)")
    gpupool("logs", str(train))

    say("Resubmitting it: it resumes from its checkpoint")
    resumed = submit("submit", "train.yaml")
    wait_until(lambda: "resuming from checkpoint" in output(resumed), 30, "the resume")
    gpupool("ps")

    say("Waiting for everything to finish")
    ids = (evaluation, flaky, notebook, big, resumed)
    wait_until(
        lambda: all(workload(i)["state"] in ("succeeded", "failed", "cancelled") for i in ids), 90, "all jobs"
    )
    gpupool("ps", "--all")
    say("The resumed fine-tune's log, and the flaky job's retry")
    gpupool("logs", str(resumed))
    gpupool("show", str(flaky))
    say("GPU-hours each team used in the last hour, and what they cost (prices.yaml)")
    gpupool("usage", "--since", "1h")


ENV = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
ENV["COLUMNS"] = ENV.get("COLUMNS", "150")  # wide tables even when the output is not a terminal
_API: Client | None = None  # made once the server is up (api())

if __name__ == "__main__":
    main()
