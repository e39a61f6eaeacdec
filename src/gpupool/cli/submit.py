"""`gpupool submit` (a YAML spec) and `gpupool run` (one command): new work, with the options they share."""

from __future__ import annotations

import os
import re
import shlex
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import typer

from gpupool import spec  # its pydantic models load on first use (see gpupool.spec): not for `ps`, `logs`
from gpupool.cli import refs
from gpupool.cli.app import app, client
from gpupool.cli.errors import CliError
from gpupool.cli.render import JSON_HELP, console, print_json, print_warnings, styled

# The options `run` and `submit` share (one definition each; Typer reads them per command).
ARRAY_OPTION = typer.Option(
    None,
    "--array",
    "-a",
    help="a job array: one task per index, e.g. 0-15, 1,3,5-9 or 0-99:10, with %N for at most N at once "
    "(Slurm's --array); each task sees $GPUPOOL_ARRAY_INDEX",
)
AFTER_OPTION = typer.Option(
    [],
    "--after",
    help="start only after workload ID (or NAME, as the other commands take it) succeeded; WHEN:ID for "
    "failed, ended or started (repeatable; Slurm's --dependency)",
)
PARSABLE_OPTION = typer.Option(
    False, "--parsable", help="print only the new workload's id (Slurm's sbatch --parsable)"
)
HOLD_OPTION = typer.Option(
    False, "--hold", help="submit it held: it waits until `gpupool release` (Slurm's sbatch --hold)"
)
WAIT_OPTION = typer.Option(
    False,
    "--wait",
    help="wait until it ends, printing its output, and exit with its exit code (Slurm's sbatch --wait; "
    "Ctrl-C stops waiting, not the job)",
)
TIMEOUT_OPTION = typer.Option(
    None, "--timeout", help="with --wait: stop waiting after this long, e.g. 2h (exit 124; the job goes on)"
)


@app.command()
def submit(
    file: Path = typer.Argument(..., help="a workload spec (YAML), see docs/specs.md"),
    queue: str | None = typer.Option(None, "--queue", "-q", help="override the spec's queue"),
    name: str | None = typer.Option(None, "--name", "-n", help="override the spec's name"),
    array: str | None = ARRAY_OPTION,
    after: list[str] = AFTER_OPTION,
    hold: bool = HOLD_OPTION,
    wait_end: bool = WAIT_OPTION,
    timeout: str | None = TIMEOUT_OPTION,
    parsable: bool = PARSABLE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="print the created workload as JSON"),
) -> None:
    """Submit a job or service from a YAML spec. Commands run in the spec's folder unless it sets workdir."""
    try:
        text = file.read_text()
    except OSError as exc:
        raise CliError(f"cannot read {file}: {exc.strerror}") from exc
    # Parsed here with the spec's own YAML rules (`on:` stays a key), so a bad spec fails before any request;
    # its error names the file first, as a compiler's does.
    try:
        parsed = spec.parse_workload_spec(text)
    except spec.SpecError as exc:
        raise CliError(f"{file}: {exc}") from exc
    data = parsed.model_dump(mode="json")
    if "queue" not in parsed.model_fields_set:
        del data["queue"]  # the server's choice, as `run` without --queue
    if queue:
        data["queue"] = queue
    if name:
        data["name"] = name
    _add_array_and_after(data, array, after)
    folder = file.resolve().parent
    data["workdir"] = str(folder / data["workdir"]) if data.get("workdir") else str(folder)
    spec.parse_workload_spec(data)
    _submit_and_wait(data, hold, wait_end, timeout, as_json, parsable)


def _submit_and_wait(
    data: dict[str, Any], hold: bool, wait_end: bool, timeout: str | None, as_json: bool, parsable: bool
) -> None:
    """Submit `data`; with `wait_end`, wait for it to end (cli/wait.py), its output printed as it comes."""
    if not wait_end:
        if timeout is not None:
            raise CliError("--timeout goes with --wait: e.g. --wait --timeout 2h")
        _created(client().submit(data, hold=hold), as_json, parsable)
        return
    from gpupool.cli import wait  # registers `gpupool wait`; imported at the end of cli/app.py

    wait.refuse_service(str(data.get("kind") or "job"))
    if hold:
        raise CliError(
            "--wait with --hold: held work waits until `gpupool release`, so the wait would not end; drop "
            "--wait (and run `gpupool wait ID` after the release) or drop --hold"
        )
    wait.check_timeout(timeout)
    c = client()
    created = c.submit(data, hold=hold)
    with redirect_stdout(sys.stderr):  # stdout is the work's output
        _created(created, as_json, parsable)
    tasks = created.get("array_ids")  # an array's tasks: a line each, not their output
    wait.finish(c, tasks or [created["id"]], logs=tasks is None, timeout=timeout, quiet=False)


# As `docker run`: run's options come first; from the command's first word on, every word is the command's.
RUN_PARSING = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}


@app.command(context_settings=RUN_PARSING)
def run(
    command: list[str] = typer.Argument(..., help="the command, after --"),
    gpus: str = typer.Option(
        "1", "--gpus", "-g", help="GPUs per node: 2, H100:8, 'A100|H100:2', 80GB:1, 0.5"
    ),
    queue: str | None = typer.Option(
        None, "--queue", "-q", help="default: the token's queue when it is for one queue, else 'default'"
    ),
    name: str | None = typer.Option(
        None, "--name", "-n", help="a name for show, logs, --after; default: the server names it"
    ),
    priority: str | None = typer.Option(
        None, "--priority", help="inference|build|interactive|train or 0..1000"
    ),
    preemptible: bool | None = typer.Option(
        None,
        "--preemptible/--no-preemptible",
        help="whether other work may preempt it (default: yes up to priority train, 50; no above). "
        "Non-preemptible work runs only within its queue's GPU quota",
    ),
    max_duration: str | None = typer.Option(None, "--max-duration", help="e.g. 90s, 30m, 12h"),
    checkpoint_dir: str | None = typer.Option(
        None, "--checkpoint-dir", help="where it saves to resume after preemption ($GPUPOOL_CHECKPOINT_DIR)"
    ),
    node: list[str] = typer.Option(
        [], "--node", help="only on this node (repeat for several; like Slurm's --nodelist)"
    ),
    nodes: int = typer.Option(
        1, "--nodes", "-N", help="nodes in the gang, placed all or nothing (Slurm's -N)"
    ),
    cpus: str | None = typer.Option(None, "--cpus", "-c", help="CPU cores per node, e.g. 8 (Slurm's -c)"),
    memory: str | None = typer.Option(None, "--memory", help="memory per node, e.g. 64GB (Slurm's --mem)"),
    env: list[str] = typer.Option(
        [],
        "--env",
        "-e",
        help="KEY=VALUE for the job's environment, or KEY for this shell's value (repeatable)",
    ),
    service: bool = typer.Option(
        False, "--service", help="run it as a service: started again whenever it exits, until cancelled"
    ),
    readiness_probe: str | None = typer.Option(
        None,
        "--readiness-probe",
        help="with --service: a path, e.g. /health, that must answer 2xx or 3xx before the head's proxy "
        "passes requests on",
    ),
    notify: str | None = typer.Option(
        None,
        "--notify",
        help="POST a JSON message to this URL when it ends (spec notify; a chat webhook, a pipeline)",
    ),
    access: str | None = typer.Option(
        None,
        "--access",
        help="with --service: who may reach it through the head: private (you and admins; the default), "
        "pool (any token of this head) or public (anyone, no token)",
    ),
    replicas: str | None = typer.Option(
        None,
        "--replicas",
        help="with --service: copies run at once, each on its own GPUs (1..64); a range such as 1..4 with "
        "--scale lets the head add and remove replicas by load",
    ),
    scale: str | None = typer.Option(
        None,
        "--scale",
        help="with --replicas MIN..MAX: what each replica should carry, rps:N (requests per second) or "
        "concurrency:N (requests in flight)",
    ),
    idle: str | None = typer.Option(
        None,
        "--idle",
        help="stop it once its GPUs have been idle this long, e.g. 2h (held until `gpupool release`); "
        "2h:cancel ends it instead",
    ),
    array: str | None = ARRAY_OPTION,
    after: list[str] = AFTER_OPTION,
    hold: bool = HOLD_OPTION,
    wait_end: bool = WAIT_OPTION,
    timeout: str | None = TIMEOUT_OPTION,
    parsable: bool = PARSABLE_OPTION,
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Run one command as a job in the current directory: gpupool run --gpus 2 -- python train.py"""
    _no_stray_option(command)
    resources: dict[str, Any] = {"gpu": gpus}
    if cpus is not None:
        resources["cpu"] = cpus
    if memory is not None:
        if re.fullmatch(r"\s*[0-9.]+\s*", memory):  # "--memory 5 GB" too: the unit became the command
            raise CliError(
                f"--memory {memory.strip()}: give a unit, e.g. --memory {memory.strip()}GB (a bare number "
                "would be bytes; Slurm's --mem counts megabytes)"
            )
        resources["memory"] = memory
    data: dict[str, Any] = {
        "kind": "service" if service else "job",
        "resources": resources,
        "commands": [shlex.join(command)],
        "workdir": os.getcwd(),
    }
    if queue is not None:
        data["queue"] = queue  # none: the server's choice (the token's only queue, else default)
    if nodes != 1:
        data["nodes"] = nodes
    if name:
        data["name"] = name
    if priority:
        data["priority"] = int(priority) if priority.isdigit() else priority
    if preemptible is not None:
        data["preemptible"] = preemptible
    if max_duration:
        data["max_duration"] = max_duration
    if checkpoint_dir:
        data["checkpoint"] = {"dir": checkpoint_dir}
    if node:
        data["placement"] = {"nodes": node}
    if env:
        data["env"] = _env_pairs(env)
    if readiness_probe is not None:
        data["readiness_probe"] = readiness_probe
    if access is not None:
        data["access"] = access
    if notify is not None:
        data["notify"] = notify
    if replicas is not None:
        data["replicas"] = int(replicas) if replicas.strip().isdigit() else replicas
    if scale is not None:
        data["scaling"] = _scaling(scale)
    if idle is not None:
        idle_for, _, action = idle.partition(":")
        data["idle"] = {"timeout": idle_for, "action": action} if action else idle_for
    _add_array_and_after(data, array, after)
    spec.parse_workload_spec(data)
    _submit_and_wait(data, hold, wait_end, timeout, as_json, parsable)


def _add_array_and_after(data: dict[str, Any], array: str | None, after: list[str]) -> None:
    """`--array` and `--after` into a spec (the spec checks the values); `--after` adds to its own list."""
    if array is not None:
        data["array"] = array
    if after:
        data["after"] = [*data.get("after", []), *map(_dependency, after)]


def _dependency(text: str) -> str:
    """An `--after` value with the workload it names by name given by id: `ended:prep` -> `ended:12` (the
    one pending or running workload named prep, else the newest finished one, as `gpupool show prep` reads
    it). Ids, and whatever the spec will refuse, pass as they are."""
    from gpupool.spec.workload import DEPENDENCY_CONDITIONS  # pydantic: loaded by the commands that submit

    when, _, ref = text.rpartition(":")
    ref = ref.strip()
    if not ref or ref.isdigit() or (when and when.strip() not in DEPENDENCY_CONDITIONS):
        return text
    ((found, first_task),) = refs.workload_refs(client(), [ref], reading=True)
    if first_task:
        raise CliError(
            f"--after {text}: the first task of a job array has the array's id, which --after takes as "
            f"every task; wait for the whole array (--after {found}) or for another task"
        )
    return f"{when}:{found}" if when else str(found)


def _scaling(text: str) -> dict[str, Any]:
    """`--scale rps:10` or `--scale concurrency:4` as the spec's `scaling` (the spec checks the values)."""
    metric, sep, target = text.partition(":")
    if not sep or not metric.strip() or not target.strip():
        raise CliError(f"--scale {text}: give METRIC:TARGET, e.g. --scale rps:10 or --scale concurrency:4")
    try:
        number: float | str = float(target)
    except ValueError:
        number = target  # the spec's error names it
    return {"metric": metric.strip(), "target": number}


def _env_pairs(items: list[str]) -> dict[str, str]:
    """`--env KEY=VALUE`, or `--env KEY` for the value this shell has (as `docker run -e KEY`)."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            if key not in os.environ:
                raise CliError(f"--env {key}: {key} is not set in this shell; give --env {key}=VALUE")
            value = os.environ[key]
        pairs[key] = value
    return pairs


# sbatch/srun options a Slurm user reaches for, and what `gpupool run` calls them (its own -N, -c, -n,
# --nodes and --gpus are taken by typer before a command is seen).
SLURM_OPTIONS: dict[str, str] = {
    "--time": "--max-duration 2h (Slurm's --time=2:00:00)",
    "-t": "--max-duration 2h (Slurm's --time=2:00:00)",
    "--partition": "--queue NAME (a queue, with its quota, is what a partition is here)",
    "-p": "--queue NAME (a queue, with its quota, is what a partition is here)",
    "--gres": "--gpus H100:8 (per node)",
    "--gpus-per-node": "--gpus 8",
    "--mem": "--memory 64GB (per node)",
    "--cpus-per-task": "--cpus 8 (per node)",
    "--job-name": "--name NAME",
    "-J": "--name NAME",
    "--nodelist": "--node NAME (repeat it for several)",
    "-w": "--node NAME (repeat it for several)",
    "--dependency": "--after ID (starts once workload ID succeeded)",
    "-d": "--after ID (starts once workload ID succeeded)",
    "--export": "--env KEY=VALUE (repeat it)",
    "--qos": "--priority inference|build|interactive|train",
}


def _no_stray_option(command: list[str]) -> None:
    """A command never starts with an option: one there is an option `run` does not have (a typo, or one
    meant for the command but put before `--`). Taken as the command, it would fail as a job. Slurm's
    names for options `run` has under another name get that name in the error."""
    if command and command[0].startswith("-"):
        option = command[0].split("=", 1)[0]
        if not option.startswith("--"):
            option = option[:2]  # -t60, -pgpu
        ours = SLURM_OPTIONS.get(option)
        if ours is not None:
            raise CliError(f"{option!r} is not an option of gpupool run: use {ours}")
        raise CliError(
            f"{command[0]!r} is not an option of gpupool run (see gpupool run --help); the command goes "
            "after --, e.g. gpupool run --gpus 2 -- python train.py"
        )


def _created(workload: dict[str, Any], as_json: bool, parsable: bool) -> None:
    print_warnings(workload)  # on stderr: stdout stays the id (--parsable) or the JSON
    if as_json:
        print_json(workload)
        return
    if parsable:
        print(workload["id"])
        return
    replicas = workload.get("replica_ids") or []
    also = f" with {len(replicas)} replicas ({', '.join(map(str, replicas))})" if len(replicas) > 1 else ""
    tasks = workload.get("array_ids")
    if tasks:
        also = f" as array {workload['id']} of {len(tasks)} tasks ({tasks[0]}..{tasks[-1]})"
    console.print(
        f"submitted [bold]{workload['id']}[/bold] ({workload['name']}) to queue {workload['queue']}{also}: "
        f"{styled(workload['state'])}"
        + (f", held until `gpupool release {workload['id']}`" if workload.get("held") else "")
    )
