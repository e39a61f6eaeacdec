"""Node health on a real server with simulated GPUs: faults injected through the CLI, verdicts that drain
a node, and a node that returns only after passing its active checks.

On the head's own node (one node: the drained job waits, requeued, and resumes on the same node once it
passes), and on a pool of two real agent processes, where the head reaches the agents' GPUs through the
heartbeat protocol (fault injection, active checks) and the drained job resumes on the other node."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_preemption import CHECKPOINTING, _log
from tests.support.agent import LOSS_LEASE, AgentProcess, join_token, start_pool
from tests.support.server import ServerProcess


@pytest.fixture
def health_server(tmp_path: Path) -> Iterator[ServerProcess]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "health.yaml").write_text("schedule: {recheck_interval: 2, idle_interval: 0}\n")
    proc = ServerProcess(home=home).start()
    try:
        yield proc
    finally:
        proc.stop()


def until(what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.time() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def node(server: ServerProcess) -> dict[str, Any]:
    rows = json.loads(server.cli("nodes", "--json", check=True).stdout)
    return dict(rows[0])


def health(server: ServerProcess) -> dict[str, Any]:
    with server.http() as client:
        return dict(client.get("/api/v1/health/node-1").json())


def out_of_service(n: dict[str, Any]) -> bool:
    """Unhealthy, in state and health (also while its check job runs there, holding every GPU of the node)."""
    return n["health"] == "unhealthy" and n["state"] == "unhealthy"


def failed_check_of_an_unhealthy_node(server: ServerProcess, name: str) -> subprocess.CompletedProcess[str]:
    """`gpupool health run --node NAME` of an unhealthy node that still fails, with the node watched as
    `gpupool nodes` shows it meanwhile: it never leaves `unhealthy`, also while its check job runs there
    holding every GPU of the node (seen among the node's workloads)."""
    seen: list[dict[str, Any]] = []
    done = threading.Event()

    def watch() -> None:
        with server.http() as client:
            while not done.is_set():
                seen.append(next(n for n in client.get("/api/v1/nodes").json() if n["name"] == name))
                time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        ran = server.cli("health", "run", "--node", name)
    finally:
        done.set()
        watcher.join(10)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert all(out_of_service(n) for n in seen), {(n["state"], n["health"]) for n in seen}
    checking = [n for n in seen if n["workloads"]]
    assert checking, f"no check job seen running on {name} in {len(seen)} looks"
    job = server.workload(checking[0]["workloads"][0])
    assert (job["queue"], job["user"]) == ("gpupool-system", "health")
    assert checking[0]["gpus_allocated"] == checking[0]["gpus_total"]
    return ran


def user_token(server: ServerProcess) -> str:
    """A token of the role `user` (not admin), made by the admin through the CLI."""
    made = json.loads(server.cli("token", "create", "alice", "--role", "user", "--json", check=True).stdout)
    return str(made["token"])


def check_job(server: ServerProcess, workload_id: int, node_name: str, gpus: int) -> dict[str, Any]:
    """The check job as any job is seen: in `gpupool ps`, in the system queue, on the node, holding all its
    GPUs, with its figures in its log."""
    listed = json.loads(server.cli("ps", "--all", "--queue", "gpupool-system", "--json", check=True).stdout)
    assert workload_id in [row["id"] for row in listed]
    job = server.workload(workload_id)
    assert (job["queue"], job["user"], job["state"]) == ("gpupool-system", "health", "succeeded"), job
    attempt = job["attempt_list"][-1]
    assert attempt["node"] == node_name and attempt["gpu_indices"] == list(range(gpus))
    log = server.cli("logs", str(workload_id), check=True).stdout
    assert "GEMM TFLOPS" in log and "# gpupool-bench-result " in log
    why = server.cli("why", str(workload_id), check=True).stdout
    assert "succeeded" in why and "queue gpupool-system" in why and "quota 0" in why
    return job


def test_xid_79_drains_the_node_and_it_returns_only_after_passing_the_active_checks(
    health_server: ServerProcess, job_dir: Path
) -> None:
    server = health_server
    (job_dir / "train.py").write_text(CHECKPOINTING)
    job = server.submit(
        {"resources": {"gpu": 8}, "workdir": str(job_dir), "commands": ["python3 train.py"],
         "env": {"STEPS": 3000}, "checkpoint": "ckpt", "grace_period": "5s"}
    )  # fmt: skip
    server.wait_for(job["id"], ("running",))
    ckpt = job_dir / "ckpt" / "step"
    until("the job to checkpoint", lambda: ckpt.exists() and int(ckpt.read_text() or 0) >= 5)
    # its first verdict: "unknown" until the health loop has judged a sample (it can come after 5 steps)
    until("the node's first verdict", lambda: node(server)["health"] != "unknown")
    assert node(server)["health"] == "healthy"

    server.cli("node", "inject-fault", "node-1", "--gpu", "3", "--xid", "79", check=True)
    server.cli("node", "inject-fault", "node-1", "--gpu", "3", "--slow", "0.5", check=True)

    sick = until("the node to be unhealthy", lambda: (n := node(server))["state"] == "unhealthy" and n)
    assert sick["health"] == "unhealthy"
    assert "GPU 3: Xid 79 (hardware): GPU has fallen off the bus" in sick["health_evidence"]
    drained = server.wait_for(job["id"], ("pending",), timeout=30)
    assert drained["attempt_list"][0]["state"] == "evicted"
    # its history names the fault, not an operator's drain
    assert drained["attempt_list"][0]["reason"].startswith("node node-1 unhealthy (health: GPU 3: Xid 79")
    assert "checkpointed at step" in _log(server, job["id"], attempt=0)

    # Rechecked every 2 s by a check job holding all 8 GPUs: GPU 3 still computes at half speed, so the node
    # stays out and the job waits.
    failed = until("a failed recheck", lambda: (h := health(server)).get("active") and h)
    assert failed["active"]["health"] == "unhealthy"
    assert "GPU 3: BF16 GEMM 396 TFLOPS < 593" in failed["active"]["evidence"]
    check = check_job(server, failed["active"]["job"], "node-1", 8)
    assert "  395.6  " in server.cli("logs", str(check["id"]), check=True).stdout  # GPU 3 at half speed
    failed_check_of_an_unhealthy_node(server, "node-1")
    time.sleep(3)  # and its scheduled rechecks
    assert out_of_service(node(server))
    assert server.workload(job["id"])["state"] == "pending"
    # Changed verdicts only: the Xid, then the Xid and the slow GEMM; a recheck that fails as the last did
    # is no new verdict (each counted twice before: the passive checks alone between rechecks, then both).
    with server.http() as client:
        counted = [
            line for line in client.get("/metrics").text.splitlines()
            if line.startswith("gpupool_health_verdicts_total{") and 'health="unhealthy"' in line
        ]  # fmt: skip
    assert [float(line.rsplit(" ", 1)[1]) for line in counted] == [2.0], counted

    server.cli("node", "inject-fault", "node-1", "--gpu", "3", "--clear", check=True)
    back = until(
        "the node back in service", lambda: (n := node(server))["state"] == "ready" and n, timeout=30
    )
    assert back["health"] == "healthy"
    resumed = server.wait_for(job["id"], ("running",), timeout=30)
    assert resumed["attempts"] == 2 and resumed["restarts"] == 0
    log = until("the resumed attempt's log", lambda: _log(server, job["id"], attempt=1))
    assert "attempt 1 starts at step" in log and "attempt 1 starts at step 0\n" not in log

    events = [(e["from"], e["to"], e["actor"]) for e in health(server)["events"]]
    # Out once, back once: no state change per recheck (the node stays unhealthy while its check job runs).
    assert events == [("ready", "unhealthy", "health"), ("unhealthy", "ready", "health")]
    shown = server.cli("node", "show", "node-1", check=True).stdout
    assert "unhealthy -> ready" in shown and "passed the quick active checks" in shown

    # A check holds every GPU of the node: not while the resumed job runs there.
    refused = server.cli("health", "run", "--node", "node-1")
    assert refused.returncode == 1 and f"node node-1 runs workload {job['id']}" in refused.stderr
    skipped = server.cli("health", "run")  # every node that can: this one, the only one, is skipped
    assert skipped.returncode == 0, skipped.stderr
    assert f"not checked now: node node-1 runs workload {job['id']}" in skipped.stdout, skipped.stdout
    server.cli("cancel", str(job["id"]), check=True)
    server.wait_for(job["id"], ("cancelled",))
    ran = server.cli("health", "run", "--node", "node-1", "--level", "full", "--json")
    assert ran.returncode == 0, ran.stderr
    (report,) = json.loads(ran.stdout)
    assert report["active"]["result"]["allreduce_busbw_gbps"] == 480.0
    check_job(server, report["active"]["job"], "node-1", 8)


def test_warnings_keep_the_node_in_service_and_faults_need_a_simulated_gpu(
    health_server: ServerProcess,
) -> None:
    server = health_server
    server.cli("node", "inject-fault", "node-1", "--gpu", "0", "--throttle", "thermal", check=True)
    warned = until("a warning", lambda: (n := node(server))["health"] == "warning" and n)
    assert warned["state"] == "ready" and "GPU 0: thermal throttling" in warned["health_evidence"]
    table = server.cli("nodes", check=True).stdout
    assert "HEALTH" in table and "warning" in table

    none = server.cli("node", "inject-fault", "node-1", "--gpu", "0")
    assert none.returncode == 1 and "give exactly one of --xid" in none.stderr
    elsewhere = server.cli("node", "inject-fault", "node-9", "--gpu", "0", "--xid", "79")
    assert elsewhere.returncode == 1 and "no node named 'node-9' (nodes: node-1)" in elsewhere.stderr
    bad = server.cli("node", "inject-fault", "node-1", "--gpu", "8", "--xid", "79")
    assert bad.returncode == 1 and "node node-1 has GPUs 0..7" in bad.stderr
    ecc = server.cli("node", "inject-fault", "node-1", "--gpu", "2", "--ecc", "uncorrectable", check=True)
    assert "GPU 2: 1 uncorrectable ECC error, row remap pending" in ecc.stdout
    sick = until("unhealthy", lambda: (n := node(server))["state"] == "unhealthy" and n)
    assert "GPU 2: 1 new uncorrectable ECC error(s)" in sick["health_evidence"]
    server.cli("node", "inject-fault", "node-1", "--gpu", "1", "--fall-off-bus", check=True)
    sick = until("GPU 1 lost", lambda: "7 of 8 expected GPUs" in (n := node(server))["health_evidence"] and n)
    lost = sick["gpus"][1]["uuid"]
    assert f"7 of 8 expected GPUs answer; missing: GPU 1 {lost} (does not answer)" in sick["health_evidence"]
    failed = server.cli("health", "run", "--node", "node-1")
    assert failed.returncode == 2 and "GPU 1: does not answer" in failed.stdout
    top = server.cli("top", "--once", check=True).stdout
    assert "lost" in top and "unhealthy" in top


def test_on_two_agent_nodes_xid_79_drains_one_and_the_job_resumes_on_the_other_from_its_checkpoint(
    tmp_path: Path, job_dir: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "health.yaml").write_text("schedule: {recheck_interval: 2, idle_interval: 0}\n")
    pool = start_pool(tmp_path, 2)
    server = pool.server

    def agent_node(name: str) -> dict[str, Any]:
        return dict(pool.nodes()[name])

    def agent_health(name: str) -> dict[str, Any]:
        with server.http() as client:
            return dict(client.get(f"/api/v1/health/{name}").json())

    try:
        (job_dir / "train.py").write_text(CHECKPOINTING)
        job = server.submit(
            {"resources": {"gpu": 1}, "workdir": str(job_dir), "commands": ["python3 train.py"],
             "env": {"STEPS": 3000}, "checkpoint": "ckpt", "grace_period": "5s"}
        )  # fmt: skip
        server.wait_for(job["id"], ("running",))
        ckpt = job_dir / "ckpt" / "step"
        until("the job to checkpoint", lambda: ckpt.exists() and int(ckpt.read_text() or 0) >= 5)
        sick_name = server.workload(job["id"])["node"]
        (other,) = {"agent-0", "agent-1"} - {sick_name}
        until(
            "both agent nodes healthy",
            lambda: all(agent_node(n)["health"] == "healthy" for n in pool.nodes()),
        )

        # Through the CLI, as an operator would; the head hands each fault to the node's agent.
        xid = server.cli("node", "inject-fault", sick_name, "--gpu", "0", "--xid", "79", check=True)
        assert f"node {sick_name}: GPU 0: Xid 79 reported" in xid.stdout
        server.cli("node", "inject-fault", sick_name, "--gpu", "0", "--slow", "0.5", check=True)

        sick = until(
            "the node to be unhealthy", lambda: (n := agent_node(sick_name))["state"] == "unhealthy" and n
        )
        assert sick["health"] == "unhealthy"
        assert "GPU 0: Xid 79 (hardware): GPU has fallen off the bus" in sick["health_evidence"]
        assert "GPU 0: Xid 79" in sick["state_reason"]

        # Evicted with its grace period (it wrote a checkpoint on SIGTERM), then resumed on the other node.
        moved = until(
            "the job running again on the other node",
            lambda: (w := server.workload(job["id"]))["state"] == "running" and w["attempts"] == 2 and w,
            timeout=60,
        )
        first, second = moved["attempt_list"]
        assert (first["node"], first["state"]) == (sick_name, "evicted")
        assert second["node"] == other and moved["restarts"] == 0
        assert "checkpointed at step" in _log(server, job["id"], attempt=0)
        log = until("the resumed attempt's log", lambda: _log(server, job["id"], attempt=1))
        resumed_at = int(log.split("attempt 1 starts at step ")[1].split()[0])
        assert resumed_at >= 5, log

        # Its agent runs the active checks every 2 s: GPU 0 computes at half speed, so the node stays out.
        failed = until("a failed recheck", lambda: (h := agent_health(sick_name)).get("active") and h)
        assert failed["active"]["health"] == "unhealthy"
        assert "GPU 0: BF16 GEMM 396 TFLOPS < 593" in failed["active"]["evidence"]
        assert failed["active"]["result"]["runner"] == "simulated"
        check_job(server, failed["active"]["job"], sick_name, 1)  # ran on the sick node, through its agent
        ran = failed_check_of_an_unhealthy_node(server, sick_name)
        assert "BF16 GEMM 396 TFLOPS < 593" in ran.stdout and "check job" in ran.stdout, ran.stdout
        time.sleep(3)  # and its scheduled rechecks
        assert out_of_service(agent_node(sick_name))

        server.cli("node", "inject-fault", sick_name, "--gpu", "0", "--clear", check=True)
        back = until(
            "the node back in service", lambda: (n := agent_node(sick_name))["state"] == "ready" and n
        )
        assert back["health"] == "healthy"
        events = [(e["from"], e["to"], e["actor"]) for e in agent_health(sick_name)["events"]]
        # Out once, back once: no state change per recheck, and never cordoned.
        fell = events.index(("ready", "unhealthy", "health"))
        assert events[fell:] == [("ready", "unhealthy", "health"), ("unhealthy", "ready", "health")], events
        assert not [e for e in events if "cordoned" in e], events
        shown = server.cli("node", "show", sick_name, check=True).stdout
        assert "passed the quick active checks" in shown
        full = server.cli("health", "run", "--node", sick_name, "--level", "full", "--json", check=True)
        (report,) = json.loads(full.stdout)
        assert report["health"] == "healthy" and report["active"]["result"]["allreduce_busbw_gbps"] is None
        check_job(server, report["active"]["job"], sick_name, 1)
        busy = server.cli("health", "run", "--node", other)  # the resumed job holds its GPU
        assert busy.returncode == 1 and f"node {other} runs workload {job['id']}" in busy.stderr
        assert server.workload(job["id"])["attempt_list"][-1]["node"] == other

        bad = server.cli("node", "inject-fault", sick_name, "--gpu", "1", "--xid", "79")
        assert bad.returncode == 1 and f"node {sick_name} has GPUs 0..0" in bad.stderr
        server.cli("cancel", str(job["id"]), check=True)
    finally:
        pool.stop()


def test_gpu_history_survives_a_restart_of_the_head(tmp_path: Path) -> None:
    home = tmp_path / "home"

    def history(server: ServerProcess) -> list[list[float]]:
        shown = server.cli("node", "show", "node-1", "--history", "2h", "--json", check=True).stdout
        gpus = json.loads(shown)["telemetry"]["gpus"]
        return list(gpus[0]["history"]["points"]) if gpus else []

    first = ServerProcess(home=home).start()
    try:
        before = until("a 10 s history point", lambda: history(first), timeout=40)
    finally:
        first.stop()
    stopped_at = time.time()
    assert list((home / "telemetry").glob("history-*.jsonl"))

    second = ServerProcess(home=home).start()
    try:
        after = until("history after the restart", lambda: history(second), timeout=20)
        assert after[0] == pytest.approx(before[0], abs=1e-3) and after[0][0] < stopped_at  # 3 decimals kept
    finally:
        second.stop()


def test_idle_agent_nodes_get_active_checks_and_one_that_fails_them_is_taken_out(tmp_path: Path) -> None:
    """Scheduled checks on idle nodes find what passive checks cannot (a GPU computing at half speed);
    the verdict is a metric; fault injection takes an admin token."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "health.yaml").write_text("schedule: {recheck_interval: 2, idle_interval: 3}\n")
    pool = start_pool(tmp_path, 2, lease=LOSS_LEASE)
    server = pool.server

    def events(name: str) -> list[tuple[str, str, str]]:
        with server.http() as client:
            rows = client.get(f"/api/v1/health/{name}").json()["events"]
        return [(e["from"], e["to"], e["reason"]) for e in rows]

    try:

        def active(name: str) -> dict[str, Any]:
            with server.http() as client:
                return dict(client.get(f"/api/v1/health/{name}").json().get("active") or {})

        until("idle checks on both nodes", lambda: all(active(n).get("job") for n in ("agent-0", "agent-1")))
        for name in ("agent-0", "agent-1"):
            assert active(name)["health"] == "healthy"
            check_job(server, active(name)["job"], name, 1)
        # Not cordoned for its checks: the check job held the GPU. (A node may come back cordoned from `lost`
        # if its agent missed the lease on a loaded box.)
        assert not [e for e in events("agent-0") if e[1] == "cordoned" and e[0] != "lost"]

        user = user_token(server)
        with server.http(token=user) as client:
            refused = client.post("/api/v1/nodes/agent-0/faults", json={"gpu": 0, "slow": 0.5})
        assert refused.status_code == 403 and "takes an admin token" in refused.json()["error"]["message"]

        server.cli("node", "inject-fault", "agent-0", "--gpu", "0", "--slow", "0.5", check=True)
        sick = until(
            "agent-0 out of service", lambda: (n := pool.nodes()["agent-0"])["state"] == "unhealthy" and n
        )
        assert "GPU 0: BF16 GEMM 396 TFLOPS < 593" in sick["health_evidence"]
        assert pool.nodes()["agent-1"]["state"] in ("ready", "cordoned")
        with server.http() as client:
            metrics = client.get("/metrics").text
        assert 'gpupool_node_health{health="unhealthy",node="agent-0"} 1.0' in metrics
        assert 'gpupool_health_check_failures_total{check="gemm"}' in metrics

        # Lost (its agent stopped past the lease) and back: still out until it passes the checks.
        def returns() -> int:
            return sum(1 for f, t, _ in events("agent-0") if (f, t) == ("lost", "cordoned"))

        before = returns()
        pool.agent("agent-0").signal(signal.SIGSTOP)
        until("agent-0 lost", lambda: pool.nodes()["agent-0"]["state"] == "lost")
        pool.agent("agent-0").signal(signal.SIGCONT)
        until("agent-0 back from lost", lambda: returns() > before)
        held = until("agent-0 held out", lambda: (n := pool.nodes()["agent-0"])["state"] == "unhealthy" and n)
        # held out by the verdict it left with, or judged again at once by its stored GEMM result (a pass
        # may read that first, on a loaded machine): out either way, until it passes the checks
        said = held["state_reason"]
        assert "not back in service until it passes the active checks" in said or "GEMM 396 TFLOPS" in said, (
            said
        )

        server.cli("node", "inject-fault", "agent-0", "--gpu", "0", "--clear", check=True)
        until("agent-0 back", lambda: pool.nodes()["agent-0"]["state"] == "ready")
        every = json.loads(server.cli("health", "run", "--json", check=True).stdout)  # every node, together
        assert [(r["node"], r["health"]) for r in every] == [("agent-0", "healthy"), ("agent-1", "healthy")]
    finally:
        pool.stop()


def test_a_node_back_from_lost_or_short_of_a_gpu_is_checked_and_only_an_admin_accepts_a_smaller_node(
    tmp_path: Path,
) -> None:
    """An agent node back from `lost` takes no work until it passes the quick active checks. A GPU that fell
    off the bus takes its node out; after a reboot the driver no longer lists it, and the node, though its
    one GPU passes every check, stays out until an admin accepts it as a 1-GPU node."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "health.yaml").write_text("schedule: {recheck_interval: 2, idle_interval: 0}\n")
    pool = start_pool(tmp_path, 1, lease=LOSS_LEASE, gpus="sim:2xH100")
    server, agent = pool.server, pool.agent("agent-0")

    def agent_node() -> dict[str, Any]:
        return dict(pool.nodes()["agent-0"])

    def agent_health() -> dict[str, Any]:
        with server.http() as client:
            return dict(client.get("/api/v1/health/agent-0").json())

    def at(iso: str) -> float:
        return datetime.fromisoformat(iso).timestamp()

    try:
        until("agent-0 healthy", lambda: agent_node()["health"] == "healthy")
        agent.signal(signal.SIGSTOP)
        until("agent-0 lost", lambda: agent_node()["state"] == "lost")
        job = server.submit({"resources": {"gpu": 2}, "commands": ["true"]})  # waits for the node
        agent.signal(signal.SIGCONT)
        done = server.wait_for(job["id"], ("succeeded",), timeout=60)
        events = agent_health()["events"]
        changes = [(e["from"], e["to"], e["reason"]) for e in events if e["from"] != e["to"]]
        back = "health: back from lost; no new work until it passes the active checks"
        assert changes[-2:] == [
            ("lost", "cordoned", back),
            ("cordoned", "ready", "health: back from lost, passed the quick active checks (healthy)"),
        ]
        checked = agent_health()["active"]
        check_job(server, checked["job"], "agent-0", 2)
        returned = next(e for e in reversed(events) if (e["from"], e["to"]) == ("cordoned", "ready"))
        assert at(done["attempt_list"][0]["started_at"]) >= at(returned["at"])  # the job only after

        server.cli("node", "inject-fault", "agent-0", "--gpu", "1", "--fall-off-bus", check=True)
        sick = until("agent-0 out", lambda: (n := agent_node())["state"] == "unhealthy" and n)
        gone = sick["gpus"][1]["uuid"]
        assert (
            f"1 of 2 expected GPUs answer; missing: GPU 1 {gone} (does not answer)" in sick["health_evidence"]
        )
        listed = server.cli("node", "accept-gpus", "agent-0")  # the driver still lists it: nothing to accept
        assert listed.returncode == 1, listed.stdout
        assert "already has the GPUs it is expected to have (2); nothing to accept; GPU 1 still listed" in (
            listed.stderr
        )

        # Rebooted: the driver lists one GPU; its active checks pass, but a GPU it should have is missing.
        agent.stop()
        rebooted = time.time()
        agent.gpus = "sim:1xH100"
        agent.start()
        until("agent-0 registered with 1 GPU", lambda: agent_node()["gpus_total"] == 1)
        passed = until(
            "a passing recheck of its one GPU",
            lambda: (
                (a := agent_health().get("active") or {}).get("health") == "healthy"
                and a["result"]
                and len(a["result"]["gpus"]) == 1
                and agent_health()["active_at"] > rebooted
            ),
            timeout=60,
        )
        assert passed
        still = agent_node()
        assert still["state"] == "unhealthy"
        assert (
            f"1 of 2 expected GPUs answer; missing: GPU 1 {gone} (not listed by the driver)"
            in (still["health_evidence"])
        )

        user = user_token(server)
        with server.http(token=user) as client:
            refused = client.post("/api/v1/nodes/agent-0/expected-gpus")
        assert refused.status_code == 403 and "takes an admin token" in refused.json()["error"]["message"]

        accepted = server.cli("node", "accept-gpus", "agent-0", check=True)
        assert f"expected GPUs 2 -> 1; no longer expected: GPU 1 {gone}" in accepted.stdout
        ready = until("agent-0 back in service", lambda: (n := agent_node())["state"] == "ready" and n, 30)
        assert ready["health"] == "healthy" and ready["gpus_total"] == 1
        again = server.cli("node", "accept-gpus", "agent-0")
        assert again.returncode == 1 and "already has the GPUs it is expected to have (1)" in again.stderr
        shown = server.cli("node", "show", "agent-0", check=True).stdout
        assert "accepted by admin: expected GPUs 2 -> 1" in shown and "expected GPUs: 1" in shown
        missing_node = server.cli("node", "accept-gpus", "agent-9")
        assert (
            missing_node.returncode == 1 and "no node named 'agent-9' (nodes: agent-0)" in missing_node.stderr
        )
    finally:
        pool.stop()


def test_the_sampling_interval_is_configurable_and_bounded(tmp_path: Path) -> None:
    pool = start_pool(tmp_path, 0)
    server = pool.server
    slow = AgentProcess(server, "slow", tmp_path / "agents" / "slow", join_token(server))
    slow.extra_args = ["--telemetry-interval", "3s"]
    pool.agents.append(slow.start())
    try:
        pool.wait_for_nodes(["slow"])
        # Three samples, however long a loaded machine takes to send them (in a fixed 10 s window, a
        # third sample 3 s apart had little time to spare), each taken 3 s after the one before.
        seen: list[float] = []
        deadline = time.time() + 30
        while len(seen) < 3 and time.time() < deadline:
            with server.http() as client:
                gpus = client.get("/api/v1/telemetry/slow").json()["gpus"]
            if gpus and (not seen or gpus[0]["latest"]["at"] != seen[-1]):
                seen.append(gpus[0]["latest"]["at"])
            time.sleep(0.2)
        gaps = [b - a for a, b in itertools.pairwise(seen)]
        assert len(seen) >= 3 and min(gaps) >= 2.5, seen  # every 3 s, not every heartbeat

        argv = ["agent", "--server", server.url, "--telemetry-interval", "60s"]
        bad = subprocess.run(
            [sys.executable, "-m", "gpupool.main", *argv],
            env=server.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bad.returncode == 1 and "--telemetry-interval 60s: between 0.2s and 15s" in bad.stderr
    finally:
        pool.stop()


def test_an_operators_cordon_outlasts_a_fault_and_its_repair(health_server: ServerProcess) -> None:
    """As Slurm's DRAIN: health moves a node it took out, never one an operator took out. A fault on a
    cordoned node leaves it cordoned, with the operator's reason (its work would be stopped; `health`
    says why), and the repair does not put it back in service; the operator's uncordon does."""
    server = health_server
    server.cli("node", "cordon", "node-1", "--reason", "RMA 123: do not use", check=True)
    # Slow first (the passive checks do not see it), so the active checks the Xid brings at once (the node
    # runs no work) fail too: the fault stays judged.
    server.cli("node", "inject-fault", "node-1", "--gpu", "1", "--slow", "0.5", check=True)
    server.cli("node", "inject-fault", "node-1", "--gpu", "1", "--xid", "79", check=True)
    until("the fault judged", lambda: node(server)["health"] == "unhealthy")
    time.sleep(2.5)  # passes of the health loop, and its recheck interval
    held = node(server)
    assert (held["state"], held["state_reason"]) == ("cordoned", "RMA 123: do not use"), held

    server.cli("node", "inject-fault", "node-1", "--gpu", "1", "--clear", check=True)
    passed = json.loads(server.cli("health", "run", "--node", "node-1", "--json", check=True).stdout)
    assert passed[0]["health"] != "unhealthy", passed
    time.sleep(1)
    still = node(server)
    assert (still["state"], still["state_reason"]) == ("cordoned", "RMA 123: do not use"), still
    server.cli("node", "uncordon", "node-1", check=True)
    assert node(server)["state"] == "ready"
    assert all(e["actor"] != "health" for e in health(server)["events"]), health(server)["events"]
