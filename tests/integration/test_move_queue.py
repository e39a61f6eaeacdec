"""Moving waiting work to another queue (`gpupool update --queue`, Slurm's scontrol update Partition=) on a
real server: pending work moves and starts under the new queue's limits, running work is refused with
what to do instead, and GPU-hours already used stay with the queue they were used in."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from tests.support.server import ServerProcess


def _queue_hours(server: ServerProcess) -> dict[str, float]:
    report = json.loads(server.cli("usage", "--by", "queue", "--json", check=True).stdout)
    return {r["key"]: r["gpu_hours"] for r in report["rows"]}


def _hours(attempt: dict[str, Any]) -> float:
    start = datetime.fromisoformat(attempt["started_at"]).timestamp()
    end = datetime.fromisoformat(attempt["finished_at"]).timestamp()
    return len(attempt["gpu_indices"]) * (end - start) / 3600.0


def _tasks(server: ServerProcess, array_id: int) -> list[dict[str, Any]]:
    with server.http() as client:
        listed = client.get("/api/v1/workloads", params={"all": "true"}).json()
    return [w for w in listed if w.get("array_id") == array_id]


def test_pending_work_moves_to_another_queue_and_its_past_gpu_hours_stay(server: ServerProcess) -> None:
    server.cli("queue", "create", "small", "--gpu-limit", "2", check=True)
    server.cli("queue", "create", "large", "--gpu-quota", "4", check=True)
    first = server.submit(
        {"name": "first", "queue": "small", "resources": {"gpu": 2}, "commands": ["sleep 60"]}
    )
    server.wait_for(first["id"], states=("running",))
    waiting = server.submit(
        {"name": "next", "queue": "small", "resources": {"gpu": 2}, "commands": ["sleep 60"]}
    )
    assert server.wait_for_reason(waiting["id"])["state"] == "pending"  # small's limit: 2 GPUs, in use

    moved = server.cli("update", str(waiting["id"]), "--queue", "large", check=True)
    assert f"{waiting['id']} (next): queue large" in moved.stdout, moved.stdout
    started = server.wait_for(waiting["id"], states=("running",))
    assert started["queue"] == "large" and started["spec"]["queue"] == "large"
    assert started["attempt_list"][-1]["queue"] == "large"
    assert "queue small -> large by admin" in [e["reason"] for e in started["events"]]

    # Running work is not moved, and a refused move changes nothing.
    for args, message in (
        (("--queue", "large"), f"workload {first['id']} is running; only pending work moves"),
        (("--queue", "nowhere"), "small); create it with `gpupool queue create nowhere`"),
        (("--queue", "nowhere", "--priority", "build"), "queue 'nowhere' does not exist"),
    ):
        refused = server.cli("update", str(first["id"]), *args)
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr
    assert "`gpupool hold" in server.cli("update", str(first["id"]), "--queue", "large").stderr
    kept = server.workload(first["id"])
    assert (kept["state"], kept["queue"], kept["priority"]) == ("running", "small", 50), kept

    # Held (stopped, pending), moved, released: it runs on in the new queue, and the GPU-hours of its
    # first attempt stay with the queue it ran in.
    server.cli("hold", str(first["id"]), check=True)
    server.wait_until(first["id"], lambda w: w["state"] == "pending" and w["reason_code"] == "held")
    server.cli("update", str(first["id"]), "--queue", "large", check=True)
    server.cli("release", str(first["id"]), check=True)
    again = server.wait_for(first["id"], states=("running",))
    assert [a["queue"] for a in again["attempt_list"]] == ["small", "large"], again["attempt_list"]
    shown = server.cli("show", str(first["id"]), check=True).stdout
    assert "queue=large" in shown and "in queue small" in shown, shown
    server.cli("cancel", str(first["id"]), str(waiting["id"]), check=True)
    ended = server.wait_for(first["id"])
    server.wait_for(waiting["id"])
    time.sleep(0.5)
    hours = _queue_hours(server)
    assert abs(hours["small"] - _hours(ended["attempt_list"][0])) < 1e-3, hours
    assert hours["large"] > 0


def test_a_job_array_moves_its_pending_tasks_and_a_token_moves_work_only_to_its_queues(
    server: ServerProcess,
) -> None:
    server.cli("queue", "create", "nlp", check=True)
    array = server.submit(
        {"name": "sweep", "resources": {"gpu": 4}, "array": "0-3", "commands": ["sleep 60"]}
    )
    deadline = time.time() + 20
    while sorted(w["state"] for w in _tasks(server, array["id"])) != ["pending"] * 2 + ["running"] * 2:
        assert time.time() < deadline, _tasks(server, array["id"])  # two tasks run on the 8 GPUs
        time.sleep(0.1)
    before = {w["id"]: w["state"] for w in _tasks(server, array["id"])}
    out = server.cli("update", str(array["id"]), "--queue", "nlp", check=True).stdout
    assert "queue nlp for the 2 pending; 2 running stay where they are" in out, out
    # (nlp, under its fair share, may then take GPUs back from default: its tasks' queues stay as moved.)
    queues = {w["id"]: w["queue"] for w in _tasks(server, array["id"])}
    assert queues == {i: "nlp" if state == "pending" else "default" for i, state in before.items()}

    made = server.cli("token", "create", "alice", "--queue", "nlp", check=True)
    alice = made.stdout.splitlines()[-1]
    with server.http(alice) as client:
        mine = client.post("/api/v1/workloads", json={"queue": "nlp", "commands": ["sleep 60"]}).json()
        refused = client.patch(f"/api/v1/workloads/{mine['id']}", json={"queue": "default"})
        assert refused.status_code == 403 and refused.json()["error"]["field"] == "queue", refused.text
        assert "may submit only to nlp, not 'default'" in refused.json()["error"]["message"]
        empty = client.patch(f"/api/v1/workloads/{mine['id']}", json={"queue": " "})
        assert empty.status_code == 422 and empty.json()["error"]["field"] == "queue", empty.text
    assert server.workload(mine["id"])["queue"] == "nlp"
    server.cli("cancel", str(array["id"]), str(mine["id"]), check=True)
