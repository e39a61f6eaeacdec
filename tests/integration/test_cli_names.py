"""Workloads named by their names where the CLI takes ids (`gpupool logs train`, `gpupool cancel web`): the
real CLI against a real head."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.server import ServerProcess


def _refused(result: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a command that failed with exit code 1."""
    assert result.returncode == 1 and not result.stdout, (result.returncode, result.stdout, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr.strip()


def test_logs_show_and_why_take_a_workload_by_its_name(server: ServerProcess, job_dir: Path) -> None:
    server.cli("run", "--name", "hello", "--gpus", "0", "--", "echo", "hi there", cwd=job_dir, check=True)
    assert server.wait_for(1)["state"] == "succeeded"
    assert server.cli("logs", "hello", check=True).stdout == "hi there\n"
    assert server.cli("show", "hello", check=True).stdout.startswith("1 hello  succeeded")
    assert server.cli("why", "hello", check=True).stdout.startswith("1 (hello) succeeded")


def test_cancel_by_name_stops_the_running_job_of_that_name(server: ServerProcess, job_dir: Path) -> None:
    server.cli("run", "--name", "train", "--gpus", "1", "--", "sleep", "60", cwd=job_dir, check=True)
    server.wait_for(1, states=("running",))
    out = server.cli("cancel", "train", check=True).stdout
    assert out.startswith("1 (train): stopping (SIGTERM sent"), out
    assert server.wait_for(1)["state"] == "cancelled"


def test_a_service_is_named_whole_by_its_name_and_a_replica_as_ps_shows_it(server: ServerProcess) -> None:
    service = {"kind": "service", "name": "web", "replicas": 2, "resources": {"gpu": 1},
               "commands": ["sleep 60"]}  # fmt: skip
    first, second = server.submit(service)["replica_ids"]
    for replica in (first, second):
        server.wait_for(replica, states=("running",))
    assert server.cli("show", "web", check=True).stdout.startswith(f"{first} web  running")
    assert server.cli("show", "web#1", check=True).stdout.startswith(f"{second} web#1  running")
    out = server.cli("cancel", "web", check=True).stdout
    assert out.startswith(f"{first} (web): service cancelled, all 2 replicas ({first}, {second})"), out
    assert [server.wait_for(r)["state"] for r in (first, second)] == ["cancelled", "cancelled"]


def test_a_name_that_several_active_workloads_have_is_refused_naming_their_ids(
    server: ServerProcess, job_dir: Path
) -> None:
    for _ in range(3):  # 64 GPUs never fit: all three stay pending
        server.cli("run", "--name", "train", "--gpus", "64", "--", "true", cwd=job_dir, check=True)
    said = "error: 3 pending or running workloads are named 'train' (ids 1, 2, 3): give an id"
    for command in ("logs", "cancel", "hold"):
        assert _refused(server.cli(command, "train")) == said
    assert {server.workload(i)["state"] for i in (1, 2, 3)} == {"pending"}  # nothing was cancelled
    assert server.workload(1)["held"] is False
    assert "1 (train): cancelled" in server.cli("cancel", "1", check=True).stdout  # by id, as ever


def test_a_name_with_no_active_work_reads_its_newest_finished_one_but_changes_nothing(
    server: ServerProcess, job_dir: Path
) -> None:
    for word in ("first", "second"):
        server.cli("run", "--name", "once", "--gpus", "0", "--", "echo", word, cwd=job_dir, check=True)
    assert [server.wait_for(i)["state"] for i in (1, 2)] == ["succeeded", "succeeded"]
    assert server.cli("logs", "once", check=True).stdout == "second\n"  # the newest: the highest id
    waited = server.cli("wait", "once")
    assert waited.returncode == 0 and "workload 2 (once) succeeded" in waited.stderr, waited.stderr
    finished = "error: no pending or running workload is named 'once' (gpupool ps --all lists finished ones)"
    for command in (("cancel", "once"), ("hold", "once"), ("update", "once", "--priority", "100")):
        assert _refused(server.cli(*command)) == finished, command
    unknown = "error: no workload is named 'nothing' (gpupool ps lists them)"
    for command in (("logs", "nothing"), ("cancel", "nothing"), ("scale", "nothing", "2")):
        assert _refused(server.cli(*command)) == unknown, command
    # a name made only of digits would be read as an id: it is refused, by `run` and by the head
    assert _refused(server.cli("run", "--name", "7", "--gpus", "0", "--", "true", cwd=job_dir)) == (
        "error: --name 7: a name of digits alone would be read as a workload id. Slurm's -n is --ntasks; "
        "here -n is --name (a gang of N nodes is -N N)"
    )
    (job_dir / "seven.yaml").write_text("name: '7'\ncommands: [true]\n")
    said = _refused(server.cli("submit", str(job_dir / "seven.yaml")))
    assert said.startswith(
        f"error: {job_dir / 'seven.yaml'}: name: '7' is not a valid name: it is digits alone"
    )
    with server.http() as client:
        response = client.post("/api/v1/workloads", json={"name": "7", "commands": ["true"]})
    assert response.status_code == 422 and response.json()["error"]["field"] == "name", response.text
    assert server.cli("show", "7").returncode == 1  # nothing was submitted


def test_a_name_several_users_run_stands_for_the_callers_own(server: ServerProcess) -> None:
    """alice and the admin run `train`: alice's `gpupool cancel train` is hers, not ambiguous; the admin,
    with two of its own, is told its own ids; bob, with none of them, is told them all."""
    alice = json.loads(server.cli("token", "create", "alice", "--json", check=True).stdout)["token"]
    ours = [server.submit({"name": "train", "commands": ["sleep 60"]})["id"] for _ in range(2)]
    with server.http(alice) as client:
        response = client.post("/api/v1/workloads", json={"name": "train", "commands": ["sleep 60"]})
        assert response.status_code == 201, response.text
        hers = response.json()["id"]
    assert _refused(server.cli("hold", "train")) == (
        f"error: 2 of your pending or running workloads are named 'train' (ids {ours[0]}, {ours[1]}): "
        "give an id"
    )
    server.extra_env["GPUPOOL_TOKEN"] = alice  # the CLI as alice
    try:
        out = server.cli("cancel", "train", check=True).stdout
    finally:
        del server.extra_env["GPUPOOL_TOKEN"]
    assert out.startswith(f"{hers} (train): "), out
    assert server.wait_for(hers)["state"] == "cancelled"
    assert all(server.workload(wid)["state"] in ("pending", "running") for wid in ours)
    bob = json.loads(server.cli("token", "create", "bob", "--json", check=True).stdout)["token"]
    server.cli("cancel", str(ours[1]), check=True)
    with server.http(bob) as client:  # bob's own train, and one of the admin's left
        response = client.post("/api/v1/workloads", json={"name": "train", "commands": ["sleep 60"]})
        assert response.status_code == 201, response.text
        his = response.json()["id"]
    server.extra_env["GPUPOOL_TOKEN"] = bob
    try:
        shown = server.cli("show", "train", check=True).stdout
    finally:
        del server.extra_env["GPUPOOL_TOKEN"]
    assert shown.startswith(f"{his} train"), shown
    carol = json.loads(server.cli("token", "create", "carol", "--json", check=True).stdout)["token"]
    server.extra_env["GPUPOOL_TOKEN"] = carol
    try:
        refused = _refused(server.cli("logs", "train"))
    finally:
        del server.extra_env["GPUPOOL_TOKEN"]
    assert refused == (
        f"error: 2 pending or running workloads are named 'train' (ids {ours[0]}, {his}): give an id"
    )


def test_an_array_is_named_whole_by_its_name_and_a_task_as_ps_shows_it(server: ServerProcess) -> None:
    spec = {"name": "sweep", "array": "0-2", "commands": ["sleep 60"], "resources": {"gpu": 1}}
    tasks = server.submit(spec)
    first, second, third = tasks["array_ids"]
    for task in (first, second, third):
        server.wait_for(task, states=("running",))
    assert "sweep[1]" in server.cli("ps", check=True).stdout  # as ps shows it, the CLI takes it
    assert server.cli("show", "sweep[1]", check=True).stdout.startswith(f"{second} sweep[1]  running")
    assert server.cli("why", "sweep[1]", check=True).stdout.startswith(f"{second} (sweep[1]) is running")
    whole = server.cli("logs", "sweep", check=True)  # the array by its name: its first task, said so
    said = "sweep is a job array of 3 tasks: this is task 0's output; `gpupool logs 'sweep[N]'` gives"
    assert said in whole.stderr, whole.stderr
    out = server.cli("cancel", "sweep[2]", check=True).stdout
    assert out.startswith(f"{third} (sweep[2]): stopping"), out
    assert server.wait_for(third)["state"] == "cancelled"
    assert server.workload(second)["state"] == "running"  # only that task
    # task 0 has the array's id, which names every task: by its name as ps shows it, it is task 0 alone
    refused = _refused(server.cli("run", "--after", "sweep[0]", "--gpus", "0", "--", "true"))
    assert refused.startswith("error: --after sweep[0]: the first task of a job array has the array's id")
    out = server.cli("cancel", "sweep[0]", check=True).stdout
    assert out.startswith(f"{first} (sweep[0]): stopping"), out
    assert server.wait_for(first)["state"] == "cancelled"
    assert server.workload(second)["state"] == "running"
    assert _refused(server.cli("cancel", "sweep[7]")) == (
        "error: no workload is named 'sweep[7]' (gpupool ps lists them)"
    )


def test_several_tasks_in_one_argument_and_slurms_id_n(server: ServerProcess) -> None:
    spec = {"name": "grid", "array": "0-4", "commands": ["sleep 60"], "resources": {"gpu": 0}}
    ids = server.submit(spec)["array_ids"]
    for task in ids:
        server.wait_for(task, states=("running",))
    assert _refused(server.cli("show", "grid[1-2]")) == (
        "error: grid[1-2] names several tasks; this command takes one (e.g. grid[1])"
    )
    server.cli("cancel", "grid[1-2]", check=True)  # scancel's 12_[1-2], by name
    assert [server.wait_for(task)["state"] for task in ids[1:3]] == ["cancelled", "cancelled"]
    assert server.workload(ids[0])["state"] == "running" and server.workload(ids[3])["state"] == "running"
    first = ids[0]
    out = server.cli("cancel", f"{first}_3", check=True).stdout  # Slurm's ID_N: task N alone
    assert out.startswith(f"{ids[3]} (grid[3]): stopping"), out
    assert server.wait_for(ids[3])["state"] == "cancelled"
    assert server.workload(ids[0])["state"] == "running"
    assert server.cli("show", f"{first}_2", check=True).stdout.startswith(f"{ids[2]} grid[2]  cancelled")
    assert (
        _refused(server.cli("cancel", f"{first}_2"))
        == f"error: {first}_2: task 2 of job array {first} has ended (cancelled)"
    )
    assert (
        _refused(server.cli("cancel", f"{first}_9"))
        == f"error: {first}_9: job array {first} (grid) has no task 9"
    )
    assert (
        _refused(server.cli("cancel", "grid[3-1]"))
        == "error: grid[3-1]: '3-1' is not a task index or range; e.g. grid[1-3,7]"
    )
    # tasks 1 to 3 have ended: the range takes the others, task 0 alone (its id is the array's) and 4
    server.cli("cancel", f"{first}_[0-4]", check=True)
    assert [server.wait_for(task)["state"] for task in (ids[0], ids[4])] == ["cancelled", "cancelled"]
    assert _refused(server.cli("cancel", "grid[0-4]")) == (
        "error: grid[0-4]: none of its tasks can be taken (no pending or running workload is named "
        "'grid[0]' (gpupool ps --all lists finished ones))"
    )
    plain = server.submit({"name": "one", "commands": ["true"], "resources": {"gpu": 0}})["id"]
    assert _refused(server.cli("show", f"{plain}_0")) == (
        f"error: {plain}_0: workload {plain} is not a job array (ID_N is task N of the array ID)"
    )


def test_after_takes_the_workload_it_waits_for_by_name(server: ServerProcess, job_dir: Path) -> None:
    server.cli("run", "--name", "prep", "--gpus", "0", "--", "sleep", "30", cwd=job_dir, check=True)
    server.wait_for(1, states=("running",))
    server.cli("run", "--name", "train", "--after", "prep", "--gpus", "0", "--", "true",
               cwd=job_dir, check=True)  # fmt: skip
    assert server.workload(2)["spec"]["after"] == [{"workload": 1, "when": "succeeded"}]
    server.cli("cancel", "prep", check=True)
    assert server.wait_for(1)["state"] == "cancelled"
    # a name with no pending or running work: its newest finished workload, as `gpupool show` reads it
    server.cli("run", "--name", "eval", "--after", "ended:prep", "--gpus", "0", "--", "true", cwd=job_dir,
               check=True)  # fmt: skip
    assert server.workload(3)["spec"]["after"] == [{"workload": 1, "when": "ended"}]
    # Slurm's dependency types are taken as gpupool's conditions, with a name as with an id
    server.cli("run", "--after", "afterany:prep", "--after", "after:eval", "--gpus", "0", "--hold", "--",
               "true", cwd=job_dir, check=True)  # fmt: skip
    assert server.workload(4)["spec"]["after"] == [
        {"workload": 1, "when": "ended"},
        {"workload": 3, "when": "started"},
    ]
    assert _refused(server.cli("run", "--after", "nothere", "--gpus", "0", "--", "true", cwd=job_dir)) == (
        "error: no workload is named 'nothere' (gpupool ps lists them)"
    )
