"""The real `gpupool` CLI against a real server: what a person types and reads."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.server import ServerProcess


def test_run_ps_logs_show_cancel_through_the_cli(server: ServerProcess, job_dir: Path) -> None:
    out = server.cli(
        "run",
        "--gpus",
        "2",
        "--name",
        "hello",
        "--",
        "bash",
        "-c",
        "echo hi from $CUDA_VISIBLE_DEVICES",
        cwd=job_dir,
        check=True,
    ).stdout
    assert "submitted 1 (hello)" in out
    server.wait_for(1)
    rows = json.loads(server.cli("ps", "--all", "--json", check=True).stdout)
    assert rows[0]["id"] == 1 and rows[0]["state"] == "succeeded"
    assert {"id", "name", "queue", "state", "gpus", "node", "age"} <= set(rows[0])
    # the API's fields, as `show --json` gives them, not only the table's columns
    shown = json.loads(server.cli("show", "1", "--json", check=True).stdout)
    api = ("priority", "created_at", "started_at", "finished_at", "run_seconds", "max_duration", "held")
    assert {key: rows[0][key] for key in (*api, "attempts")} == {
        **{key: shown[key] for key in api},
        "attempts": len(shown["attempt_list"]),
    }
    assert "hi from 0,1" in server.cli("logs", "1", check=True).stdout
    table = server.cli("ps", "--all", check=True).stdout
    assert "hello" in table and "succeeded" in table
    assert "exit code 0" in server.cli("show", "1", check=True).stdout

    server.cli("run", "--gpus", "1", "--", "sleep", "30", cwd=job_dir, check=True)
    server.wait_for(2, states=("running",))
    assert "stopping" in server.cli("cancel", "2", check=True).stdout
    assert server.wait_for(2)["state"] == "cancelled"

    # What the user wrote comes back as written: brackets are text, not Rich markup.
    listed = "python3 -c 'print([i for i in range(3)])'; echo [bold]x"
    server.cli("run", "--gpus", "0", "--", "bash", "-c", listed, cwd=job_dir, check=True)
    assert server.wait_for(3)["state"] == "succeeded"
    shown = server.cli("show", "3", check=True).stdout
    assert f"commands: bash -c {shlex.quote(listed)}" in shown, shown
    assert "[0, 1, 2]\n[bold]x" in server.cli("logs", "3", check=True).stdout
    (job_dir / "broken.yaml").write_text("kind: job\nresources: {gpu: 2\n")
    broken = server.cli("submit", str(job_dir / "broken.yaml"))
    assert broken.returncode == 1 and broken.stderr.rstrip().endswith(
        "e.g. {kind: job, commands: [python train.py]}"
    ), broken.stderr
    assert broken.stderr.startswith(f"error: {job_dir / 'broken.yaml'}: <yaml>: "), broken.stderr  # the file


def test_run_takes_slurm_style_nodes_cpus_and_memory(server: ServerProcess, job_dir: Path) -> None:
    """`-N`, `-c` and `--memory` are the spec's `nodes`, `resources.cpu` and `resources.memory`, as srun's
    -N, -c and --mem; an option `run` does not have is refused, not run as the command (`--mem` here), and
    so is a memory without its unit."""
    stray = server.cli("run", "--mem", "1GB", "--", "true", cwd=job_dir)
    assert stray.returncode == 1 and "'--mem' is not an option of gpupool run" in stray.stderr
    spaced = server.cli("run", "--memory", "5", "GB", "--", "true", cwd=job_dir)  # not 5 bytes, running `GB`
    assert spaced.returncode == 1 and "--memory 5: give a unit, e.g. --memory 5GB" in spaced.stderr
    gang = ("-N", "2", "-c", "1", "--memory", "1GB", "--gpus", "0")
    server.cli("run", *gang, "--", "true", cwd=job_dir, check=True)
    spec = json.loads(server.cli("show", "1", "--json", check=True).stdout)["spec"]  # the stray made none
    assert spec["nodes"] == 2
    assert (spec["resources"]["cpu"], spec["resources"]["memory"]) == (1.0, 1_000_000_000)
    assert spec["commands"] == ["true"]


def test_interactive_work_waits_for_a_quota_unless_run_preemptible(
    server: ServerProcess, job_dir: Path
) -> None:
    """Above priority train, work is non-preemptible and runs only within its queue's GPU quota (Run:ai's
    rule): on a fresh head, whose default queue has none, it waits, and its reason says both ways out;
    `--preemptible` (Run:ai's flag for interactive work) lets it borrow the idle GPUs at once."""
    waits = int(
        server.cli("run", "--parsable", "--priority", "interactive", "--", "true", cwd=job_dir).stdout
    )
    told = server.wait_until(waits, lambda w: w["reason_code"] == "over-quota-nonpreemptible")
    assert "`gpupool queue update default --gpu-quota 1`" in told["reason"]
    assert "`gpupool run --preemptible`" in told["reason"]
    runs = server.cli(
        "run", "--parsable", "--priority", "interactive", "--preemptible", "--", "true", cwd=job_dir
    )
    done = server.wait_for(int(runs.stdout))
    assert done["state"] == "succeeded" and done["preemptible"] is True
    assert done["priority"] == told["priority"] and told["preemptible"] is False
    assert server.workload(waits)["state"] == "pending"
    server.cli("queue", "update", "default", "--gpu-quota", "1", check=True)  # the other way out
    assert server.wait_for(waits)["state"] == "succeeded"


def test_run_without_dashes_gives_the_command_every_word_after_its_name(
    server: ServerProcess, job_dir: Path
) -> None:
    """As `docker run`: run's options come first; from the command's first word on, `--name x` and
    `--gpus 4` are the command's own."""
    server.cli("run", "--gpus", "0", "echo", "hi", "--name", "x", "--gpus", "4", cwd=job_dir, check=True)
    job = server.wait_for(1)
    assert (job["state"], job["name"], job["gpus"]) == ("succeeded", "job-1", "0")
    assert server.cli("logs", "1", check=True).stdout == "hi --name x --gpus 4\n"


def test_run_passes_environment_variables_to_the_job(
    server: ServerProcess, job_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-e KEY=VALUE` as `docker run -e`; `-e KEY` takes this shell's value; an unset KEY is refused."""
    monkeypatch.setenv("SHELL_VALUE", "from-the-shell")  # the CLI's environment (ServerProcess.env)
    missing = server.cli("run", "-e", "NOT_SET_ANYWHERE_XYZ", "--", "true", cwd=job_dir)
    assert missing.returncode == 1 and "NOT_SET_ANYWHERE_XYZ is not set in this shell" in missing.stderr
    server.cli(
        "run", "--gpus", "0", "-e", "GREETING=hello", "--env", "WITH_EQUALS=a=b", "-e", "SHELL_VALUE",
        "--", "bash", "-c", "echo $GREETING $SHELL_VALUE $WITH_EQUALS", cwd=job_dir, check=True,
    )  # fmt: skip
    assert server.wait_for(1)["state"] == "succeeded"
    assert server.cli("logs", "1", check=True).stdout == "hello from-the-shell a=b\n"


def test_submit_a_yaml_spec_runs_in_the_spec_folder(server: ServerProcess, job_dir: Path) -> None:
    (job_dir / "job.yaml").write_text(
        "name: from-yaml\nresources: {gpu: 'H100:1'}\ncommands:\n  - cat data.txt\n"
    )
    (job_dir / "data.txt").write_text("local data\n")
    out = server.cli("submit", str(job_dir / "job.yaml"), check=True).stdout
    assert "from-yaml" in out
    assert server.wait_for(1)["state"] == "succeeded"
    assert server.cli("logs", "1", check=True).stdout == "local data\n"


def test_logs_prints_a_log_longer_than_a_chunk_whole(server: ServerProcess, job_dir: Path) -> None:
    """The server sends a log in chunks of 1 MiB: `logs` reads them all, and a character cut by a chunk's
    end comes whole in the next (here 'é', two bytes, straddles the first chunk's end)."""
    script = "import sys; sys.stdout.write('a' + 'é' * 1_200_000 + '\\n' + 'end\\n')"
    server.cli("run", "--gpus", "0", "--", "python3", "-c", script, cwd=job_dir, check=True)
    assert server.wait_for(1)["state"] == "succeeded"
    out = server.cli("logs", "1", check=True).stdout
    assert out == "a" + "é" * 1_200_000 + "\n" + "end\n"  # 2.4 MB: three chunks, no replacement characters


def test_logs_follow_streams_until_the_job_ends(server: ServerProcess, job_dir: Path) -> None:
    server.cli(
        "run",
        "--gpus",
        "0",
        "--",
        "bash",
        "-c",
        "for i in 1 2 3; do echo line $i; sleep 0.4; done",
        cwd=job_dir,
        check=True,
    )
    started = time.monotonic()
    out = server.cli("logs", "1", "-f", check=True).stdout
    assert out.splitlines() == ["line 1", "line 2", "line 3"]
    assert time.monotonic() - started >= 0.5


def test_queue_commands(server: ServerProcess) -> None:
    server.cli("queue", "create", "nlp", "--gpu-quota", "4", "--gpu-limit", "8", check=True)
    server.cli("queue", "update", "nlp", "--gpu-weight", "2", "--ordering", "attained",
               "--min-runtime-preempt", "10m", check=True)  # fmt: skip
    queues = {q["name"]: q for q in json.loads(server.cli("queues", "--json", check=True).stdout)}
    assert queues["nlp"]["resources"]["gpu"] == {"quota": 4, "limit": 8, "over_quota_weight": 2}
    assert queues["nlp"]["ordering"] == "attained" and queues["nlp"]["min_runtime_preempt"] == 600
    bad = server.cli("queue", "update", "nlp", "--ordering", "random")
    assert bad.returncode == 1 and "ordering" in bad.stderr
    assert "nlp" in server.cli("queues", check=True).stdout


def test_queue_show_tells_one_queues_settings_and_use_and_queue_list_lists_them(
    server: ServerProcess, job_dir: Path
) -> None:
    server.cli("queue", "create", "nlp", "--gpu-quota", "4", "--gpu-limit", "8", "--description",
               "NLP team", "--min-runtime-reclaim", "30m", "--budget", "200/week", "--user-gpus", "2",
               check=True)  # fmt: skip
    server.cli("run", "--queue", "nlp", "--gpus", "2", "--", "sleep", "60", cwd=job_dir, check=True)
    server.wait_for(1, states=("running",))
    shown = server.cli("queue", "show", "nlp", check=True).stdout.splitlines()
    # the weight the last pass used follows its young work (scheduler.md): shown when it differs
    head = r"nlp  GPU quota 4  limit 8  weight 1( \(now [0-9.]+\))?  priority 0"
    assert re.fullmatch(head, shown[0]), shown
    assert "  description: NLP team" in shown
    assert any(line.startswith("  now: 2 GPUs allocated, fair share ") and
               line.endswith("1 running, 0 pending asking for 0 GPUs") for line in shown), shown  # fmt: skip
    assert "  minimum runtime: 30m before reclaim" in shown
    assert any(line.startswith("  budget: ") and "of 200 GPU-hours a week (" in line for line in shown), shown
    assert "  each user at most: 2 GPUs" in shown
    as_json = json.loads(server.cli("queue", "show", "nlp", "--json", check=True).stdout)
    assert as_json["name"] == "nlp" and as_json["gpus_allocated"] == 2
    listed = server.cli("queue", "list", check=True).stdout
    aliased = server.cli("queue", "ls", check=True).stdout
    # the same table (its figures may move between the two calls: the budget counts running work)
    assert [line.split()[:1] for line in listed.splitlines()] == [
        line.split()[:1] for line in aliased.splitlines()
    ]
    assert "nlp" in listed and "default" in listed
    missing = server.cli("queue", "show", "nope")
    assert missing.returncode == 1 and missing.stderr.strip() == (
        "error: no queue named 'nope'; list them with `gpupool queues`"
    )


def test_nodes_and_cordon_commands(server: ServerProcess) -> None:
    assert "H100" in server.cli("nodes", check=True).stdout
    assert "cordoned" in server.cli("node", "cordon", "node-1", check=True).stdout
    assert json.loads(server.cli("nodes", "--json", check=True).stdout)[0]["state"] == "cordoned"
    assert "ready" in server.cli("node", "uncordon", "node-1", check=True).stdout
    listed = server.cli("nodes", check=True).stdout
    for alias in ("list", "ls"):
        assert server.cli("node", alias, check=True).stdout == listed
    refused = server.cli("node", "drain", "node-1", "nosuch")  # all or none: node-1 is not drained
    assert refused.returncode == 1 and "no node named 'nosuch' (nodes: node-1); nothing was drained" in (
        refused.stderr
    ), refused.stderr
    assert json.loads(server.cli("nodes", "--json", check=True).stdout)[0]["state"] == "ready"
    server.cli("node", "drain", "node-1", check=True)  # nothing runs there: drained at once
    (drained,) = json.loads(server.cli("nodes", "--json", check=True).stdout)
    assert (drained["state"], drained["drained"]) == ("draining", True), drained
    assert "drained" in server.cli("nodes", check=True).stdout
    server.cli("node", "uncordon", "node-1", check=True)
    own = server.cli("node", "delete", "node-1")  # the head's own machine: it lists it while it runs
    assert own.returncode == 1 and "is the head's own machine (the local backend)" in own.stderr, own.stderr
    assert "--gpus none" in own.stderr, own.stderr


BAD_SPECS = [
    ("resources: {gpu: 'H100:x'}\ncommands: [echo]\n", "resources.gpu"),
    ("commands: [echo]\nmax_duration: forever\n", "max_duration"),
    ("comands: [true]\n", "comands"),
    ("commands: [echo]\n  bad indent: [\n", "line"),
    ("commands: [echo]\nqueue: ghost\n", "queue 'ghost' does not exist"),
]


@pytest.mark.parametrize("text,expected", BAD_SPECS)
def test_a_bad_spec_is_one_clear_line_and_a_nonzero_exit(
    server: ServerProcess, job_dir: Path, text: str, expected: str
) -> None:
    path = job_dir / "bad.yaml"
    path.write_text(text)
    result = server.cli("submit", str(path))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr
    assert json.loads(server.cli("ps", "--all", "--json", check=True).stdout) == []


def test_a_spec_the_head_refuses_is_one_line_naming_the_file_first(
    server: ServerProcess, job_dir: Path
) -> None:
    path = job_dir / "two.yaml"
    path.write_text("commands: [echo]\nresources: {gpu: two}\n")  # a model the head does not know
    result = server.cli("submit", str(path))
    assert result.returncode == 1 and result.stderr.startswith(
        f"error: {path}: resources.gpu: unknown GPU model 'TWO'"
    ), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_submit_options_override_the_specs_fields(server: ServerProcess, job_dir: Path) -> None:
    path = job_dir / "train.yaml"
    path.write_text("commands: [sleep 30]\npriority: inference\nmax_duration: 1h\n")
    server.cli("submit", str(path), "--priority", "train", "--max-duration", "2h", "--hold", check=True)
    assert (server.workload(1)["priority"], server.workload(1)["max_duration"]) == (50, 7200)
    server.cli("submit", str(path), "--priority", "70", "--hold", check=True)
    assert (server.workload(2)["priority"], server.workload(2)["max_duration"]) == (70, 3600)


def test_a_queue_is_deleted_only_once_nothing_uses_it(server: ServerProcess, job_dir: Path) -> None:
    server.cli("queue", "create", "research", check=True)
    server.cli("queue", "create", "vision", "--parent", "research", check=True)
    server.cli("queue", "create", "nlp", "--gpu-quota", "2", check=True)
    server.cli("run", "--queue", "nlp", "--gpus", "1", "--", "sleep", "30", cwd=job_dir, check=True)
    server.wait_for(1, states=("running",))
    refusals = [
        (("nlp",), "queue 'nlp' still has 1 running workload; cancel them or let them finish first"),
        (("research",), "queue 'research' is the parent of vision; delete those first"),
        (("default",), "the 'default' queue cannot be deleted"),
        (("nowhere",), "no queue named 'nowhere'"),
    ]
    for args, message in refusals:
        refused = server.cli("queue", "delete", *args)
        assert refused.returncode == 1 and message in refused.stderr, refused.stderr
    names = {q["name"] for q in json.loads(server.cli("queues", "--json", check=True).stdout)}
    assert names == {"default", "research", "vision", "nlp"}  # a refusal changes nothing
    narrow = subprocess.run(  # an 80-column terminal folds the table; it never cuts a queue's name
        [sys.executable, "-m", "gpupool.main", "queues"], env={**server.env, "COLUMNS": "80"},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert [line.split()[:2] for line in narrow.stdout.splitlines()[-4:]] == [
        ["default", "-"], ["nlp", "-"], ["research", "-"], ["vision", "research"],
    ]  # fmt: skip
    piped = subprocess.run(  # no terminal and no $COLUMNS (`gpupool queues | grep nlp`): whole lines
        [sys.executable, "-m", "gpupool.main", "queues"],
        env={k: v for k, v in server.env.items() if k != "COLUMNS"},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = piped.stdout.splitlines()
    assert lines[0].split()[:4] == ["NAME", "PARENT", "PRIO", "GPU"] and "WEIGHT (NOW)" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["default", "nlp", "research", "vision"]

    server.cli("cancel", "1", check=True)
    assert server.wait_for(1)["state"] == "cancelled"
    deleted = server.cli("queue", "delete", "nlp", check=True)
    assert "queue nlp deleted" in deleted.stdout
    assert "the GPU-hours used in nlp stay under that name" in deleted.stderr, deleted.stderr  # job 1 ran
    assert "warning" not in server.cli("queue", "delete", "vision", check=True).stderr  # nothing ran there
    server.cli("token", "create", "erin", "--queue", "research", check=True)
    gone = server.cli("queue", "delete", "research", check=True)
    assert "warning: token erin may submit to research, which is gone now" in gone.stderr, gone.stderr
    names = {q["name"] for q in json.loads(server.cli("queues", "--json", check=True).stdout)}
    assert names == {"default"}
    history = json.loads(server.cli("ps", "--all", "--json", check=True).stdout)
    assert [(w["id"], w["queue"], w["state"]) for w in history] == [(1, "nlp", "cancelled")]
    gone = server.cli("run", "--queue", "nlp", "--", "true", cwd=job_dir)
    assert gone.returncode == 1 and "queue 'nlp' does not exist" in gone.stderr


def test_cancel_takes_a_queues_work_or_only_its_pending_work(server: ServerProcess, job_dir: Path) -> None:
    """`cancel --queue Q [--state pending]`, as `scancel -p Q -t PENDING`; other queues' work stays."""
    server.cli("queue", "create", "nlp", "--gpu-limit", "1", check=True)
    for queue in ("nlp", "nlp", "default"):  # 1 runs, 2 waits at nlp's limit, 3 runs in default
        server.cli("run", "--queue", queue, "--gpus", "1", "--", "sleep", "60", cwd=job_dir, check=True)
    server.wait_for(1, states=("running",))
    server.wait_for(3, states=("running",))
    for args, message in [
        ((), "which workloads? give their ids"),
        (("3", "--queue", "nlp"), "give workload ids or --queue, not both"),
        (("--state", "pending"), "--state needs --queue"),
        (("--queue", "nlp", "--state", "succeeded"), "'succeeded' cannot be cancelled"),
        (("--queue", "nowhere"), "no queue named 'nowhere'"),
    ]:
        refused = server.cli("cancel", *args)
        assert refused.returncode == 1 and message in refused.stderr, (args, refused.stderr)
    out = server.cli("cancel", "--queue", "nlp", "--state", "pending", check=True).stdout
    assert out.strip() == "2 (job-2): cancelled"
    assert server.wait_for(1, states=("running",))["state"] == "running"
    assert "1 (job-1): stopping" in server.cli("cancel", "--queue", "nlp", check=True).stdout
    assert server.wait_for(1)["state"] == "cancelled"
    nothing = server.cli("cancel", "--queue", "nlp", check=True).stdout
    assert "queue nlp has no pending or running work to cancel" in nothing
    assert server.wait_for(3, states=("running",))["state"] == "running"  # default's work was not touched
    server.cli("cancel", "3", check=True)


def test_ps_says_when_it_shows_only_the_newest(server: ServerProcess, job_dir: Path) -> None:
    for _ in range(3):
        server.cli("run", "--gpus", "64", "--", "true", cwd=job_dir, check=True)  # never fits: stays pending
    cut = server.cli("ps", "--limit", "2", "--json", check=True)
    assert [row["id"] for row in json.loads(cut.stdout)] == [2, 3]
    assert "the newest 2 only; --limit shows more" in cut.stderr
    whole = server.cli("ps", "--limit", "3", check=True)
    assert "job-1" in whole.stdout and "newest" not in whole.stderr
    typo = server.cli("ps", "--queue", "defualt")  # listed nothing with exit 0, as a queue with no work does
    said = typo.stderr.strip()
    assert typo.returncode == 1 and said.startswith("error: --queue defualt: no such queue (queues: "), said
    assert "default" in said.split("(queues: ")[1], said
    assert server.cli("ps", "--queue", "default", check=True).returncode == 0


def test_ps_narrows_by_name_and_by_several_states(server: ServerProcess, job_dir: Path) -> None:
    server.cli("run", "--gpus", "0", "--name", "done", "--", "true", cwd=job_dir, check=True)
    server.wait_for(1)
    server.cli("run", "--gpus", "64", "--name", "big", "--", "true", cwd=job_dir, check=True)  # stays pending
    server.cli("run", "--gpus", "0", "--name", "big", "--", "false", cwd=job_dir, check=True)
    assert server.wait_for(3)["state"] == "failed"

    def listed(*args: str) -> list[int]:
        return [row["id"] for row in json.loads(server.cli("ps", *args, "--json", check=True).stdout)]

    assert listed("--state", "pending,failed") == [2, 3]
    assert listed("-t", "SUCCEEDED, pending") == [1, 2]  # squeue's -t, in any case
    assert listed("--all", "--name", "big") == [2, 3]
    assert listed("--name", "big") == [2]  # active only, unless --all or --state
    bad = server.cli("ps", "--state", "pending,runing")
    assert bad.returncode == 1 and "unknown state 'runing'" in bad.stderr, bad.stderr
    slurm = server.cli("ps", "-t", "PD")
    assert slurm.returncode == 1 and "unknown state 'pd' (Slurm's PD is pending)" in slurm.stderr, (
        slurm.stderr
    )


def test_cli_errors_are_one_line(server: ServerProcess, tmp_path: Path) -> None:
    for args, expected in [
        (("show", "42"), "no workload with id 42"),
        (("run", "--gpus", "lots", "--", "true"), "resources.gpu"),
        (("run", "--memroy", "8GB", "--", "true"), "'--memroy' is not an option of gpupool run"),
        (("run", "--cpus", "-2", "--", "true"), "resources.cpu"),
        (("run", "--nodes", "0", "--", "true"), "nodes: 0 must be at least 1"),
        (("submit", str(tmp_path / "missing.yaml")), "cannot read"),
        (("--token", "wrong", "ps"), "invalid token"),
        (("--server", "http://127.0.0.1:1", "ps"), "cannot reach the gpupool server"),
    ]:
        result = server.cli(*args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1, (
            args,
            result.stderr,
        )


def test_show_names_an_attempts_gpus_by_index_and_its_exit_code_once(
    server: ServerProcess, job_dir: Path
) -> None:
    """`show`'s attempt lines: "GPUs 0,1" (a bare "gpus=1" read as a count next to the header's gpus=2),
    no "exit=None" for a running attempt, and "exit code 3" said once; a gang's header says per node."""
    server.cli("run", "--gpus", "2", "--", "bash", "-c", "exit 3", cwd=job_dir, check=True)
    assert server.wait_for(1)["state"] == "failed"
    shown = server.cli("show", "1", check=True).stdout
    assert "attempt 0: failed on node-1 GPUs 0,1 pid=" in shown, shown
    attempt = next(line for line in shown.splitlines() if "attempt 0:" in line)
    assert attempt.count("exit code 3") == 1 and "exit=" not in shown, shown
    assert "started on node-1 GPUs 0,1 (scheduler)" in shown, shown
    server.cli("run", "--gpus", "1", "--", "sleep", "30", cwd=job_dir, check=True)
    server.wait_for(2, states=("running",))
    running = server.cli("show", "2", check=True).stdout
    assert "attempt 0: running on node-1 GPU 0 pid=" in running and "None" not in running, running
    server.cli("run", "-N", "2", "--gpus", "8", "--", "true", cwd=job_dir, check=True)  # never fits one node
    assert "gpus=8 nodes=2 (gpus per node)" in server.cli("show", "3", check=True).stdout
    assert " 2x8 " in server.cli("ps", check=True).stdout


def test_logs_of_work_that_has_not_started_says_so(server: ServerProcess, job_dir: Path) -> None:
    """Not an empty output and exit 0 that reads as "it printed nothing": a line on stderr says it has not
    run, and where to look; stdout stays the log's (empty)."""
    server.cli("run", "--gpus", "64", "--", "true", cwd=job_dir, check=True)  # never fits: stays pending
    pending = server.cli("logs", "1", check=True)
    assert pending.stdout == "" and "workload 1 is pending: no output yet (gpupool why 1" in pending.stderr
    server.cli("cancel", "1", check=True)
    cancelled = server.cli("logs", "1", check=True)
    assert cancelled.stdout == "" and "workload 1 cancelled before it started" in cancelled.stderr


def test_top_into_a_pipe_prints_a_frame_each_interval(server: ServerProcess) -> None:
    """Rich's live view writes nothing to a pipe until it ends (and nothing at all when killed, as
    `timeout 5 gpupool top | tee` does): to a pipe, `top` prints one frame after another, as top -b."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.main", "top", "--interval", "0.3"],
        env=server.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    frames = 0
    bound = threading.Timer(30.0, proc.kill)  # a bound on a loaded machine, not a timing assertion
    bound.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # ends when the process does
            frames += "gpupool top" in line
            if frames >= 2:
                break
    finally:
        bound.cancel()
        proc.kill()
        proc.communicate(timeout=10)
    assert frames >= 2, frames


def test_a_command_that_does_not_exist_is_reported_on_its_own_line(
    server: ServerProcess, job_dir: Path
) -> None:
    """bash numbers the lines as the spec does: the first command is line 1 (the trap and `set -e` that
    gpupool puts before it are on that line too)."""
    spec = {"commands": ["echo first", "no-such-command-xyz"], "workdir": str(job_dir)}
    wid = server.submit(spec)["id"]
    assert server.wait_for(wid)["state"] == "failed"
    log = server.cli("logs", str(wid), check=True)
    assert log.stdout.splitlines() == ["first", "bash: line 2: no-such-command-xyz: command not found"], log


def test_quotas_that_promise_more_than_the_pool_or_the_parent_are_taken_with_a_warning(
    server: ServerProcess,
) -> None:
    """8 simulated GPUs: quotas of 4 and 6 are accepted (a pool may grow), and the head says that they are
    no guarantee now; under a parent, the same for quotas that pass the parent's."""
    quiet = server.cli("queue", "create", "nlp", "--gpu-quota", "4", check=True)
    assert "warning" not in quiet.stderr
    over = server.cli("queue", "create", "cv", "--gpu-quota", "6", check=True)
    assert over.stdout == "queue cv created\n"
    assert "warning: the GPU quotas of top-level queues add up to 10, but the pool has 8" in over.stderr
    fixed = server.cli("queue", "update", "cv", "--gpu-quota", "4", check=True)
    assert "warning" not in fixed.stderr
    server.cli("queue", "update", "cv", "--gpu-quota", "0", check=True)
    server.cli("queue", "create", "a", "--parent", "nlp", "--gpu-quota", "3", check=True)
    child = server.cli("queue", "create", "b", "--parent", "nlp", "--gpu-quota", "3", check=True)
    assert "the queues under nlp add up to 6, but parent queue nlp's quota is 4" in child.stderr
    with server.http() as client:
        answer = client.patch("/api/v1/queues/b", json={"resources": {"gpu": {"quota": 1}}})
        assert answer.status_code == 200 and answer.json()["warnings"] == [], answer.text
    lowered = server.cli(
        "queue", "update", "nlp", "--gpu-quota", "2", check=True
    )  # the parent, below its own
    assert "the queues under nlp add up to 4, but parent queue nlp's quota is 2" in lowered.stderr
    # a quota lowered below the queue's running non-preemptible work: nothing can take those GPUs back
    kept = server.submit(
        {"queue": "cv", "resources": {"gpu": 2}, "commands": ["sleep 600"], "priority": "build"}
    )  # priority build, above train: non-preemptible
    server.cli("queue", "update", "cv", "--gpu-quota", "2", check=True)
    server.wait_for(kept["id"], states=("running",))
    below = server.cli("queue", "update", "cv", "--gpu-quota", "1", check=True)
    assert (
        "warning: queue cv runs 2 GPUs of non-preemptible work, more than its GPU quota of 1: no queue can "
        "reclaim the 1 beyond it until that work ends"
    ) in below.stderr, below.stderr
    server.cli("cancel", str(kept["id"]), check=True)
    # the system queue is gpupool's own: not changed by hand, nor a token's queue
    for args in (
        ("queue", "update", "gpupool-system", "--gpu-quota", "100"),
        ("queue", "delete", "gpupool-system"),
        ("token", "create", "sysq", "--queue", "gpupool-system"),
    ):
        refused = server.cli(*args)
        assert refused.returncode != 0 and "gpupool's own" in refused.stderr, (args, refused.stderr)


def test_a_parent_queue_shows_what_the_queues_under_it_hold(server: ServerProcess, job_dir: Path) -> None:
    """A department's own figures stay its own (a sum over queues counts nothing twice); what its queues
    hold is beside them."""
    server.cli("queue", "create", "dept", "--gpu-quota", "4", check=True)
    server.cli("queue", "create", "c1", "--parent", "dept", "--gpu-quota", "2", check=True)
    server.cli("run", "--queue", "c1", "--gpus", "2", "--", "sleep", "60", cwd=job_dir, check=True)
    server.wait_for(1, states=("running",))
    dept = json.loads(server.cli("queue", "show", "dept", "--json", check=True).stdout)
    assert (dept["gpus_allocated"], dept["gpus_allocated_below"], dept["running_below"]) == (0.0, 2.0, 1)
    assert "the queues under it: 2 GPUs allocated, 1 running" in server.cli("queue", "show", "dept").stdout
    table = server.cli("queues", check=True).stdout
    assert "0 (+2 below)" in table and "(+1 below)" in table, table
    server.cli("cancel", "1", check=True)


def test_queue_create_from_a_file_and_clearing_a_parent_or_a_limit(
    server: ServerProcess, tmp_path: Path
) -> None:
    """`queue create -f nlp.yaml` (as docs/specs.md shows it) takes the name from the file; two names that
    differ are refused; a file's error names the file; `--parent none` and `--gpu-limit none` clear them."""
    server.cli("queue", "create", "research", check=True)
    spec = tmp_path / "nlp.yaml"
    spec.write_text("name: nlp\nparent: research\nresources: {gpu: {quota: 2, limit: 4}}\n")
    assert "queue nlp created" in server.cli("queue", "create", "-f", str(spec), check=True).stdout
    clash = server.cli("queue", "create", "other", "-f", str(spec))
    assert clash.returncode == 1 and "names the queue 'nlp' and the command 'other'" in clash.stderr, (
        clash.stderr
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: cv\nbudget: {gpu_hours: 5, extra: 1}\n")
    refused = server.cli("queue", "create", "-f", str(bad))
    assert refused.returncode == 1 and f"error: {bad}: budget.extra" in refused.stderr, refused.stderr
    server.cli("queue", "update", "nlp", "--parent", "none", "--gpu-limit", "none", check=True)
    nlp = json.loads(server.cli("queue", "show", "nlp", "--json", check=True).stdout)
    assert nlp["parent"] is None and nlp["resources"]["gpu"].get("limit") is None, nlp
    wrong = server.cli("queue", "update", "nlp", "--gpu-limit", "lots")
    assert wrong.returncode == 1 and "--gpu-limit lots: a number of GPUs" in wrong.stderr, wrong.stderr
