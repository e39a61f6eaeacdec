"""Losing a node, a stale agent, a head restart: work moves, resumes from its checkpoint, never runs twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.agent import LOSS_LEASE, start_pool
from tests.support.process import alive

# A small "model" trained by SGD on seeded data; it checkpoints after every step and resumes from the
# newest checkpoint, so the final weights do not depend on where or how often it was interrupted.
TRAIN = """
import json, os, random, sys, time
steps, delay, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ckpt = os.path.join(os.environ["GPUPOOL_CHECKPOINT_DIR"], "state.json")
state = {"step": 0, "w": [0.0] * 4}
if os.path.exists(ckpt):
    with open(ckpt) as fh:
        state = json.load(fh)
    print(f"resumed at step {state['step']}", flush=True)
while state["step"] < steps:
    rng = random.Random(state["step"])
    x = [rng.uniform(-1, 1) for _ in range(4)]
    y = sum(xi * (i + 1) for i, xi in enumerate(x))
    g = sum(w * xi for w, xi in zip(state["w"], x)) - y
    state["w"] = [w - 0.1 * g * xi for w, xi in zip(state["w"], x)]
    state["step"] += 1
    with open(ckpt + ".tmp", "w") as fh:
        json.dump(state, fh)
    os.replace(ckpt + ".tmp", ckpt)
    print(f"step {state['step']} attempt {os.environ['GPUPOOL_ATTEMPT']}", flush=True)
    time.sleep(delay)
with open(out, "w") as fh:
    json.dump(state, fh)
"""


def _rank_pids(state_dir: Path) -> list[int]:
    pids = []
    for pid_file in (state_dir / "attempts").glob("*/pid"):
        pids.append(int(pid_file.read_text().split()[0]))
    return pids


def _wait(predicate, what: str, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def test_a_lost_node_s_job_resumes_elsewhere_from_its_checkpoint_with_the_same_final_state(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    reference = tmp_path / "reference.json"
    env = {**os.environ, "GPUPOOL_CHECKPOINT_DIR": str(tmp_path / "ref-ckpt"), "GPUPOOL_ATTEMPT": "0"}
    (tmp_path / "ref-ckpt").mkdir()
    subprocess.run([sys.executable, str(script), "30", "0", str(reference)], env=env, check=True)

    pool = start_pool(tmp_path, 2, lease=LOSS_LEASE)
    server = pool.server
    try:
        final = tmp_path / "final.json"
        job = server.submit(
            {
                "resources": {"gpu": 1},
                "checkpoint": {"dir": str(tmp_path / "ckpt")},  # no retry policy: a lost node requeues it
                "commands": [f"{sys.executable} {script} 30 0.15 {final}"],
            }
        )
        server.wait_for(job["id"], states=("running",))
        ckpt = tmp_path / "ckpt" / "state.json"
        _wait(lambda: ckpt.exists() and json.loads(ckpt.read_text())["step"] >= 5, "5 steps", 30)
        node = server.workload(job["id"])["node"]
        victim = pool.agent(node)
        # The node dies: its agent and everything it ran.
        pids = _rank_pids(victim.state_dir)
        victim.kill9()
        for pid in pids:
            os.killpg(pid, signal.SIGKILL)

        done = server.wait_for(job["id"], timeout=60)
        assert done["state"] == "succeeded", done
        first, second = done["attempt_list"][0], done["attempt_list"][1]
        assert first["node"] == node and second["node"] != node
        assert first["state"] == "failed" and "node-lost" in first["reason"], first
        assert (done["restarts"], done["node_failures"]) == (0, 1), done
        log = server.cli("logs", str(job["id"]), check=True).stdout
        resumed = int(log.split("resumed at step ")[1].split()[0])
        assert resumed >= 5, log
        assert json.loads(final.read_text()) == json.loads(reference.read_text())
        assert pool.nodes()[node]["state"] == "lost"
        with server.http() as client:  # what it was is history: its health now is not known
            health = client.get(f"/api/v1/health/{node}").json()
            assert health["health"] == "unknown", health
            assert health["evidence"].startswith("node lost: no telemetry for"), health
            metrics = client.get("/metrics").text
        assert f'Hostname="{node}"' not in metrics, "its last samples are not exported as its GPUs now"
    finally:
        pool.stop()


def test_a_stale_agent_is_fenced_when_it_comes_back_after_its_work_moved(tmp_path: Path) -> None:
    pool = start_pool(tmp_path, 2, lease=LOSS_LEASE)
    server = pool.server
    try:
        pid_dir = tmp_path / "pids"
        pid_dir.mkdir()
        job = server.submit(
            {
                "resources": {"gpu": 1},
                # The first attempt runs until it is fenced (were it to end by itself first, there would
                # be nothing to fence: the time a move takes under load is no part of the test).
                "commands": [
                    f"echo $$ > {pid_dir}/attempt-$GPUPOOL_ATTEMPT",
                    'if [ "$GPUPOOL_ATTEMPT" = 0 ]; then sleep 120; fi',
                ],
            }
        )
        server.wait_for(job["id"], states=("running",))
        _wait(lambda: (pid_dir / "attempt-0").exists(), "the first attempt to start", 20)
        stale_pid = int((pid_dir / "attempt-0").read_text())
        node = server.workload(job["id"])["node"]
        stale = pool.agent(node)
        stale.signal(signal.SIGSTOP)  # cut off: no heartbeats, but its work keeps running
        try:
            _wait(lambda: (pid_dir / "attempt-1").exists(), "the work to move to the other agent", 30)
            assert alive(stale_pid), "the stale attempt still runs while its agent is stopped"
        finally:
            stale.signal(signal.SIGCONT)
        # The agent kills the rank, then logs it: wait for both.
        _wait(
            lambda: not alive(stale_pid) and "event=attempt_fenced" in stale.log(),
            "the stale attempt to be fenced and stopped",
            15,
        )
        done = server.wait_for(job["id"], timeout=30)
        assert done["state"] == "succeeded" and done["attempts"] == 2, done
        assert done["attempt_list"][1]["node"] != node
        pool.wait_for_nodes([node], "ready")
    finally:
        pool.stop()


def test_kill9_of_the_head_during_runs_finishes_every_job_exactly_once(tmp_path: Path) -> None:
    pool = start_pool(tmp_path, 2, gpus="sim:2xH100")
    server = pool.server
    try:
        marks = tmp_path / "marks"
        marks.mkdir()
        jobs = [
            server.submit(
                {
                    "resources": {"gpu": 1},
                    "commands": [
                        f"echo start >> {marks}/{i}",
                        f"sleep {2 + i % 3}",
                        f"echo end >> {marks}/{i}",
                    ],
                }
            )
            for i in range(6)
        ]
        _wait(lambda: len(list(marks.iterdir())) >= 4, "four jobs to start", 30)
        server.kill9()
        time.sleep(2.0)  # some jobs end while nobody watches; agents keep their exit statuses
        server.start()
        for job in jobs:
            done = server.wait_for(job["id"], timeout=60)
            assert done["state"] == "succeeded" and done["attempts"] == 1, done
        for i in range(6):
            assert (marks / str(i)).read_text().split() == ["start", "end"], f"job {i} ran more than once"
    finally:
        pool.stop()


def test_work_that_ends_while_the_head_is_down_is_charged_until_its_end_not_the_head_s_return(
    tmp_path: Path,
) -> None:
    pool = start_pool(tmp_path, 1)
    server = pool.server
    try:
        started = tmp_path / "started"
        job = server.submit({"resources": {"gpu": 1}, "commands": [f"touch {started}", "sleep 2", "exit 3"]})
        _wait(started.exists, "the job to start", 30)
        server.kill9()
        time.sleep(8.0)  # it ends about 2 s into the outage
        server.start()
        done = server.wait_for(job["id"], timeout=60)
        assert done["state"] == "failed" and "exit code 3" in done["attempt_list"][-1]["reason"], done
        assert done["run_seconds"] < 6.0, done  # charged 10 s and more before (until the head was back)
    finally:
        pool.stop()


def test_an_agent_cut_off_from_the_head_stops_its_work_after_the_orphan_grace(tmp_path: Path) -> None:
    # 6 s: the 1.5 s outage below stays well inside it even when a loaded machine delayed the agent's last
    # heartbeat before the head died (the grace counts from the last answer the agent got).
    pool = start_pool(tmp_path, 1, orphan_grace="6s")
    server = pool.server
    try:
        pid_file = tmp_path / "pid"
        job = server.submit({"resources": {"gpu": 1}, "commands": [f"echo $$ > {pid_file}", "sleep 60"]})
        server.wait_for(job["id"], states=("running",))
        _wait(pid_file.exists, "the job to start", 20)
        pid = int(pid_file.read_text())
        server.kill9()
        time.sleep(1.5)
        assert alive(pid), "a short outage of the head costs nothing"
        _wait(lambda: not alive(pid), "the orphan grace to stop the work", 15)
        assert "event=orphan_grace_expired" in pool.agents[0].log()
        # Back, the head learns why the work ended: not its own failure, but its node's (as after a lost
        # node), so it is requeued without using a restart, and starts again.
        server.start()
        _wait(lambda: server.workload(job["id"])["attempts"] >= 2, "the job to be requeued and started", 60)
        shown = server.workload(job["id"])
        first = shown["attempt_list"][0]
        assert "stopped by its node's agent: no answer from the head" in first["reason"], first
        assert shown["node_failures"] == 1 and shown["restarts"] == 0, shown
        assert any("requeued after node failure 1 of 5" in e["reason"] for e in shown["events"]), shown
    finally:
        pool.stop()


def test_a_head_that_stood_still_past_the_lease_loses_no_node_and_no_work(tmp_path: Path) -> None:
    """A head process stopped for longer than the node lease (a paused VM, a starved container) finds its
    agents' heartbeats waiting when it runs again: no node is lost, and the job on one runs on."""
    pool = start_pool(tmp_path, 2, lease=LOSS_LEASE)
    server = pool.server
    gate = tmp_path / "gate"
    try:
        job = server.submit(
            {"resources": {"gpu": 1}, "commands": [f"while [ ! -e {gate} ]; do sleep 0.1; done"]}
        )
        server.wait_for(job["id"], ("running",), timeout=30)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        time.sleep(8.0)  # past the 6 s lease
        server.proc.send_signal(signal.SIGCONT)
        time.sleep(3.0)  # heartbeats read, passes run
        assert {name: n["state"] for name, n in pool.nodes().items()} == {
            "agent-0": "ready",
            "agent-1": "ready",
        }
        for name in ("agent-0", "agent-1"):
            with server.http() as client:
                events = client.get(f"/api/v1/health/{name}").json()["events"]
            assert not [e for e in events if e["to"] == "lost"], events
        assert server.workload(job["id"])["state"] == "running"
        assert "event=head_not_listening" in server.log()
        gate.touch()
        done = server.wait_for(job["id"], timeout=30)
        assert done["state"] == "succeeded" and done["attempts"] == 1, done
    finally:
        pool.stop()
