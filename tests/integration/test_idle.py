"""Idle work (spec `idle`, Run:ai's idle GPU timeout) on a real server with simulated GPUs, whose
utilization follows the CPU use of the processes placed on them: a job that leaves its GPU idle is held
after its timeout and runs again once released; one that keeps its GPU busy runs on; an idle service is
cancelled whole."""

from __future__ import annotations

import time

from tests.support.server import ServerProcess

BUSY = "python3 -c 'while True: pass'"  # keeps its simulated GPU near 100%


def test_idle_work_is_held_or_cancelled_and_busy_work_runs_on(server: ServerProcess) -> None:
    resting = server.submit(
        {"name": "notebook", "resources": {"gpu": 1}, "commands": ["sleep 600"], "idle": "10s"}
    )
    busy = server.submit(
        {
            "name": "train",
            "resources": {"gpu": 1},
            "commands": [BUSY],
            "idle": {"timeout": "10s", "action": "cancel"},
        }
    )
    cancel_after = {"timeout": "10s", "action": "cancel"}
    web = server.submit(
        {"kind": "service", "name": "web", "replicas": 2, "resources": {"gpu": 0.5},
         "commands": ["sleep 600"], "idle": cancel_after}
    )  # fmt: skip
    for wid in (resting["id"], busy["id"], web["id"]):
        server.wait_for(wid, states=("running",))
    started = time.time()

    held = server.wait_until(resting["id"], lambda w: w["state"] == "pending" and w["held"], timeout=40.0)
    assert time.time() - started >= 9.0  # not before its timeout (counted from the head's first look)
    first = held["attempt_list"][0]
    assert first["state"] == "evicted"
    assert first["reason"].startswith("idle: its GPUs below 1% utilization for 10s: stopping it"), first
    why = server.cli("why", str(resting["id"]), check=True).stdout
    # who held it stays its reason, pass after pass, until it is released
    assert "idle: its GPUs below 1% utilization for 10s: stopped, and waits pending until" in why, why

    ended = server.wait_until(web["id"], lambda w: w["state"] == "cancelled", timeout=40.0)
    events = [e["reason"] for e in ended["events"]]
    assert "idle: all 2 replicas' GPUs below 1% utilization for 10s: cancelling it" in events, events
    assert server.workload(web["replica_ids"][1])["state"] == "cancelled"
    stopped = server.workload(web["replica_ids"][0])["attempt_list"][0]["reason"]
    assert stopped.startswith("cancelled by idle: all 2 replicas' GPUs below 1%"), stopped  # said once

    assert server.workload(busy["id"])["state"] == "running"  # busy all along: well past its 10 s
    assert time.time() - started >= 10.0

    server.cli("release", str(resting["id"]), check=True)
    again = server.wait_for(resting["id"], states=("running",))
    assert again["attempts"] == 2 and again["held"] is False
    server.cli("cancel", str(resting["id"]), str(busy["id"]), check=True)

    ran = server.cli("run", "--idle", "10m:cancel", "--parsable", "--", "sleep", "1", check=True)
    spec = server.workload(int(ran.stdout.strip()))["spec"]
    assert spec["idle"] == {"timeout": 600.0, "action": "cancel", "utilization": 1.0}
    refused = server.cli("run", "--idle", "10m:stop", "--", "true")
    assert refused.returncode == 1 and "idle.action: 'stop' is not one of 'hold', 'cancel'" in refused.stderr
