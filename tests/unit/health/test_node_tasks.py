"""The agent's side of the head's instructions: each is carried out once, its reply kept until the head
stops listing it, refusals say why."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

from gpupool.bench.results import reports_in_log
from gpupool.gpu import SimulatedProvider
from gpupool.health.node_tasks import NodeTasks


def _tasks() -> tuple[NodeTasks, SimulatedProvider, threading.Event]:
    done = threading.Event()
    gpus = SimulatedProvider("sim:2xH100", seed="t")
    return NodeTasks(gpus, "agent-0", on_done=done.set), gpus, done


def _reply(tasks: NodeTasks, done: threading.Event, listed: list[dict[str, Any]]) -> dict[str, Any]:
    done.clear()
    tasks.take(listed)
    assert done.wait(5), "no reply"
    return tasks.results()[-1]


def test_an_instruction_is_carried_out_once_and_its_reply_kept_until_the_head_has_it() -> None:
    tasks, gpus, done = _tasks()
    xid = {"id": "a", "kind": "inject_fault", "gpu": 1, "fault": "xid", "value": 79}
    assert _reply(tasks, done, [xid]) == {"id": "a", "result": "GPU 1: Xid 79 reported"}
    tasks.take([xid])  # listed again (an answer computed before the reply arrived): not applied twice
    assert gpus.sample()[1].xid_errors == (79,)
    assert [r["id"] for r in tasks.results()] == ["a"]
    tasks.take([])  # the head no longer lists it: it has the reply
    assert tasks.results() == []


def test_a_check_job_under_the_agent_measures_its_gpus_as_faults_left_them() -> None:
    """The agent publishes its simulated GPUs' condition; a check job it starts (here: a child of this
    process) reads it and reports the injected slowdown in its result line."""
    tasks, _, done = _tasks()
    _reply(tasks, done, [{"id": "s", "kind": "inject_fault", "gpu": 0, "fault": "slow", "value": 0.5}])
    command = [sys.executable, "-m", "gpupool.health.check_job", "--level", "full", "--simulated", "agent-0"]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    (_, report), *_ = reports_in_log(ran.stdout)
    assert report["kind"] == "health_check" and report["result"]["runner"] == "simulated"
    assert [g["gemm_tflops"] for g in report["result"]["gpus"]] == [395.6, 791.2]
    assert "GEMM TFLOPS" in ran.stdout  # the table the job's log shows

    elsewhere = subprocess.run([*command[:-1], "agent-9"], capture_output=True, text=True, timeout=60)
    assert elsewhere.returncode == 1 and "published simulated GPUs of node agent-9" in elsewhere.stderr
    (_, failed), *_ = reports_in_log(elsewhere.stdout)
    assert "agent-9" in failed["error"]


def test_refusals_name_the_field_and_unknown_instructions_ask_for_an_upgrade() -> None:
    tasks, _, done = _tasks()
    bad = _reply(tasks, done, [{"id": "b", "kind": "inject_fault", "gpu": 5, "fault": "xid", "value": 79}])
    assert bad == {"id": "b", "error": "gpu 5: node agent-0 has GPUs 0..1", "kind": "invalid", "field": "gpu"}
    odd = _reply(tasks, done, [{"id": "u", "kind": "reboot"}])
    assert "does not know the instruction 'reboot'" in odd["error"] and "upgrade the agent" in odd["error"]
    old = tasks.carry_out({"id": "x", "kind": "health_check"})  # checks are jobs now, not instructions
    assert "does not know the instruction 'health_check'" in old["error"]
