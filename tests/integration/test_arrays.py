"""Job arrays (`array`, Slurm's --array) on a real server running real processes: one task per index, each
with its index in the environment, at most %N at once, cancelled whole or a task alone, waited for whole."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from tests.support.server import ServerProcess


def _log(server: ServerProcess, wid: int) -> str:
    with server.http() as client:
        return str(client.get(f"/api/v1/workloads/{wid}/logs").json()["data"])


def test_each_task_runs_once_with_its_index_and_the_limit_holds(server: ServerProcess, job_dir: Path) -> None:
    # Each task records when it ran; with %2, no more than two may overlap.
    created = server.submit(
        {
            "name": "sweep",
            "resources": {"gpu": 1},
            "array": "0-4,10%2",
            "commands": [
                "echo index=$GPUPOOL_ARRAY_INDEX array=$GPUPOOL_ARRAY_ID count=$GPUPOOL_ARRAY_COUNT",
                "date +%s.%N > start-$GPUPOOL_ARRAY_INDEX; sleep 0.6; date +%s.%N > end-$GPUPOOL_ARRAY_INDEX",
            ],
            "workdir": str(job_dir),
        }
    )
    ids = created["array_ids"]
    assert created["id"] == ids[0] and len(ids) == 6
    held = None
    deadline = time.time() + 20
    while held is None:
        for wid in ids:
            w = server.workload(wid)
            if w["reason_code"] == "array-limit":
                held = w
        assert time.time() < deadline
        time.sleep(0.05)
    assert f"array {ids[0]} runs at most 2 of its tasks at once" in held["reason"]
    for wid in ids:
        assert server.wait_for(wid)["state"] == "succeeded"
    indices = [0, 1, 2, 3, 4, 10]
    for wid, index in zip(ids, indices, strict=True):
        w = server.workload(wid)
        assert (w["array_id"], w["array_index"]) == (ids[0], index)
        assert f"index={index} array={ids[0]} count=6" in _log(server, wid)
    spans = [
        (float((job_dir / f"start-{i}").read_text()), float((job_dir / f"end-{i}").read_text()))
        for i in indices
    ]
    for at, _ in spans:
        assert sum(1 for start, end in spans if start <= at < end) <= 2, spans
    head = server.workload(ids[0])
    assert head["array_tasks"] == {"total": 6, "succeeded": 6}
    assert [t["index"] for t in head["task_list"]] == indices
    listed = server.cli("ps", "--all")
    assert "sweep[10]" in listed.stdout, listed.stdout


def test_the_array_id_cancels_the_whole_array_and_a_task_id_one_task(server: ServerProcess) -> None:
    first = server.submit({"array": "0-2", "commands": ["sleep 600"]})
    a, b, c = first["array_ids"]
    for wid in (a, b, c):
        server.wait_for(wid, states=("running",))
    with server.http() as client:
        alone = client.post(f"/api/v1/workloads/{b}/cancel").json()
        assert "cancelled_tasks" not in alone
        assert server.wait_for(b)["state"] == "cancelled"
        assert server.workload(c)["state"] == "running"
        head_only = client.post(f"/api/v1/workloads/{a}/cancel", params={"task": "true"}).json()
        assert "cancelled_tasks" not in head_only
        assert server.wait_for(a)["state"] == "cancelled"
        assert server.workload(c)["state"] == "running"
    second = server.submit({"array": "0-2", "commands": ["sleep 600"]})
    out = server.cli("cancel", str(second["id"]), check=True)
    assert "array cancelled" in out.stdout, out.stdout
    for wid in (*second["array_ids"], c):
        if wid != c:
            assert server.wait_for(wid)["state"] == "cancelled"
    server.cli("cancel", str(c), check=True)


def test_work_after_an_array_waits_for_every_task(server: ServerProcess, job_dir: Path) -> None:
    gate = job_dir / "gate"
    sweep = server.submit(
        {
            "name": "sweep",
            "array": "0-2",
            "commands": [f'[ "$GPUPOOL_ARRAY_INDEX" = 0 ] || while [ ! -e {gate} ]; do sleep 0.05; done'],
        }
    )
    pick = server.submit({"name": "pick", "commands": ["true"], "after": [sweep["id"]]})
    first = sweep["array_ids"][0]
    assert server.wait_for(first)["state"] == "succeeded"

    def waiting(w: dict[str, Any]) -> bool:
        return w["reason_code"] == "dependency" and "its tasks: 2 running, 1 succeeded" in w["reason"]

    deadline = time.time() + 60  # the two tasks must start first: slow on a loaded box
    while not waiting(w := server.workload(pick["id"])):
        assert time.time() < deadline, w
        time.sleep(0.05)
    assert f"waits for array {first} (sweep) to succeed" in w["reason"]
    gate.touch()
    assert server.wait_for(pick["id"])["state"] == "succeeded"
    # One failed task: work after the array's success is cancelled; after its failure, it runs.
    # Its tasks wait for a second gate: ended before the work after it is submitted, that work would be
    # refused (it could never start).
    gate = job_dir / "second gate"
    flaky = server.submit(
        {
            "name": "flaky",
            "array": "0-1",
            "commands": [f'while [ ! -e "{gate}" ]; do sleep 0.05; done; exit "$GPUPOOL_ARRAY_INDEX"'],
        }
    )
    on_success = server.submit({"commands": ["true"], "after": [flaky["id"]]})
    on_failure = server.submit({"commands": ["true"], "after": [f"failed:{flaky['id']}"]})
    gate.touch()
    cancelled = server.wait_for(on_success["id"])
    assert cancelled["state"] == "cancelled"
    # Cancelled as soon as task 1 failed: task 0 may have succeeded by then, or still be pending or running
    # (a loaded box).
    reason = cancelled["reason"]
    tasks = r"\(its tasks: 1 failed, 1 (succeeded|running|pending)\)"
    assert re.search(rf"array {flaky['id']} \(flaky\) can no longer succeed {tasks}", reason), reason
    assert server.wait_for(on_failure["id"])["state"] == "succeeded"


def test_a_bad_array_is_refused_and_changes_nothing(server: ServerProcess) -> None:
    with server.http() as client:
        before = len(client.get("/api/v1/workloads", params={"all": "true"}).json())
        for spec, words in (
            ({"array": "0-1000", "commands": ["true"]}, "more than 1000 tasks"),
            ({"array": "3-1", "commands": ["true"]}, "N <= M"),
            ({"array": "0-3%0", "commands": ["true"]}, "limit after %"),
            ({"kind": "service", "array": "0-3", "commands": ["true"]}, "jobs only"),
        ):
            response = client.post("/api/v1/workloads", json=spec)
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["field"] == "array" and words in error["message"], error
        assert len(client.get("/api/v1/workloads", params={"all": "true"}).json()) == before


def test_submit_makes_an_array_of_a_spec_file_and_show_names_the_task(
    server: ServerProcess, job_dir: Path
) -> None:
    spec = job_dir / "sweep.yaml"
    spec.write_text(
        "name: shard\ncheckpoint: {dir: ckpt}\n"
        "commands: ['echo shard $GPUPOOL_ARRAY_INDEX of $GPUPOOL_ARRAY_COUNT in $GPUPOOL_CHECKPOINT_DIR']\n"
    )
    out = server.cli("submit", str(spec), "--array", "1,3", "--parsable", check=True)
    array_id = int(out.stdout.strip())
    head = server.workload(array_id)
    assert head["spec"]["array"] == "1,3" and head["array_index"] == 1
    second = next(t["id"] for t in head["task_list"] if t["index"] == 3)
    assert server.wait_for(second)["state"] == "succeeded"
    assert f"shard 3 of 2 in {job_dir / 'ckpt' / '3'}" in _log(server, second)  # each task's own
    assert (job_dir / "ckpt" / "3").is_dir()
    shown = server.cli("show", str(second), check=True).stdout
    assert f"array: task 3 of array {array_id} (1,3; 2 tasks:" in shown, shown
