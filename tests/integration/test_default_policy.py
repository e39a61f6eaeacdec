"""The default policy on a real head: least-attained-service bands inside a queue (spec/scheduling.py),
applied by the control loop to real processes, and switched off by the operator's scheduling.yaml."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.spec.scheduling import parse_scheduling_spec
from tests.integration.test_preemption import CHECKPOINTING
from tests.support.server import ServerProcess

# 8 GPUs for 16 s: 128 GPU-seconds, past the first band's 2 GPU-minutes.
PAST_FIRST_BAND = 16.0


@pytest.fixture
def bands_off(tmp_path: Path) -> Iterator[ServerProcess]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "scheduling.yaml").write_text("las_preempt: false\n")
    proc = ServerProcess(home=home).start()
    try:
        yield proc
    finally:
        proc.stop()


def _log(server: ServerProcess, workload_id: int, attempt: int) -> str:
    with server.http() as client:
        response = client.get(f"/api/v1/workloads/{workload_id}/logs", params={"attempt": attempt})
        return str(response.json()["data"])


def _busy_queue(server: ServerProcess, job_dir: Path, steps: int, checkpoint: bool = True) -> int:
    """A queue whose 8 GPUs an older job (declaring a checkpoint, or not) has held past the first band."""
    (job_dir / "train.py").write_text(CHECKPOINTING)
    with server.http() as client:
        response = client.post("/api/v1/queues", json={"name": "team", "resources": {"gpu": {"quota": 8}}})
        assert response.status_code == 201, response.text
    spec = {
        "queue": "team",
        "resources": {"gpu": 8},
        "workdir": str(job_dir),
        "commands": ["python3 train.py"],
        "env": {"STEPS": steps},
    }
    if checkpoint:
        spec["checkpoint"] = "ckpt-old"
    old = server.submit(spec)
    server.wait_for(old["id"], states=("running",))
    time.sleep(PAST_FIRST_BAND)
    return int(old["id"])


def _new_work_waits_for(server: ServerProcess, old: int) -> dict[str, Any]:
    """A new 1-GPU job of the busy queue waits, nothing is evicted for it, and it starts once the old
    job is cancelled; its waiting view (state, reason) is returned."""
    new = server.submit({"queue": "team", "resources": {"gpu": 1}, "commands": ["echo quick"]})
    waiting = server.wait_for_reason(new["id"])
    assert waiting["state"] == "pending"
    time.sleep(2.0)  # several passes of the loop (every 0.5 s): still nothing is evicted for it
    assert server.workload(new["id"])["state"] == "pending"
    running = server.workload(old)
    assert running["state"] == "running" and running["attempts"] == 1
    with server.http() as client:
        client.post(f"/api/v1/workloads/{old}/cancel")
    assert server.wait_for(new["id"], timeout=60)["state"] == "succeeded"
    return dict(waiting)


def test_new_work_preempts_older_work_of_its_queue_and_the_old_job_resumes(
    server: ServerProcess, job_dir: Path
) -> None:
    old = _busy_queue(server, job_dir, steps=300)
    new = server.submit({"queue": "team", "resources": {"gpu": 1}, "commands": ["echo quick"]})
    assert server.wait_for(new["id"], timeout=60)["state"] == "succeeded"
    victim = server.workload(old)
    first = victim["attempt_list"][0]
    assert first["state"] == "evicted"
    assert "preempted by newer work of queue team" in first["reason"]
    assert "least-attained-service bands" in first["reason"]
    assert "checkpointed at step" in _log(server, old, 0)
    done = server.wait_for(old, timeout=90)
    assert done["state"] == "succeeded" and done["attempts"] == 2 and done["restarts"] == 0
    assert "attempt 1 starts at step 0" not in _log(server, old, 1)


def test_with_bands_off_new_work_waits_for_older_work_of_its_queue(
    bands_off: ServerProcess, job_dir: Path
) -> None:
    old = _busy_queue(bands_off, job_dir, steps=100_000)
    assert _new_work_waits_for(bands_off, old)["reason_code"] == "over-fair-share"


def test_the_api_shows_the_policy_the_server_runs_and_its_file(server: ServerProcess, tmp_path: Path) -> None:
    """`GET /api/v1/scheduling`: scheduling.yaml's fields as the passes apply them (GPU-times in
    GPU-seconds), and the file they came from; the default policy says it has none."""
    with server.http() as client:
        default = client.get("/api/v1/scheduling").json()
    assert default["source"] is None and default["usage_weight"] == 0
    assert default["policy"]["las_thresholds"] == [120, 57600] and default["policy"]["las_preempt"] is True
    home = tmp_path / "tuned"
    home.mkdir()
    (home / "scheduling.yaml").write_text("las_preempt: false\nplacement: spread\nmax_stopping_gpus: 16\n")
    tuned = ServerProcess(home=home, extra_args=["--usage-weight", "1"]).start()
    try:
        with tuned.http() as client:
            shown = client.get("/api/v1/scheduling").json()
        printed = tuned.cli("scheduling", check=True).stdout  # a scheduling.yaml of the same policy
    finally:
        tuned.stop()
    assert f"its file {home / 'scheduling.yaml'}" in printed
    assert "# changed from the default: placement spread, las_preempt false, max_stopping_gpus 16" in printed
    assert "--usage-weight 1, --usage-half-life 7d" in printed
    again = parse_scheduling_spec(printed).config()
    assert again == parse_scheduling_spec((home / "scheduling.yaml").read_text()).config()
    assert shown["source"] == str(home / "scheduling.yaml") and shown["usage_weight"] == 1
    assert shown["usage_half_life_s"] == 7 * 86400
    policy = shown["policy"]
    assert (policy["las_preempt"], policy["placement"], policy["max_stopping_gpus"]) == (False, "spread", 16)
    assert policy["young_weights"] == [{"below": 120, "weight": 4}, {"below": 3600, "weight": 1}]


def test_work_that_declares_no_checkpoint_is_not_preempted_for_newer_work(
    server: ServerProcess, job_dir: Path
) -> None:
    # Preempting it would throw all of its work away: it keeps the top band while it runs.
    old = _busy_queue(server, job_dir, steps=100_000, checkpoint=False)
    _new_work_waits_for(server, old)


def test_gpupool_queues_shows_the_weight_the_last_pass_used_next_to_the_spec_weight(
    server: ServerProcess,
) -> None:
    """Under young-work weights a queue's over-quota weight is its spec weight x its young-work count: two
    new 1-GPU jobs in nlp (weight 1) count 4 + 1 each, so nlp weighs 10 now; cv (weight 2) has no work, 0."""
    server.cli("queue", "create", "nlp", check=True)
    server.cli("queue", "create", "cv", "--gpu-weight", "2", check=True)
    for _ in range(2):
        server.submit({"queue": "nlp", "resources": {"gpu": 1}, "commands": ["sleep 60"]})

    def weights() -> dict[str, float | None]:
        rows = json.loads(server.cli("queues", "--json", check=True).stdout)
        return {q["name"]: q["gpu_weight_now"] for q in rows}

    deadline = time.time() + 30
    while weights().get("nlp") != 10 and time.time() < deadline:
        time.sleep(0.2)
    assert weights() == {"cv": 0, "default": 0, "nlp": 10}
    table = server.cli("queues", check=True).stdout
    assert "WEIGHT (NOW)" in table
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:] if line.strip()}
    # NAME PARENT PRIORITY QUOTA LIMIT WEIGHT WEIGHT(NOW) ...
    assert rows["nlp"][5:7] == ["1", "10"] and rows["cv"][5:7] == ["2", "0"]
    with server.http() as client:
        assert client.get("/api/v1/queues/nlp").json()["gpu_weight_now"] == 10


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("scheduling.yaml", "las_thresholds: [5m, 1m]\n", "las_thresholds[1]: '1m' is not above"),
        ("health.yaml", "schedule: {recheck_interval: soon}\n", "recheck_interval"),
        ("prices.yaml", "gpu_hour: {H100: -2}\n", "gpu_hour.H100: -2 must be at least 0"),
    ],
)
def test_a_server_refused_for_a_bad_file_in_its_home_has_created_nothing(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    """The files of the home are checked before the home, the store or the admin token are created: the
    one-line error, and the home holds only the bad file (no token, no store, no telemetry log)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_HOME"] = str(home)
    started = subprocess.run(
        [sys.executable, "-m", "gpupool.main", "server", "--port", "1", "--gpus", "sim:2xH100"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert started.returncode == 1, started.stderr
    lines = started.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {home / name}: ") and message in lines[0], lines
    assert sorted(p.name for p in home.iterdir()) == [name]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["server", "--port", "1", "--gpus", "sim:2x8xA100"], "--gpus: unknown GPU model '8xA100'"),
        (["server", "--port", "1", "--gpus", "sim:0xH100"], "--gpus: GPU count must be at least 1"),
        (["server", "--port", "1", "--node-lease", "0s"], "--node-lease 0s: must be at least 1s"),
        (["server", "--port", "99999"], "--port 99999: must be 1 to 65535; e.g. 8470"),
        (["server", "--port", "1", "--backend", "k8s"], "--backend k8s: unknown backend; one of local"),
        (["server", "--port", "1", "--db", "mysql://u@db/x"], "mysql://... is not a store gpupool can use"),
        (["server", "--port", "1", "--host", "no-such-host.invalid"], "--host no-such-host.invalid: not an"),
        (
            ["agent", "--server", "http://127.0.0.1:1", "--gpus", "sim:2x8xA100"],
            "--gpus: unknown GPU model '8xA100'",
        ),
    ],
)
def test_a_head_or_agent_refused_for_a_bad_flag_has_created_nothing(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    """A bad flag is refused before the home, the store or the admin token exist: one line, no home."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_HOME"] = str(home)
    started = subprocess.run(
        [sys.executable, "-m", "gpupool.main", *argv],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert started.returncode == 1, started.stderr
    lines = started.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not home.exists()


def test_a_head_whose_port_is_taken_says_so_and_has_created_nothing(tmp_path: Path) -> None:
    """Another process listens on the port: refused before the store exists, not after it started."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_HOME"] = str(home)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = subprocess.run(
            [sys.executable, "-m", "gpupool.main", "server", "--port", str(port), "--gpus", "sim:2xH100"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert started.returncode == 1, started.stderr
    assert started.stderr.strip() == (
        f"error: --port {port}: 127.0.0.1:{port}: address already in use (another gpupool server?); stop it "
        "or choose another --port"
    )
    assert not home.exists()
