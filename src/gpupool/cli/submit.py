"""`gpupool submit` (a YAML spec) and `gpupool run` (one command): new work, with the options they share."""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Collection, Mapping
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, ClassVar, Final

import typer
from typer.core import TyperCommand

from gpupool import spec  # its pydantic models load on first use (see gpupool.spec): not for `ps`, `logs`
from gpupool.cli import refs
from gpupool.cli.app import app, client
from gpupool.cli.errors import CliError, click_class
from gpupool.cli.render import JSON_HELP, console, print_json, print_warnings, styled
from gpupool.client import ApiError, Client

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
    "failed, ended or started (repeatable; Slurm's --dependency, whose afterok:, afternotok:, afterany: "
    "and after: it takes too)",
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


# sbatch/srun options a Slurm user reaches for, and what `gpupool run` calls them (its own -N, -c, -n,
# --nodes and --gpus are taken by typer before a command is seen). `--dependency` is answered by its value
# (`_after_hint`).
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
    "--dependency": "--after ID",
    "-d": "--after ID",
    "--export": "--env KEY=VALUE (repeat it)",
    "--qos": "--priority inference|build|interactive|train",
}
# Options of `run` (their Slurm names above lead to them) that `submit` reads from the spec instead.
SPEC_FIELDS: Final = {
    "--gpus": "resources.gpu",
    "-g": "resources.gpu",
    "--memory": "resources.memory",
    "--cpus": "resources.cpu",
    "-c": "resources.cpu",
    "--nodes": "nodes",
    "-N": "nodes",
    "--node": "placement.nodes",
    "--env": "env",
    "-e": "env",
}


def slurm_hint(words: list[str], takes: Collection[str] | None, spec_fields: Mapping[str, str]) -> str | None:
    """What to use instead of the option `words` begin with (["--time", "1h"], ["--dependency=afterany:12"],
    ["-t60"]) when it is Slurm's name for an option the command takes (`takes`; None: all of run's), or
    one of run's that `spec_fields` says is set in the spec: "use --max-duration 2h ..."; else None."""
    option = words[0].split("=", 1)[0]
    if not option.startswith("--"):
        option = option[:2]  # -t60, -pgpu
    if option in ("--dependency", "-d"):
        hint: str | None = _after_hint(_option_value(words, option))
    else:
        hint = SLURM_OPTIONS.get(option)
    ours = option if hint is None else hint.split()[0]
    if hint is not None and (takes is None or ours in takes):
        return f"use {hint}"
    if ours in spec_fields:
        return f"set {spec_fields[ours]} in the spec (docs/specs.md)"
    return None


def _option_value(words: list[str], option: str) -> str | None:
    """The value `words` give `option` (their first): --dependency=X, -dX, or the next word."""
    first = words[0]
    if first.startswith(f"{option}="):
        return first[len(option) + 1 :]
    if first == option:
        return words[1] if len(words) > 1 else None
    return None if option.startswith("--") else first[len(option) :]


def _after_hint(value: str | None) -> str:
    """`--after` for Slurm's `--dependency=VALUE`: afterany:12 -> "--after ended:12"; for a VALUE that
    `--after` cannot say (singleton, +time, ?), what each condition is."""
    from gpupool.spec.sections import SLURM_DEPENDENCIES  # pydantic: loaded by the commands that submit

    wanted: list[str] = []
    for item in (value or "").split(","):
        kind, _, ids = item.strip().partition(":")
        when = SLURM_DEPENDENCIES.get(kind.lower())
        numbers = ids.split(":")
        if when is None or not all(re.fullmatch(r"[0-9]+", n) for n in numbers):
            return (
                "--after ID (once it succeeded: Slurm's afterok), --after ended:ID (afterany), "
                "--after failed:ID (afternotok) or --after started:ID (after)"
            )
        wanted += [n if when == "succeeded" else f"{when}:{n}" for n in numbers]
    return " ".join(f"--after {w}" for w in wanted)


# Click's usage error (exit 2, "error: ... (`gpupool submit --help`)" in main.py).
_USAGE_ERROR: Final[type[Exception]] = click_class("UsageError")


class SlurmNames(TyperCommand):
    """A command that answers an option it lacks, where that is Slurm's name for one it has, with the one
    it has ("'--time' is not an option of gpupool update: use --max-duration 2h ..."), as `run` does."""

    spec_fields: ClassVar[Mapping[str, str]] = {}  # run's options this command reads from a spec instead

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given = list(args)  # Click's parser takes the words off `args` as it reads them
        try:
            return super().parse_args(ctx, args)
        except _USAGE_ERROR as exc:
            option = getattr(exc, "option_name", None)
            if type(exc).__name__ != "NoSuchOption" or not isinstance(option, str):
                raise
            at = next((i for i, word in enumerate(given) if _gives(word, option)), None)
            takes = {opt for param in self.params for opt in (*param.opts, *param.secondary_opts)}
            hint = None if at is None else slurm_hint(given[at:], takes, self.spec_fields)
            if hint is None:
                raise
            raise _USAGE_ERROR(f"{option!r} is not an option of {ctx.command_path}: {hint}", ctx) from None


def _gives(word: str, option: str) -> bool:
    """Whether the word `word` is (or begins with) the option `option`: --time, --time=2h, -t60."""
    return word.split("=", 1)[0] == option if option.startswith("--") else word.startswith(option)


class SpecSlurmNames(SlurmNames):
    """`submit`: run's options it lacks are fields of the spec."""

    spec_fields = SPEC_FIELDS


@app.command(cls=SpecSlurmNames)
def submit(
    file: Path = typer.Argument(..., help="a workload spec (YAML), see docs/specs.md"),
    queue: str | None = typer.Option(None, "--queue", "-q", help="override the spec's queue"),
    name: str | None = typer.Option(None, "--name", "-n", help="override the spec's name"),
    priority: str | None = typer.Option(
        None, "--priority", help="override the spec's priority: inference|build|interactive|train or 0..1000"
    ),
    max_duration: str | None = typer.Option(
        None, "--max-duration", help="override the spec's max_duration, e.g. 2h (Slurm's --time)"
    ),
    array: str | None = ARRAY_OPTION,
    after: list[str] = AFTER_OPTION,
    hold: bool = HOLD_OPTION,
    wait_end: bool = WAIT_OPTION,
    timeout: str | None = TIMEOUT_OPTION,
    parsable: bool = PARSABLE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="print the created workload as JSON"),
) -> None:
    """Submit a job or service from a YAML spec. Commands run in the spec's folder unless it sets workdir.

    Options given here override the spec's fields, as sbatch's override #SBATCH lines."""
    _refuse_number_name(name, gang="nodes: N in the spec")
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
    if priority is not None:
        data["priority"] = _priority(priority)
        data.pop("priority_class", None)  # the spec's, or the one it was given by default: --priority's now
    if max_duration is not None:
        data["max_duration"] = max_duration
    _add_array_and_after(data, array, after)
    folder = file.resolve().parent
    data["workdir"] = str(folder / data["workdir"]) if data.get("workdir") else str(folder)
    spec.parse_workload_spec(data)
    _submit_and_wait(data, hold, wait_end, timeout, as_json, parsable, source=file)


def _submit_and_wait(
    data: dict[str, Any],
    hold: bool,
    wait_end: bool,
    timeout: str | None,
    as_json: bool,
    parsable: bool,
    source: Path | None = None,
) -> None:
    """Submit `data` (read from the file `source`, if any); with `wait_end`, wait for it to end
    (cli/wait.py), its output printed as it comes."""
    if not wait_end:
        if timeout is not None:
            raise CliError("--timeout goes with --wait: e.g. --wait --timeout 2h")
        _created(_submitted(client(), data, hold, source), as_json, parsable)
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
    created = _submitted(c, data, hold, source)
    with redirect_stdout(sys.stderr):  # stdout is the work's output
        _created(created, as_json, parsable)
    tasks = created.get("array_ids")  # an array's tasks: a line each, not their output
    wait.finish(c, tasks or [created["id"]], logs=tasks is None, timeout=timeout, quiet=False)


def _submitted(c: Client, data: dict[str, Any], hold: bool, source: Path | None) -> dict[str, Any]:
    """The workload the head made of `data`. The head's refusal of a spec read from a file (422: a GPU
    model this pool lacks, a queue that does not exist) names the file first, as a local parse error does."""
    try:
        return c.submit(data, hold=hold)
    except ApiError as exc:
        if source is None or exc.status != 422:
            raise
        raise CliError(f"{source}: {exc.message}") from exc


def _refuse_number_name(name: str | None, gang: str) -> None:
    """A --name of digits alone: every command would read it as a workload id. Most likely Slurm's -n
    (ntasks), which here is --name; `gang` says how to ask for several nodes instead."""
    if name is not None and re.fullmatch(r"\s*[0-9]+\s*", name):
        raise CliError(
            f"--name {name.strip()}: a name of digits alone would be read as a workload id. Slurm's -n is "
            f"--ntasks; here -n is --name (a gang of N nodes is {gang})"
        )


def _priority(text: str) -> int | str:
    """--priority as the spec takes it: a number, or a class name (the spec checks either)."""
    return int(text) if text.strip().isdigit() else text


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
    _refuse_number_name(name, gang="-N N")
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
        data["priority"] = _priority(priority)
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
        data["after"] = [*data.get("after", []), *(d for text in after for d in _dependencies(text))]


def _dependencies(text: str) -> list[str]:
    """An `--after` value as the spec's entries: Slurm's TYPE:ID[:ID...] (afterok:12:13) by its condition
    (succeeded:12, succeeded:13); any other as `_dependency` gives it."""
    from gpupool.spec.sections import SLURM_DEPENDENCIES  # pydantic: loaded by the commands that submit

    kind, sep, refs_given = text.partition(":")
    when = SLURM_DEPENDENCIES.get(kind.strip().lower()) if sep else None
    if when is None:
        return [_dependency(text)]
    return [_dependency(f"{when}:{ref}") for ref in refs_given.split(":")]


def _dependency(text: str) -> str:
    """An `--after` value with the workload it names by name given by id: `ended:prep` -> `ended:12` (the
    one pending or running workload named prep, else the newest finished one, as `gpupool show prep` reads
    it). Ids, and whatever the spec will refuse, pass as they are."""
    from gpupool.spec.sections import DEPENDENCY_CONDITIONS  # pydantic: loaded by the commands that submit

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


def _no_stray_option(command: list[str]) -> None:
    """A command never starts with an option: one there is an option `run` does not have (a typo, or one
    meant for the command but put before `--`). Taken as the command, it would fail as a job. Slurm's
    names for options `run` has under another name get that name in the error."""
    if command and command[0].startswith("-"):
        option = command[0].split("=", 1)[0]
        if not option.startswith("--"):
            option = option[:2]  # -t60, -pgpu
        hint = slurm_hint(command, None, {})
        if hint is not None:
            raise CliError(f"{option!r} is not an option of gpupool run: {hint}")
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
