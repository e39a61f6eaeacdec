"""gpupool on a real Slurm: slurmctld, slurmd and munged on loopback, one node with eight GRES GPUs.

gpupool decides (quotas, borrowing, reclaim); Slurm runs what it decided, pinned to the chosen node.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpupool.backends.base import Handle, Launch, Phase, Pod
from tests.support.server import ServerProcess
from tests.support.slurm import SlurmCluster, TwoNodeCluster, missing_binaries

CHECKPOINTING = """
import os, signal, sys, time, pathlib
ckpt = pathlib.Path(os.environ["GPUPOOL_CHECKPOINT_DIR"]) / "step"
step = int(ckpt.read_text()) if ckpt.exists() else 0
print(f"attempt {os.environ['GPUPOOL_ATTEMPT']} slurm job {os.environ['SLURM_JOB_ID']} starts at step {step}",
      flush=True)
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
while step < int(os.environ.get("STEPS", "1000")):
    time.sleep(0.1)
    step += 1
    ckpt.write_text(str(step))
    if stop:
        print(f"checkpointed at step {step}", flush=True)
        sys.exit(143)
print("done", flush=True)
"""
MAX_TIME = "1-00:00:00"  # the testbed partition's MaxTime: a job without max_duration gets it


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    """One real Slurm cluster for the module. In CI it must exist: missing binaries fail, never skip."""
    missing = missing_binaries()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(
                f"Slurm is not installed ({', '.join(missing)}); .ci/run installs slurm-wlm and munge"
            )
        pytest.skip(f"Slurm binaries not installed ({', '.join(missing)}): apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("the Slurm tests start slurmd and munged, which need root")
    base = Path(tempfile.mkdtemp(prefix="gpupool-slurm-"))
    with _started(SlurmCluster(base, max_time=MAX_TIME), base) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def two_nodes(slurm: SlurmCluster) -> Iterator[TwoNodeCluster]:
    """A second cluster, of two nodes on this machine, for gangs and node failures (after the first, which
    checked that Slurm can run here, and which keeps munged up for both)."""
    base = Path(tempfile.mkdtemp(prefix="gpupool-slurm2-"))
    with _started(TwoNodeCluster(base), base) as cluster:
        yield cluster


C = TypeVar("C", SlurmCluster, TwoNodeCluster)


@contextlib.contextmanager
def _started(cluster: C, base: Path) -> Iterator[C]:
    """`cluster` started (stopped again if its start fails), then stopped and its folder removed."""
    try:
        cluster.start()
    except RuntimeError:
        cluster.stop()
        raise
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def server(slurm: SlurmCluster, tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        home=tmp_path / "home",
        gpus="none",
        extra_env={"SLURM_CONF": str(slurm.conf)},
        extra_args=["--backend", "slurm", "--partition", slurm.partition],
    ).start()
    try:
        yield proc
    finally:
        proc.stop()
        slurm.cancel_all()
        _wait(lambda: not _our_jobs(slurm), 20, "Slurm to finish the test's jobs")


def _wait(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.time() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def _our_jobs(slurm: SlurmCluster, state: str = "") -> list[str]:
    argv = ["squeue", "-h", "-o", "%A %j %T"] + (["-t", state] if state else [])
    return [line for line in slurm.run(*argv).stdout.splitlines() if line.strip()]


def _queue(server: ServerProcess, body: dict[str, object]) -> None:
    with server.http() as client:
        response = client.post("/api/v1/queues", json=body)
        assert response.status_code == 201, response.text


def _log(server: ServerProcess, workload_id: int, attempt: int | None = None) -> str:
    with server.http() as client:
        params = {} if attempt is None else {"attempt": attempt}
        return str(client.get(f"/api/v1/workloads/{workload_id}/logs", params=params).json()["data"])


def _node(server: ServerProcess, name: str) -> dict[str, Any]:
    with server.http() as client:
        return next(n for n in client.get("/api/v1/nodes").json() if n["name"] == name)


def test_a_job_runs_as_a_slurm_job_pinned_to_the_scheduled_node_with_the_job_contract(
    slurm: SlurmCluster, server: ServerProcess, job_dir: Path
) -> None:
    node = _node(server, slurm.node)
    assert node["backend"] == "slurm" and node["gpus_total"] == 8 and node["state"] == "ready"
    gate = job_dir / "gate"  # it runs until the test has looked (a "sleep 1" could end before a loaded look)
    job = server.submit(
        {
            "resources": {"gpu": 2},
            "workdir": str(job_dir),
            "commands": [
                'echo "slurm=$SLURM_JOB_ID node=$SLURMD_NODENAME gpus=$SLURM_GPUS_ON_NODE"',
                'echo "job=$GPUPOOL_JOB_ID attempt=$GPUPOOL_ATTEMPT rank=$NODE_RANK"',
                'echo "cvd=$CUDA_VISIBLE_DEVICES"',
                f"while [ ! -e {gate} ]; do sleep 0.1; done",
            ],
        }
    )
    running = server.wait_for(job["id"], states=("running",))
    # The attempt is running (and durable) before sbatch has answered: its Slurm job id follows.
    deadline = time.time() + 30
    while not (attempt := server.workload(job["id"])["attempt_list"][0])["slurm_job_id"]:
        assert time.time() < deadline, f"no Slurm job id recorded: {attempt}"
        time.sleep(0.1)
    slurm_id = attempt["slurm_job_id"]
    assert attempt["backend"] == "slurm" and running["node"] == slurm.node
    record = slurm.run("scontrol", "show", "job", "-o", slurm_id).stdout
    # unique per attempt: the workload, the attempt's number and the start of its fencing token
    assert re.search(rf"JobName=gpupool-{job['id']}\.0\.[0-9a-f]{{8}} ", record) and "gres:gpu:2" in record
    assert f"ReqNodeList={slurm.node}" in record
    gate.touch()

    done = server.wait_for(job["id"], timeout=30)
    assert done["state"] == "succeeded" and done["exit_code"] == 0
    log = _log(server, job["id"])
    assert f"slurm={slurm_id} node={slurm.node} gpus=2" in log
    assert f"job={job['id']} attempt=0 rank=0\ncvd=0,1" in log
    shown = server.cli("show", str(job["id"]), check=True).stdout
    assert f"slurm job {slurm_id}" in shown


def test_max_duration_is_the_slurm_time_limit_refused_past_max_time_and_an_update_raises_it(
    slurm: SlurmCluster, server: ServerProcess, job_dir: Path
) -> None:
    gate = job_dir / "gate"
    wait = [f"while [ ! -e {gate} ]; do sleep 0.1; done"]
    limited = server.submit({"resources": {"gpu": 1}, "commands": wait, "max_duration": "60s",
                             "grace_period": "5s"})  # fmt: skip
    unlimited = server.submit({"resources": {"gpu": 1}, "commands": wait})

    def time_limit(workload_id: int) -> str:
        attempts = server.workload(workload_id)["attempt_list"]
        slurm_id = attempts[0]["slurm_job_id"] if attempts else None
        record = slurm.run("scontrol", "show", "job", "-o", slurm_id).stdout if slurm_id else ""
        return match.group(1) if (match := re.search(r" TimeLimit=(\S+)", record)) else ""

    # sbatch --time: max_duration + grace_period + 60 s, rounded up to Slurm's minutes; none without
    assert _wait(lambda: time_limit(limited["id"]), 30, "the job in Slurm") == "00:03:00"
    assert _wait(lambda: time_limit(unlimited["id"]), 30, "the job in Slurm") == MAX_TIME

    # gpupool update --max-duration: the running job's TimeLimit follows, so the old one cannot end it
    out = server.cli("update", str(limited["id"]), "--max-duration", "2h", check=True)
    assert "max duration 2h" in out.stdout, out.stdout
    _wait(lambda: time_limit(limited["id"]) == "02:02:00", 10, "Slurm's TimeLimit to follow the update")
    # ... but not past the partition's MaxTime, which would end it there: refused, nothing changed
    past = server.cli("update", str(limited["id"]), "--max-duration", "2d")
    assert past.returncode != 0 and "is longer than Slurm partition" in past.stderr, past.stderr
    assert server.workload(limited["id"])["spec"]["max_duration"] == 7200
    assert time_limit(limited["id"]) == "02:02:00"

    # Longer than the partition's MaxTime: Slurm would keep it pending for ever; refused at submit
    with server.http() as client:
        refused = client.post("/api/v1/workloads", json={"commands": ["true"], "max_duration": "2d"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["message"].startswith(
        f"max_duration: '2d' is longer than Slurm partition {slurm.partition}'s MaxTime ({MAX_TIME})"
    ), refused.text
    gate.touch()
    for wid in (limited["id"], unlimited["id"]):
        assert server.wait_for(wid, timeout=30)["state"] == "succeeded"


def test_quotas_and_borrowing_across_two_queues_through_slurm(
    slurm: SlurmCluster, server: ServerProcess, tmp_path: Path
) -> None:
    _queue(server, {"name": "a", "resources": {"gpu": {"quota": 4}}})
    _queue(server, {"name": "b", "resources": {"gpu": {"quota": 4, "limit": 4}}})
    borrowers = [server.submit({"queue": "a", "resources": {"gpu": 1}, "commands": ["sleep 60"],
                                "grace_period": "1s"})["id"] for _ in range(8)]  # fmt: skip
    for wid in borrowers:
        server.wait_for(wid, states=("running",))
    _wait(lambda: len(_our_jobs(slurm, "RUNNING")) == 8, 20, "a's 8 borrowed GPUs to run in Slurm")

    # The claims run until the test opens the gate: with "sleep 5", a loaded machine could end one before
    # the four were seen running together, or start the fifth before it was seen waiting.
    gate = tmp_path / "gate"
    claim = {
        "queue": "b",
        "resources": {"gpu": 1},
        "commands": [f"while [ ! -e {gate} ]; do sleep 0.1; done"],
    }
    claims = [server.submit(claim)["id"] for _ in range(5)]
    # b is owed its quota of 4: four of a's borrowed GPUs are reclaimed; b's limit keeps the fifth waiting.
    _wait(
        lambda: sum(server.workload(w)["state"] == "running" for w in claims) == 4, 30, "b to get its quota"
    )
    fifth = next(w for w in claims if server.workload(w)["state"] == "pending")
    assert server.wait_for_reason(fifth)["reason_code"] == "queue-limit"
    states = [server.workload(wid) for wid in borrowers]
    evicted = [w for w in states if w["attempts"] > 1 or w["state"] == "pending"]
    assert len(evicted) == 4, "exactly the GPUs b is owed are reclaimed"
    assert "reclaimed for queue b" in evicted[0]["attempt_list"][0]["reason"]
    running = _our_jobs(slurm, "RUNNING")
    assert len(running) <= 8, f"Slurm never runs more than the 8 GPUs: {running}"
    gate.touch()
    for wid in claims:
        assert server.wait_for(wid, timeout=40)["state"] == "succeeded"


def test_a_reclaim_evicts_a_slurm_job_which_is_requeued_and_resumes_from_its_checkpoint(
    slurm: SlurmCluster, server: ServerProcess, job_dir: Path
) -> None:
    (job_dir / "train.py").write_text(CHECKPOINTING)
    _queue(server, {"name": "a", "resources": {"gpu": {"quota": 4}}})
    _queue(server, {"name": "b", "resources": {"gpu": {"quota": 4}}})
    trainers = [
        server.submit(
            {
                "queue": "a",
                "resources": {"gpu": 4},
                "workdir": str(job_dir),
                "commands": [f"{sys.executable} train.py"],
                "env": {"STEPS": 60},
                "checkpoint": f"ckpt-{n}",
                "grace_period": "10s",
            }
        )["id"]
        for n in range(2)
    ]
    for wid in trainers:
        _wait(lambda w=wid: "starts at step 0" in _log(server, w), 20, "the training jobs to start")
    time.sleep(1.0)
    claim = server.submit({"queue": "b", "resources": {"gpu": 4}, "commands": ["echo claimed"]})
    assert server.wait_for(claim["id"], timeout=40)["state"] == "succeeded"

    # a borrowed b's quota: one of its trainers (never both: a keeps its own quota) is reclaimed.
    evicted = [w for w in trainers if server.workload(w)["attempt_list"][0]["state"] == "evicted"]
    assert len(evicted) == 1
    victim = server.workload(evicted[0])
    first = victim["attempt_list"][0]
    assert "reclaimed for queue b" in first["reason"]
    assert "checkpointed at step" in _log(server, victim["id"], attempt=0)
    done = server.wait_for(victim["id"], timeout=60)
    assert done["state"] == "succeeded" and done["attempts"] == 2
    second = done["attempt_list"][1]
    assert second["slurm_job_id"] != first["slurm_job_id"], "each attempt is a new Slurm job"
    resumed = _log(server, victim["id"], attempt=1)
    assert "starts at step 0" not in resumed and "done" in resumed


def test_a_health_verdict_drains_the_slurm_node_and_resuming_returns_it(
    slurm: SlurmCluster, server: ServerProcess
) -> None:
    from gpupool.backends.slurm import SlurmBackend
    from gpupool.backends.slurm_commands import SlurmCommands

    backend = SlurmBackend(partition=slurm.partition, commands=SlurmCommands(slurm.env))
    backend.drain_node(slurm.node, "xid 79 on gpu 3 (fell off the bus)")
    fields = slurm.node_fields()
    assert "DRAIN" in fields["State"] and fields["Reason"].startswith("gpupool: xid 79 on gpu 3")
    node = _wait(
        lambda: (n := _node(server, slurm.node))["state"] == "unhealthy" and n, 10, "gpupool to see the drain"
    )
    assert "gpupool: xid 79" in node["state_reason"]
    waiting = server.submit({"resources": {"gpu": 1}, "commands": ["echo ran"]})
    assert server.wait_for_reason(waiting["id"])["state"] == "pending"
    assert not _our_jobs(slurm), "nothing is sent to a drained node"

    backend.resume_node(slurm.node)
    _wait(lambda: _node(server, slurm.node)["state"] == "ready", 10, "gpupool to see the node resumed")
    assert server.wait_for(waiting["id"], timeout=30)["state"] == "succeeded"

    # A drain an operator makes in Slurm (not a gpupool verdict) cordons the node in gpupool.
    slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=drain", "reason=maintenance")
    try:
        node = _wait(lambda: (n := _node(server, slurm.node))["state"] == "cordoned" and n, 10, "a cordon")
        assert "maintenance" in node["state_reason"]
    finally:
        slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=resume")
    _wait(lambda: _node(server, slurm.node)["state"] == "ready", 10, "the node back in service")
    backend.close()


@pytest.mark.parametrize("library", ["found", "none"])
def test_a_finished_job_keeps_its_gpus_until_the_job_placed_on_them_is_queued_in_slurm(
    slurm: SlurmCluster, tmp_path: Path, library: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hand-off: so that Slurm starts a successor as the GPUs free up (docs/slurm.md). The head ends
    the finished job's allocation itself through libslurm (or, with GPUPOOL_SLURM_LIBRARY=none, lets the
    batch script end); either way Slurm records the job's own exit status."""
    from gpupool.backends import slurm as slurm_backend
    from gpupool.backends.slurm import SlurmBackend
    from gpupool.backends.slurm_commands import SlurmCommands

    # No control loop runs here, so the fallback for a stalled one (a settled job lets go after
    # RELEASE_AFTER, 1 s) would race the looks below that it still holds its GPU, which take longer than
    # 0.5 s on a loaded machine: the hand-off is ended only by a successor or by pass_finished().
    monkeypatch.setattr(slurm_backend, "RELEASE_AFTER", 60.0)

    def launch(number: int, gpu: int, script: str) -> Launch:
        return Launch(
            attempt_id=number,
            workload_id=number,
            attempt_number=0,
            script=script,
            env=dict(slurm.env),
            workdir=tmp_path,
            run_dir=tmp_path / "runs" / str(number),
            log_path=tmp_path / "logs" / f"{number}.log",
            pods=(Pod(slurm.node, (gpu,)),),
        )

    def state(handle: Handle) -> str:
        return slurm.job_state(str(handle.pid))

    def ended(handle: Handle) -> bool:
        return state(handle) not in ("RUNNING", "COMPLETING")

    def finished(number: int) -> bool:
        return (tmp_path / "runs" / str(number) / "exit_code").exists()

    env = {**slurm.env, "GPUPOOL_SLURM_LIBRARY": "" if library == "found" else "none"}
    backend = SlurmBackend(partition=slurm.partition, commands=SlurmCommands(env))
    try:
        first = backend.start(launch(1, 0, "echo job 1\n"))
        _wait(lambda: finished(1), 30, "the first job's commands to end")
        backend.cleanup(first)  # the control loop settles the attempt: exit code 0
        time.sleep(0.5)
        assert state(first) == "RUNNING", "settled, it still holds GPU 0 for its successor"

        second = backend.start(
            launch(2, 0, "echo job 2; echo trouble >&2; exit 3\n")
        )  # placed on GPU 0: the first lets go
        _wait(lambda: ended(first), 20, "the first job to end in Slurm")
        assert state(first) == "COMPLETED"
        assert (tmp_path / "logs" / "1.log").read_text() == "job 1\n", "nothing but the job's own output"
        _wait(lambda: finished(2), 30, "the second job to run")

        backend.cleanup(second)
        time.sleep(0.5)
        assert state(second) == "RUNNING", "nothing placed on GPU 0 yet: it still holds it"
        backend.pass_finished()  # the pass placed nothing on GPU 0: the second job lets go at once
        _wait(lambda: ended(second), 20, "the second job to end in Slurm")
        assert state(second) == "FAILED"
        assert "ExitCode=3:0" in slurm.run("scontrol", "show", "job", "-o", str(second.pid)).stdout
        assert (tmp_path / "logs" / "2.log").read_text() == "job 2\ntrouble\n"
        # Debian's slurm-client ships the libslurmfull.so that Slurm's commands use: CI always finds one
        assert backend.commands.calls["slurm_complete_job"] == (2 if library == "found" else 0)
    finally:
        backend.close()


def test_a_foreign_sbatch_job_is_accounted_for(slurm: SlurmCluster, server: ServerProcess) -> None:
    foreign = slurm.sbatch(
        "--job-name=their-training", "--gres=gpu:6", "--output=/dev/null", "--wrap", "sleep 60"
    )
    _wait(lambda: slurm.job_state(foreign) == "RUNNING", 20, "the foreign job to run")
    with server.http() as client:
        seen = _wait(lambda: client.get("/api/v1/foreign-jobs").json(), 10, "gpupool to see the foreign job")
    assert seen[0]["job_id"] == foreign and seen[0]["gpus_per_node"] == 6 and seen[0]["nodes"] == [slurm.node]
    listed = server.cli("ps", "--all", check=True).stdout
    assert "foreign jobs" in listed and foreign in listed and "their-training" in listed

    fits = server.submit({"resources": {"gpu": 2}, "commands": ["echo small"]})
    assert server.wait_for(fits["id"], timeout=30)["state"] == "succeeded"
    too_big = server.submit({"resources": {"gpu": 4}, "commands": ["echo big"]})
    assert server.wait_for_reason(too_big["id"])["state"] == "pending", "6 of 8 GPUs are Slurm's own"
    assert _node(server, slurm.node)["gpus_allocated"] == 0, "foreign use is not gpupool's allocation"

    slurm.run("scancel", foreign)
    assert server.wait_for(too_big["id"], timeout=30)["state"] == "succeeded"
    with server.http() as client:
        _wait(lambda: client.get("/api/v1/foreign-jobs").json() == [], 10, "the foreign job to go")

    # A share of a GPU Slurm cannot give is refused at submit, naming the field (it was accepted, then
    # failed to start six times as "node failures" before it failed)
    with server.http() as client:
        refused = client.post("/api/v1/workloads", json={"resources": {"gpu": 0.5}, "commands": ["true"]})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["message"].startswith(
        "resources.gpu: 0.5 cannot run on Slurm: Slurm gives whole GPUs to a job"
    ), refused.text


def test_server_start_names_the_missing_partition_and_the_missing_tools(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    env = {**os.environ, "SLURM_CONF": str(slurm.conf), "GPUPOOL_HOME": str(tmp_path / "home")}
    argv = [sys.executable, "-m", "gpupool.main", "server", "--backend", "slurm", "--port", "1"]
    wrong = subprocess.run(
        [*argv, "--partition", "nope"], env=env, capture_output=True, text=True, timeout=60
    )
    assert wrong.returncode == 1
    assert f"--partition nope: no such Slurm partition (partitions: {slurm.partition})" in wrong.stderr
    bare = {**env, "PATH": str(tmp_path)}
    missing = subprocess.run(argv, env=bare, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert "--backend slurm needs Slurm's client tools on PATH; missing: sbatch" in missing.stderr
    local = subprocess.run(
        [sys.executable, "-m", "gpupool.main", "server", "--partition", "gpu", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert local.returncode == 1 and "--partition applies to --backend slurm only" in local.stderr
    began = time.monotonic()
    no_conf = subprocess.run(
        argv, env={**env, "SLURM_CONF": "/nonexistent"}, capture_output=True, text=True, timeout=60
    )
    assert no_conf.returncode == 1 and "SLURM_CONF=/nonexistent: no such file" in no_conf.stderr
    assert time.monotonic() - began < 15, "scontrol retries a missing slurm.conf for 60 s: not waited for"


def test_a_service_that_exits_is_started_again_as_a_new_slurm_job_after_its_backoff(
    slurm: SlurmCluster, tmp_path: Path, job_dir: Path
) -> None:
    server = ServerProcess(
        home=tmp_path / "svc-home",
        gpus="none",
        extra_env={"SLURM_CONF": str(slurm.conf)},
        extra_args=["--backend", "slurm", "--partition", slurm.partition, "--restart-backoff", "1s"],
    ).start()
    try:
        gate = job_dir / "gate"
        service = server.submit(
            {
                "kind": "service",
                "resources": {"gpu": 1},
                "workdir": str(job_dir),
                "commands": [
                    'echo "attempt $GPUPOOL_ATTEMPT in slurm job $SLURM_JOB_ID on port $GPUPOOL_PORT"',
                    'test "$GPUPOOL_ATTEMPT" -ge 1 || exit 3',
                    f"while [ ! -e {gate} ]; do sleep 0.1; done",
                ],
            }
        )
        again = _wait(
            lambda: (
                (w := server.workload(service["id"]))["attempts"] == 2
                and w["state"] == "running"
                and w["attempt_list"][1]["endpoint"]  # known once sbatch has answered
                and w
            ),
            60,
            "the service's second attempt to run",
        )
        first, second = again["attempt_list"]
        assert (first["state"], first["exit_code"]) == ("failed", 3)
        assert first["slurm_job_id"] and second["slurm_job_id"] != first["slurm_job_id"]
        # its endpoint: the Slurm node's address and the GPUPOOL_PORT its program was given
        host, port = second["endpoint"].rsplit(":", 1)
        assert host and port.isdigit() and first["endpoint"]
        said = f"attempt 1 in slurm job {second['slurm_job_id']} on port {port}"
        _wait(lambda: said in _log(server, service["id"], 1), 30, "the second attempt's output")
        gate.touch()  # attempt 1 exits 0: a service starts again anyway
        third = _wait(
            lambda: (w := server.workload(service["id"]))["attempts"] == 3 and w, 60, "a third attempt"
        )
        assert third["state"] in ("pending", "running") and third["attempt_list"][1]["exit_code"] == 0
        server.cli("cancel", str(service["id"]), check=True)
        assert server.wait_for(service["id"], timeout=60)["state"] == "cancelled"
    finally:
        server.stop()
        slurm.cancel_all()
        _wait(lambda: not _our_jobs(slurm), 20, "Slurm to finish the test's jobs")


def test_a_gangs_ranks_each_get_sigterm_and_their_grace_period_before_it_ends(
    two_nodes: TwoNodeCluster, tmp_path: Path
) -> None:
    """An eviction's SIGTERM reaches every rank of a two-node gang, and each checkpoints in its own time:
    rank 0's early exit does not cut rank 1's grace short (srun's --kill-on-bad-exit)."""
    from gpupool.backends.slurm import SlurmBackend
    from gpupool.backends.slurm_commands import SlurmCommands

    marks = tmp_path / "marks"
    marks.mkdir()
    # Each rank's program checkpoints on SIGTERM, rank 1 for longer than rank 0 (a program of its own, as a
    # trainer is, not the job script's shell, whose `set -e` may end it before its trap runs).
    (tmp_path / "rank.sh").write_text(
        f'trap \'echo "rank $NODE_RANK got SIGTERM"; sleep $((1 + 2 * NODE_RANK)); '
        f"echo saved > {marks}/checkpoint.$NODE_RANK; exit 143' TERM\n"
        f"touch {marks}/up.$NODE_RANK\n"
        "while true; do sleep 0.1; done\n"
    )
    script = f"sh {tmp_path / 'rank.sh'}\n"
    launch = Launch(
        attempt_id=1, workload_id=1, attempt_number=0, script=script, env=dict(two_nodes.env),
        workdir=tmp_path, run_dir=tmp_path / "runs" / "1" / "0", log_path=tmp_path / "gang.log",
        pods=(Pod(two_nodes.nodes[0], (0,)), Pod(two_nodes.nodes[1], (0,))), fencing_token="0123abcd4567",
    )  # fmt: skip
    backend = SlurmBackend(partition=two_nodes.partition, commands=SlurmCommands(two_nodes.env))
    try:
        handle = backend.start(launch)
        _wait(lambda: all((marks / f"up.{r}").exists() for r in (0, 1)), 30, "both ranks to run")
        backend.signal(handle, signal.SIGTERM)
        _wait(lambda: (launch.run_dir / "exit_code").exists(), 30, "the gang to end")
        assert (marks / "checkpoint.0").exists() and (marks / "checkpoint.1").exists(), (
            "every rank checkpoints in its grace period: " + launch.log_path.read_text()
        )
        log = launch.log_path.read_text()
        assert "rank 0 got SIGTERM" in log and "rank 1 got SIGTERM" in log
        state = backend.status(handle, launch.run_dir)
        assert (state.phase, state.exit_code) == (Phase.EXITED, 143)
    finally:
        backend.close()
        two_nodes.cancel_all()


def test_a_job_whose_node_is_set_down_in_slurm_ends_as_a_node_failure_and_is_requeued(
    two_nodes: TwoNodeCluster, tmp_path: Path, job_dir: Path
) -> None:
    server = ServerProcess(
        home=tmp_path / "home",
        gpus="none",
        extra_env={"SLURM_CONF": str(two_nodes.conf)},
        extra_args=["--backend", "slurm", "--partition", two_nodes.partition],
    ).start()
    node = ""
    try:
        job = server.submit(
            {
                "resources": {"gpu": 1},
                "workdir": str(job_dir),
                "retry": {"on": ["node-failure"]},
                "commands": [
                    'echo "attempt $GPUPOOL_ATTEMPT on $SLURMD_NODENAME"',
                    # the first attempt runs until SIGTERM ends it at once (exit 143), as most programs do
                    'test "$GPUPOOL_ATTEMPT" -ge 1 || while true; do sleep 0.1; done',
                ],
            }
        )
        running = server.wait_for(job["id"], states=("running",))
        _wait(lambda: "attempt 0 on" in _log(server, job["id"]), 30, "the first attempt to run in Slurm")
        node = running["node"]
        two_nodes.run("scontrol", "update", f"nodename={node}", "state=down", "reason=operator test")
        done = server.wait_for(job["id"], timeout=60)
        first = done["attempt_list"][0]
        assert first["reason"].startswith("lost: ") and "NODE_FAIL" in first["reason"], first
        assert "exit code 143" not in first["reason"]
        assert done["state"] == "succeeded" and done["attempts"] == 2, "requeued after the node failure"
    finally:
        server.stop()
        two_nodes.cancel_all()
        if node:
            with contextlib.suppress(RuntimeError):
                two_nodes.run("scontrol", "update", f"nodename={node}", "state=resume")
        _wait(two_nodes.idle, 30, "the node back in service")
