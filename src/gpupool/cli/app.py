"""The `gpupool` command line: every command talks to the server through the SDK in gpupool.client."""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
import webbrowser
from collections.abc import Callable, Mapping
from contextlib import redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import typer
from rich.markup import escape

from gpupool import spec  # its pydantic models load on first use (see gpupool.spec): not for `ps`, `logs`
from gpupool.cli import refs
from gpupool.cli.bench import bench_app
from gpupool.cli.errors import CliError
from gpupool.cli.render import (
    console,
    efficiency_line,
    err_console,
    folding_table,
    foreign_table,
    human_bytes,
    print_json,
    ps_rows,
    ps_table,
    queues_table,
    styled,
    usage_table,
    write_usage_csv,
)
from gpupool.cli.sim import sim_app
from gpupool.client import ApiError, Client, ConnectionFailed
from gpupool.client.client import RIDE_OUT, Outage
from gpupool.spec import format_duration, format_gpu_indices

app = typer.Typer(
    name="gpupool",
    help="gpupool: one shared, fairly scheduled GPU pool for AI work.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
node_app = typer.Typer(help="Take nodes in and out of service.", no_args_is_help=True)
queue_app = typer.Typer(help="Create, change and delete queues (teams, projects).", no_args_is_help=True)
app.add_typer(node_app, name="node")
app.add_typer(queue_app, name="queue")
app.add_typer(bench_app, name="bench")
app.add_typer(sim_app, name="sim")


class Options:
    server: str | None = None
    token: str | None = None


_options = Options()


@app.callback()
def _global(
    server: str | None = typer.Option(
        None,
        "--server",
        help="server URL (default $GPUPOOL_SERVER, then the credentials file, then http://127.0.0.1:8470)",
    ),
    token: str | None = typer.Option(
        None, "--token", help="API token (default $GPUPOOL_TOKEN, then the credentials file)"
    ),
) -> None:
    _options.server, _options.token = server, token


def client() -> Client:
    return Client(_options.server, _options.token)


# -- workloads ---------------------------------------------------------------------------------------------


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
    help="start only after workload ID succeeded; WHEN:ID for failed, ended or started (repeatable; "
    "Slurm's --dependency)",
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
    from gpupool.cli import wait  # registers `gpupool wait`; imported at the end of this module

    wait.refuse_service(str(data.get("kind") or "job"))
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
    name: str | None = typer.Option(None, "--name", "-n"),
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
    checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir"),
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
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Run one command as a job in the current directory: gpupool run --gpus 2 -- python train.py"""
    _no_stray_option(command)
    resources: dict[str, Any] = {"gpu": gpus}
    if cpus is not None:
        resources["cpu"] = cpus
    if memory is not None:
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


def _many(ids: list[int]) -> str:
    """What to add when an id named several workloads, e.g. " (3 workloads: 4, 5, 6)"; many: first..last."""
    if len(ids) < 2:
        return ""
    listed = ", ".join(map(str, ids)) if len(ids) <= 8 else f"{ids[0]}..{ids[-1]}"
    return f" ({len(ids)} workloads: {listed})"


def _moved(w: dict[str, Any], queue: str) -> str:
    """What `update --queue` did: "queue nlp", or how many moved when running ones stayed."""
    moved, updated = w.get("moved_ids") or [], w["updated_ids"]
    if len(moved) == len(updated):
        return f"queue {queue}"
    stay = len(updated) - len(moved)
    return f"queue {queue} for the {len(moved)} pending; {stay} running stay where they are"


def _add_array_and_after(data: dict[str, Any], array: str | None, after: list[str]) -> None:
    """`--array` and `--after` into a spec (the spec checks the values); `--after` adds to its own list."""
    if array is not None:
        data["array"] = array
    if after:
        data["after"] = [*data.get("after", []), *after]


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


def _autoscaling(scaling: dict[str, Any], word: dict[str, Any] | None) -> str:
    """The range, target and delays; then what the autoscaler last measured and wants."""
    unit = "requests/s" if scaling["metric"] == "rps" else "requests in flight"
    said = (
        f"{scaling['min']}..{scaling['max']} replicas, {scaling['target']:g} {unit} each (over "
        f"{scaling['window']:g} s; add after {scaling['scale_up_delay']:g} s, remove after "
        f"{scaling['scale_down_delay']:g} s)"
    )
    if word is None:
        return said + "; not measured yet"
    return f"{said}; now {word['load']:.3g} {unit}, wants {word['wanted']}"


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


API_PAGE = 100_000  # the most workloads the API lists at once


@app.command()
def ps(
    all: bool = typer.Option(False, "--all", "-a", help="include finished workloads"),
    queue: str | None = typer.Option(None, "--queue", "-q"),
    state: str | None = typer.Option(None, "--state"),
    user: str | None = typer.Option(None, "--user", "-u", help="only work this user submitted"),
    me: bool = typer.Option(False, "--me", help="only your own work (Slurm's squeue --me)"),
    wide: bool = typer.Option(False, "--wide", "-w", help="show every reason"),
    limit: int = typer.Option(
        1000, "--limit", "-n", min=1, max=API_PAGE, help="at most this many, the newest (up to 100,000)"
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """List workloads: pending and running ones, or all with --all."""
    c = client()
    if me:
        user = c.whoami()["name"]
    asked = min(limit + 1, API_PAGE)  # one more than shown tells whether there are more
    workloads = c.workloads(all=all, state=state, queue=queue, user=user, limit=asked)
    if len(workloads) > limit or len(workloads) == API_PAGE:  # on stderr: pipes and --json read rows alone
        workloads = workloads[len(workloads) - limit :]  # oldest first: the newest `limit`
        more = (
            f"--limit shows more (up to {API_PAGE:,})"
            if limit < API_PAGE
            else "narrow it with --queue or --state"
        )
        err_console.print(f"[yellow]the newest {limit:,} only; {more}[/yellow]")
    foreign = c.foreign_jobs() if all and state is None and queue is None and user is None else []
    if as_json:
        rows = [{k: v for k, v in row.items() if not k.startswith("_")} for row in ps_rows(workloads)]
        print_json(rows + [{"foreign": True, **job} for job in foreign] if foreign else rows)
        return
    if not workloads:
        console.print("no workloads" + ("" if all else " pending or running (see --all)"))
    else:
        console.print(ps_table(workloads, wide=wide))
    if foreign:
        console.print("\nforeign jobs (submitted to the backend outside gpupool; their GPUs are in use):")
        console.print(foreign_table(foreign))


@app.command()
def show(
    workload: str = typer.Argument(..., help=refs.ID_HELP), as_json: bool = typer.Option(False, "--json")
) -> None:
    """Everything about one workload: spec, attempts, history, and why it is pending."""
    c = client()
    w = c.workload(refs.workload_id(c, workload, reading=True))
    if as_json:
        print_json(w)
        return
    console.print(
        f"[bold]{w['id']}[/bold] {w['name']}  {styled(w['state'])}  kind={w.get('kind', 'job')} "
        f"queue={w['queue']} priority={w['priority']} preemptible={str(w['preemptible']).lower()} "
        f"gpus={w['gpus']}"
        + (f" nodes={w['nodes']} (gpus per node)" if (w.get("nodes") or 1) > 1 else "")
        + (f" restarts={w['restarts']}" if w.get("restarts") else "")
    )
    if w["reason"]:
        label = "why pending" if w["state"] == "pending" else "reason"
        console.print(f"  {label}: {escape(w['reason'])}")
    if w.get("endpoint"):
        ready = (
            "" if w.get("ready") is None else f"  ready: {'yes' if w['ready'] else 'no'} ({w['readiness']})"
        )
        console.print(f"  endpoint: http://{w['endpoint']}  (listens on $GPUPOOL_PORT){ready}")
        who = {
            "public": "anyone, no token",
            "pool": "any token of this head",
        }.get(w["spec"].get("access") or "private", f"{w.get('user') or 'its owner'} and admins")
        through = f"{c.server.rstrip('/')}/api/v1/workloads/{w['id']}/proxy/"
        console.print(f"  through the head: {through}  ({who})")
    scaling = w["spec"].get("scaling")
    if scaling:
        console.print(f"  autoscaling: {_autoscaling(scaling, w.get('autoscaling'))}")
    if len(w.get("replica_list") or []) > 1:
        how = "by load" if scaling else f"gpupool scale {w['id']} N"
        console.print(f"  replicas: {w['replicas']} of service {w['service_id']} ({how})")
        for r in w["replica_list"]:
            where = f" on {r['node']} at {r['endpoint']}" if r.get("endpoint") else ""
            ready = "" if r.get("ready") is None else f" ready={'yes' if r['ready'] else 'no'}"
            this = "  (this one)" if r["id"] == w["id"] else ""
            console.print(f"    replica {r['replica']}: {r['id']} {styled(r['state'])}{where}{ready}{this}")
    if w.get("array_id") is not None:
        counts = w.get("array_tasks") or {}
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()) if state != "total")
        console.print(
            f"  array: task {w['array_index']} of array {w['array_id']} ({w['spec']['array']}; "
            f"{counts.get('total', 0)} tasks: {states})"
        )
    if w["spec"].get("after"):
        waits = ", ".join(f"{d['workload']} {d['when']}" for d in w["spec"]["after"])
        console.print(f"  after: {waits}")
    notify = w["spec"].get("notify")
    if notify:
        signed = " (signed)" if notify.get("secret") else ""
        console.print(
            f"  notifies: {escape(notify['url'])} when {', '.join(notify['on'])}{signed}", highlight=False
        )
    if w["spec"].get("secrets"):
        console.print(f"  secrets: {', '.join(w['spec']['secrets'])} (of {w.get('user')})", highlight=False)
    # What users wrote (commands, paths, reasons quoting them) is printed as text: `[i for i in x]` in a
    # command is not Rich markup.
    console.print(f"  commands: {escape('; '.join(w['spec'].get('commands', [])))}", highlight=False)
    console.print(f"  workdir: {escape(w['spec'].get('workdir') or '(server default)')}", highlight=False)
    limit = _time_limit(w)
    if limit:
        console.print(f"  time limit: {limit}")
    for a in w["attempt_list"]:
        line = _attempt_line(a, w["queue"])
        console.print(f"  attempt {a['number']}: {line}\n    log: {escape(a['log_path'])}")
    if w["attempt_list"]:
        last = w["attempt_list"][-1]
        seff = efficiency_line(last, datetime.now(UTC))
        if seff is not None:
            console.print(f"  GPU efficiency (attempt {last['number']}): {seff}")
    console.print("  history:")
    for e in w["events"]:
        said = escape(f"{e['reason']} ({e['actor']})")
        console.print(f"    {e['at']}  {e['from'] or '-'} -> {e['to']}  {said}")


def _time_limit(w: Mapping[str, Any]) -> str:
    """`max_duration` for `gpupool show` (Slurm's TimeLimit), with what a running attempt has left of it;
    empty without a limit."""
    limit = w.get("max_duration")
    if limit is None:
        return ""
    said = f"{format_duration(limit)} per attempt (max_duration)"
    running = [a for a in w["attempt_list"] if a["state"] == "running" and a.get("started_at")]
    if running:
        ran = (datetime.now(UTC) - datetime.fromisoformat(running[-1]["started_at"])).total_seconds()
        left = limit - ran
        said += f"; {format_duration(round(left))} left" if left >= 1 else "; passed: stopping"
    return said


def _attempt_line(a: Mapping[str, Any], queue: str) -> str:
    """One attempt for `gpupool show`: its state, where, which GPUs (indices, not a count), the queue it
    ran in where the work has moved since (`queue`: the work's now), how it runs, and how it ended (the
    exit code once, where the reason does not already say it)."""
    gpus = format_gpu_indices(a["gpu_indices"])
    fraction = a.get("gpu_fraction")
    if fraction and fraction < 1 and a["gpu_indices"]:
        gpus = f"{fraction:g} of {gpus}"  # a share of one GPU (resources.gpu: 0.5)
    parts = [f"{styled(a['state'])} on {a['node']}", gpus]
    if a.get("queue") and a["queue"] != queue:
        parts.append(f"in queue {a['queue']}")
    if a.get("backend") == "agent":
        parts.append("ranks on " + ",".join(str(p["node"]) for p in a.get("pods") or []))
    elif a.get("slurm_job_id"):
        parts.append(f"slurm job {a['slurm_job_id']}")
    elif a.get("pid") is not None:
        parts.append(f"pid={a['pid']}")
    reason = a.get("reason") or ""
    code = a.get("exit_code")
    if code is not None and f"exit code {code}" not in reason:
        parts.append(f"exit code {code}")
    if reason:
        parts.append(escape(reason))
    return " ".join(parts)


@app.command()
def why(
    workload: str = typer.Argument(..., help=refs.ID_HELP), as_json: bool = typer.Option(False, "--json")
) -> None:
    """Why a workload is where it is: the scheduler's reason, and its queue's share of the pool."""
    c = client()
    w = c.workload(refs.workload_id(c, workload, reading=True))
    queue = c.queue(w["queue"])
    fair = queue["fair_share"].get("gpu", 0.0)
    if as_json:
        print_json(
            {
                "id": w["id"],
                "state": w["state"],
                "reason_code": w["reason_code"],
                "reason": w["reason"],
                "queue": queue,
            }
        )
        return
    code = escape(f" [{w['reason_code']}]") if w["reason_code"] else ""
    console.print(f"{w['id']} ({w['name']}) is {styled(w['state'])}{code}")
    if w["reason"]:
        console.print(f"  {escape(w['reason'])}")
    console.print(
        f"  queue {queue['name']}: fair share {fair:.3g} GPUs, allocated {queue['gpus_allocated']:g}, "
        f"pending demand {queue['gpus_pending']:g} GPUs, quota {queue['resources']['gpu'].get('quota', 0):g}"
    )


@app.command()
def logs(
    workload: str = typer.Argument(..., help=refs.ID_HELP),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the workload ends"),
    attempt: int | None = typer.Option(None, "--attempt", help="attempt number (default: latest)"),
    rank: int = typer.Option(0, "--rank", min=0, help="rank of a multi-node gang (NODE_RANK); default 0"),
) -> None:
    """Print a workload's output (stdout and stderr of its latest attempt)."""
    c = client()
    found = refs.workload_id(c, workload, reading=True)
    stream_log(c, found, attempt=attempt, rank=rank, follow=follow, say_unstarted=True)


def stream_log(
    c: Client,
    workload_id: int,
    *,
    attempt: int | None = None,
    rank: int = 0,
    follow: bool = True,
    deadline: float | None = None,
    say_unstarted: bool = False,
) -> bool:
    """Print a workload's output: the latest attempt's, or from `attempt` on. With `follow`, on as it comes
    until the workload ends, each later attempt's after the last (a retry, a restart after preemption).
    False when `deadline` (a time.monotonic() time) passed first. With `say_unstarted`, a workload that has
    not run yet is said so on stderr (rather than printing nothing)."""
    offset = 0
    chosen = attempt
    outage, note = Outage(), outage_note(c.server)
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        try:
            chunk = c.logs(workload_id, attempt=chosen, offset=offset, rank=rank)
        except ConnectionFailed as exc:
            if not follow:
                raise
            note(outage.failed(exc))  # the head restarting: the work and its output go on
            time.sleep(1.0)
            continue
        if outage.answered():
            note(None)
        if say_unstarted and chunk["attempt"] is None:
            say_unstarted = False
            if chunk["state"] != "pending":
                err_console.print(
                    f"workload {workload_id} {chunk['state']} before it started: it has no output"
                )
            elif follow:
                err_console.print(
                    f"workload {workload_id} is pending; its output follows once it starts "
                    f"(gpupool why {workload_id})"
                )
            else:
                err_console.print(
                    f"workload {workload_id} is pending: no output yet "
                    f"(gpupool why {workload_id}; gpupool logs -f waits for it)"
                )
        if chosen is None and chunk["attempt"] is not None:
            chosen = chunk["attempt"]
        offset = chunk["offset"]
        if chunk["data"]:
            sys.stdout.write(chunk["data"])
            sys.stdout.flush()
            continue  # the server sends a long log in chunks: read on until it has no more
        if not follow:
            return True
        latest = chunk.get("latest_attempt")
        if chunk.get("attempt_ended") and chosen is not None and latest is not None and latest > chosen:
            chosen, offset = chosen + 1, 0  # read whole: the next attempt's output follows
            continue
        if chunk["eof"] and chunk["state"] != "pending":
            return True  # the workload ended (a pending one waits for its next attempt)
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def outage_note(server: str) -> Callable[[float | None], None]:
    """What a command waiting on work says on stderr while the head cannot be reached (`Outage`): once
    when it stops answering, once when it answers again."""
    told = False

    def note(down: float | None) -> None:
        nonlocal told
        if down is not None and not told:
            told = True
            err_console.print(
                f"the head at {server} cannot be reached (restarting?); the work goes on, and this tries "
                f"again for up to {RIDE_OUT / 60:g} minutes",
                highlight=False,
            )
        elif down is None and told:
            told = False
            err_console.print("the head answers again", highlight=False)

    return note


def _task_option(verb: str) -> Any:
    """The `--task` option of an action on a workload or on a job array's first task alone."""
    what = f"a job array's id: {verb} its first task alone, not the whole array"
    return typer.Option(False, "--task", help=what)


@app.command()
def cancel(
    workloads: list[str] | None = typer.Argument(None, help=refs.IDS_HELP),
    queue: str | None = typer.Option(
        None,
        "--queue",
        "-q",
        help="instead of ids or names: every pending and running workload of this queue",
    ),
    state: str | None = typer.Option(
        None, "--state", help="with --queue: only pending, or only running, ones"
    ),
    task: bool = _task_option("cancel"),
) -> None:
    """Cancel workloads: pending ones at once, running ones by SIGTERM then SIGKILL after the grace period.

    By ids or names, or a queue's work (`--queue Q [--state pending]`, as Slurm's scancel -p Q -t PENDING).
    A service is cancelled whole, all its replicas by the id of any or by its name (`gpupool scale` removes
    some). A job array is cancelled whole by its id (its first task's) or its name, a task alone by its own
    id."""
    c = client()
    if workloads and queue is not None:
        raise CliError("give workload ids or --queue, not both")
    if state is not None and queue is None:
        raise CliError("--state needs --queue: e.g. gpupool cancel --queue nlp --state pending")
    if state is not None and state not in ("pending", "running"):
        raise CliError(f"--state: {state!r} cannot be cancelled; give pending or running")
    if queue is not None:
        c.queue(queue)  # a queue that does not exist is an error, not "nothing to cancel"
        ids = _active_ids(c, queue, state)
        if not ids:
            console.print(f"queue {queue} has no {state or 'pending or running'} work to cancel")
            return
    elif workloads:
        ids = refs.workload_ids(c, workloads, reading=False)
    else:
        raise CliError(
            "which workloads? give their ids or names (gpupool cancel 3 4), or --queue Q for a queue's work"
        )
    covered: set[int] = set()  # a service's replicas, cancelled with it
    for workload_id in ids:
        if workload_id in covered:
            continue
        try:
            w = c.cancel(workload_id, task=task)
        except ApiError as exc:
            if queue is None or exc.status != 409:
                raise
            console.print(f"{workload_id}: {escape(exc.message)}")  # it ended since it was listed: go on
            continue
        what = (
            "cancelled"
            if w["state"] == "cancelled"
            else "stopping (SIGTERM sent; SIGKILL after the grace period)"
        )
        replicas = w.get("cancelled_replicas") or []
        covered.update(replicas)
        if len(replicas) > 1:
            what = (
                f"service cancelled, all {len(replicas)} replicas ({', '.join(map(str, replicas))}): "
                "pending ones at once, running ones stopping (SIGTERM; SIGKILL after the grace period)"
            )
        tasks = w.get("cancelled_tasks")
        if tasks is not None:
            covered.update(tasks)
            what = (
                f"array cancelled, its {len(tasks)} pending or running tasks: pending ones at once, "
                "running ones stopping (SIGTERM; SIGKILL after the grace period)"
            )
        console.print(f"{workload_id} ({w['name']}): {what}")


@app.command()
def update(
    workloads: list[str] = typer.Argument(..., help=refs.IDS_HELP),
    priority: str | None = typer.Option(
        None, "--priority", help="inference|build|interactive|train or 0..1000 (Slurm's scontrol update)"
    ),
    max_duration: str | None = typer.Option(
        None,
        "--max-duration",
        help="a new time limit, e.g. 4h or 1h30m, counted from the start of a running attempt; none: no "
        "limit (Slurm's TimeLimit=)",
    ),
    queue: str | None = typer.Option(
        None, "--queue", help="move pending work to this queue (Slurm's Partition=); running work stays"
    ),
    task: bool = _task_option("change"),
) -> None:
    """Change the priority, the time limit or the queue of work, as Slurm's scontrol update.

    The next pass orders and preempts by the new priority. A running attempt already past its new time
    limit is stopped at the next pass (SIGTERM, then SIGKILL after its grace period). Only pending work
    moves to another queue (hold running work first); GPU-hours already used stay with the old queue."""
    if priority is None and max_duration is None and queue is None:
        raise CliError("give --priority, --max-duration or --queue; e.g. gpupool update 12 --max-duration 4h")
    value = None if priority is None else _priority_option(priority)
    c = client()
    for workload_id in refs.workload_ids(c, workloads, reading=False):
        w = c.update(workload_id, priority=value, max_duration=max_duration, queue=queue, task=task)
        said = [f"priority {w['priority']}"] if priority is not None else []
        if max_duration is not None:
            limit = w["max_duration"]
            said.append("no time limit" if limit is None else f"max duration {format_duration(limit)}")
        if queue is not None:
            said.append(_moved(w, queue))
        console.print(f"{workload_id} ({w['name']}): {', '.join(said)}{_many(w['updated_ids'])}")


def _priority_option(given: str) -> int | str:
    """--priority as the API takes it: a number, or a class name (the range is the server's to check)."""
    text = given.strip()
    if text.isdigit():
        return int(text)
    if text.lower() in spec.PRIORITY_CLASSES:
        return text.lower()
    classes = ", ".join(spec.PRIORITY_CLASSES)
    raise CliError(
        f"--priority: {given!r} is not a number 0..1000 or a class name ({classes}); "
        "e.g. --priority 100 or --priority train"
    )


@app.command()
def hold(
    workloads: list[str] = typer.Argument(..., help=refs.IDS_HELP),
    task: bool = _task_option("hold"),
) -> None:
    """Keep work pending until `gpupool release` (Slurm's scontrol hold; Run:ai's suspend).

    Running work is stopped first (SIGTERM, then SIGKILL after its grace period) and resumes from its
    checkpoint once released. A service is held whole, a job array whole by its id."""
    c = client()
    for workload_id in refs.workload_ids(c, workloads, reading=False):
        w = c.hold(workload_id, task=task)
        ids = w["held_ids"]
        also = _many(ids)
        console.print(
            f"{workload_id} ({w['name']}): held{also}; waits pending until `gpupool release {workload_id}` "
            "(running work stops first: SIGTERM, then SIGKILL after its grace period)"
        )


@app.command()
def requeue(
    workloads: list[str] = typer.Argument(..., help=refs.IDS_HELP),
    task: bool = _task_option("requeue"),
) -> None:
    """Stop running work and let the scheduler place it again (Slurm's scontrol requeue).

    Each running attempt stops (SIGTERM, then SIGKILL after its grace period); the work waits pending and
    resumes from its checkpoint wherever the next pass puts it, maybe the same node (`gpupool node cordon`
    keeps it off one). A service's replicas and a job array's tasks go together, by the array's id."""
    c = client()
    for workload_id in refs.workload_ids(c, workloads, reading=False):
        w = c.requeue(workload_id, task=task)
        ids = w["requeued_ids"]
        if not ids:
            console.print(f"{workload_id} ({w['name']}): already stopping; nothing more to do")
            continue
        console.print(
            f"{workload_id} ({w['name']}): requeued{_many(ids)}; stopping (SIGTERM, then SIGKILL after its "
            "grace period), then pending for the scheduler"
        )


@app.command()
def release(
    workloads: list[str] = typer.Argument(..., help=refs.IDS_HELP),
    task: bool = _task_option("release"),
) -> None:
    """Let held work be scheduled again (Slurm's scontrol release; Run:ai's resume)."""
    c = client()
    for workload_id in refs.workload_ids(c, workloads, reading=False):
        w = c.release(workload_id, task=task)
        ids = w["held_ids"]
        also = _many(ids)
        console.print(f"{workload_id} ({w['name']}): released{also}; the scheduler may start it again")


@app.command()
def scale(
    service: str = typer.Argument(..., help="the service's id (or any of its replicas') or name"),
    replicas: str = typer.Argument(
        ..., help="how many copies run, 1..64; or MIN..MAX, the range of a service that scales itself"
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Change how many replicas a service runs.

    New ones wait for the scheduler as any workload does; removed ones (those still waiting first, then
    the highest-numbered) stop after their grace period. For a service with `scaling`, give its new range
    instead: gpupool scale 5 2..6"""
    count = replicas.strip()
    if not re.fullmatch(r"\d+|\d+\s*\.\.\s*\d+", count):
        raise CliError(
            f"replicas: {replicas!r} is not a whole number or a range MIN..MAX; e.g. gpupool scale "
            f"{service} 2, or gpupool scale {service} 1..4 for a service that scales itself"
        )
    c = client()
    w = c.scale(refs.workload_id(c, service, reading=False), int(count) if count.isdigit() else count)
    if as_json:
        print_json(w)
        return
    active = [r for r in w["replica_list"] if r["state"] in ("pending", "running")]
    listed = ", ".join(f"replica {r['replica']}: {r['id']} {r['state']}" for r in active)
    scaling = w["spec"].get("scaling")
    within = f", scaling itself within {scaling['min']}..{scaling['max']}" if scaling else ""
    console.print(f"service {w['name']} (workload {w['id']}): {w['replicas']} replicas{within}: {listed}")


def _active_ids(c: Client, queue: str, state: str | None) -> list[int]:
    """The ids of the queue's pending and running work (or those of one `state`), oldest first; of each
    state the newest API_PAGE (the API's largest page), and a line saying so when there are more."""
    ids: list[int] = []
    for wanted in (state,) if state is not None else ("pending", "running"):
        found = [w["id"] for w in c.workloads(state=wanted, queue=queue, limit=API_PAGE)]
        if len(found) >= API_PAGE:
            console.print(f"[yellow]the newest {API_PAGE:,} {wanted} workloads only; run it again[/yellow]")
        ids += found
    return sorted(ids)


# -- nodes ------------------------------------------------------------------------------------------------


@app.command()
def ui(open_it: bool = typer.Option(False, "--open", help="open it in this machine's web browser")) -> None:
    """The dashboard's address, with your token after '#' (browsers keep that part to themselves)."""
    c = client()
    c.queues()  # the server answers and takes the token: else its error, with the fix, and no address
    page = f"{c.server.rstrip('/')}/ui"
    url = f"{page}#token={quote(c.token, safe='')}" if c.token else page
    print(url)
    if open_it and not webbrowser.open(url):
        raise CliError("no web browser found here; open the address above in one")


@app.command()
def forward(
    service: str = typer.Argument(..., help="the service's id or name"),
    port: int = typer.Option(8000, "--port", "-p", min=0, max=65535, help="local port; 0: any free one"),
    host: str = typer.Option("127.0.0.1", "--host", help="local address to listen on"),
) -> None:
    """Reach a service at a local address (http://127.0.0.1:8000/), through the head's proxy.

    The proxy gets your token: for a browser, a notebook, or a client that cannot send the token (HTTP
    and WebSockets). Ctrl-C ends it."""
    import socket

    import uvicorn

    from gpupool.client.forward import Forwarder

    c = client()
    workload_id = refs.workload_id(c, service, reading=False)
    w = c.workload(workload_id)  # exists, and the token is good: else the server's error, with the fix
    if w.get("kind") != "service":
        raise CliError(
            f"workload {workload_id} ({w['name']}) is a job; only a service has an endpoint to forward to "
            "(kind: service, or gpupool run --service)"
        )
    try:
        listener = socket.create_server((host, port))
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another with --port") from exc
    bound = listener.getsockname()[1]
    state = w["state"] + ("" if w.get("ready") is not False else ", not ready yet")
    print(
        f"forwarding http://{host}:{bound}/ to service {w['name']} (workload {workload_id}, {state}) "
        f"through {c.server}; Ctrl-C to stop",
        flush=True,
    )
    config = uvicorn.Config(Forwarder(c.server, c.token, workload_id), log_level="warning")
    uvicorn.Server(config).run(sockets=[listener])


@app.command()
def nodes(as_json: bool = typer.Option(False, "--json")) -> None:
    """Nodes, their GPUs and what runs on them."""
    rows = client().nodes()
    if as_json:
        print_json(rows)
        return
    columns = ("NAME", "STATE", "HEALTH", "GPUS", "MODEL", "ALLOCATED", "CPUS", "MEMORY", "UTIL")
    table = folding_table(columns, {"NAME": [n["name"] for n in rows]})
    for n in rows:
        utils = [g["sample"]["utilization_pct"] for g in n["gpus"] if g.get("sample")]
        util = f"{sum(utils) / len(utils):.0f}%" if utils else "-"
        table.add_row(
            n["name"],
            styled(n["state"]),
            styled(n.get("health", "unknown")),
            str(n["gpus_total"]),
            ",".join(n["gpu_models"]) or "-",
            f"{n['gpus_allocated']}/{n['gpus_total']}",
            f"{n['cpus']:g}",
            human_bytes(n["memory_bytes"]),
            util,
        )
    console.print(table)


@node_app.command("cordon")
def node_cordon(name: str, reason: str | None = typer.Option(None, "--reason")) -> None:
    """Stop placing new work on NAME; running work continues."""
    n = client().cordon(name, reason)
    console.print(f"node {n['name']}: {styled(n['state'])}")


@node_app.command("uncordon")
def node_uncordon(name: str) -> None:
    """Return NAME to service."""
    n = client().uncordon(name)
    console.print(f"node {n['name']}: {styled(n['state'])}")


# -- queues -----------------------------------------------------------------------------------------------


@app.command()
def queues(as_json: bool = typer.Option(False, "--json")) -> None:
    """Queues with their GPU quota, limit, weight and current use.

    PRIO is the queue's priority; WEIGHT the spec's over-quota weight, WEIGHT (NOW) the one the last
    scheduling pass used; GPUS ALLOC and GPUS PEND count GPUs allocated and asked for by pending work,
    RUN and PEND its running and pending workloads; GPU-H BUDGET the GPU-hours used of its budget."""
    rows = client().queues()
    if as_json:
        print_json(rows)
        return
    console.print(queues_table(rows))


USAGE_GROUPS = ("queue", "user", "workload", "node", "model", "day", "outcome")


@app.command()
def usage(
    since: str | None = typer.Option(
        None,
        "--since",
        help="start: a time or date (2026-11-01, UTC), or how long before --until (7d, 12h); default 7d",
    ),
    until: str | None = typer.Option(None, "--until", help="end, in the same forms; default now"),
    by: str = typer.Option("queue", "--by", help=f"a line per {', '.join(USAGE_GROUPS)}"),
    queue: str | None = typer.Option(None, "--queue", "-q", help="only this queue's work"),
    top: int = typer.Option(
        0, "--top", min=0, help="show only the first N lines (0: all); the total counts all"
    ),
    as_json: bool = typer.Option(False, "--json"),
    as_csv: bool = typer.Option(False, "--csv", help="CSV for a spreadsheet: a line per row, no total"),
) -> None:
    """GPU-hours used per queue (or user, workload, node, ...), and what they cost.

    Per queue (or user, workload, node, GPU model, day, or how the attempts ended) over a window, priced
    with $GPUPOOL_HOME/prices.yaml: Slurm's sreport, Run:ai's consumption report. Counts the GPUs
    allocated, whether or not the programs used them; USED and UTIL weigh them by the mean GPU
    utilization their attempts' telemetry showed (Slurm's seff), "no telemetry" without it."""
    if by not in USAGE_GROUPS:
        raise CliError(f"--by {by}: not one of {', '.join(USAGE_GROUPS)}; e.g. --by queue")
    if as_json and as_csv:
        raise CliError("--json and --csv: give one of them")
    report = client().usage(since=since, until=until, by=by, queue=queue)
    if as_json:
        print_json(report)
        return
    if as_csv:
        write_usage_csv(report, sys.stdout)
        return
    console.print(usage_table(report, top))


def _queue_body(file: Path | None, fields: dict[str, Any]) -> dict[str, Any]:
    """A queue spec from an optional YAML file plus the flags given (flags win)."""
    from gpupool.spec.document import load_yaml  # with pydantic: loaded by the commands that need it

    body: dict[str, Any] = {}
    budget = _budget(fields.pop("budget", None))
    caps = _user_limits(fields.pop("user_gpus", None), fields.pop("user_workloads", None))
    if file is not None:
        try:
            loaded = load_yaml(file.read_text(), "name: nlp")
        except OSError as exc:
            raise CliError(f"cannot read {file}: {exc.strerror}") from exc
        except spec.SpecError as exc:
            raise CliError(f"{file}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise CliError(f"{file}: a queue spec must be a YAML mapping")
        body.update(loaded)
    gpu = {key: fields.pop(flag) for flag, key in _GPU_FLAGS.items() if fields.get(flag) is not None}
    if gpu:
        body.setdefault("resources", {}).setdefault("gpu", {}).update(gpu)
    body.update({key: value for key, value in fields.items() if value is not None and key not in _GPU_FLAGS})
    if budget is not None:
        body["budget"] = None if budget == "none" else budget
    if caps is not None:
        body["user_limits"] = {**(body.get("user_limits") or {}), **caps}
    return body


_GPU_FLAGS = {"gpu_quota": "quota", "gpu_limit": "limit", "gpu_weight": "over_quota_weight"}
_QUOTA = typer.Option(None, "--gpu-quota", help="GPUs guaranteed to this queue")
_LIMIT = typer.Option(None, "--gpu-limit", help="hard cap on GPUs in use")
_WEIGHT = typer.Option(None, "--gpu-weight", help="share of idle GPUs beyond quota (over-quota weight)")
_PRIORITY = typer.Option(None, "--priority", help="queue priority 0..1000")
_PARENT = typer.Option(None, "--parent", help="parent queue (department)")
_DESCRIPTION = typer.Option(None, "--description")
_ORDERING = typer.Option(None, "--ordering", help="fifo | attained | las | estimate")
_MIN_PREEMPT = typer.Option(None, "--min-runtime-preempt", help="e.g. 10m: no preemption of younger work")
_MIN_RECLAIM = typer.Option(None, "--min-runtime-reclaim", help="e.g. 30m: no reclaim of younger work")
_BUDGET = typer.Option(
    None,
    "--budget",
    help="GPU-hours per calendar month (UTC) for this queue and those below it, e.g. 5000, 200/week, "
    "24/day; none removes it",
)
_USER_GPUS = typer.Option(
    None,
    "--user-gpus",
    help="GPUs one user's running work in the queue may hold (user_limits.gpus); none: no cap",
)
_USER_WORKLOADS = typer.Option(
    None,
    "--user-workloads",
    help="workloads one user may run in the queue (user_limits.workloads); none: no cap",
)
_FILE = typer.Option(None, "--file", "-f", help="a queue spec (YAML)")


def _user_limits(gpus: str | None, workloads: str | None) -> dict[str, Any] | None:
    """--user-gpus and --user-workloads as the spec's `user_limits` (None: neither flag)."""
    caps: dict[str, Any] = {}
    for flag, key, value in (("--user-gpus", "gpus", gpus), ("--user-workloads", "workloads", workloads)):
        if value is None:
            continue
        if value.strip().lower() == "none":
            caps[key] = None
            continue
        try:
            number = float(value)
        except ValueError:
            raise CliError(f"{flag} {value}: a number, e.g. 8, or none to remove the cap") from None
        caps[key] = int(number) if number.is_integer() else number
    return caps or None


def _budget(text: str | None) -> dict[str, Any] | str | None:
    """--budget as the spec's `budget` (None: no flag; "none": remove the budget)."""
    if text is None:
        return None
    if text.strip().lower() == "none":
        return "none"
    hours, _, period = text.partition("/")
    try:
        gpu_hours = float(hours)
    except ValueError:
        raise CliError(
            f"--budget {text}: GPU-hours, optionally per day, week or month, e.g. 5000 or 200/week"
        ) from None
    given = int(gpu_hours) if gpu_hours.is_integer() else gpu_hours  # errors echo it as it was written
    # no period given: the queue's own (or, for a new budget, the spec's default, month)
    return {"gpu_hours": given, **({"period": period.strip()} if period.strip() else {})}


@queue_app.command("create")
def queue_create(
    name: str,
    gpu_quota: float | None = _QUOTA,
    gpu_limit: float | None = _LIMIT,
    gpu_weight: float | None = _WEIGHT,
    priority: int | None = _PRIORITY,
    parent: str | None = _PARENT,
    description: str | None = _DESCRIPTION,
    ordering: str | None = _ORDERING,
    min_runtime_preempt: str | None = _MIN_PREEMPT,
    min_runtime_reclaim: str | None = _MIN_RECLAIM,
    budget: str | None = _BUDGET,
    user_gpus: str | None = _USER_GPUS,
    user_workloads: str | None = _USER_WORKLOADS,
    file: Path | None = _FILE,
) -> None:
    """Create a queue: gpupool queue create nlp --gpu-quota 8 --gpu-limit 16 [--budget 5000]"""
    fields = dict(locals())
    body = _queue_body(fields.pop("file"), {k: v for k, v in fields.items() if k != "name"})
    body["name"] = name
    spec.parse_queue_spec(body)
    q = client().create_queue(body)
    console.print(f"queue {q['name']} created")


@queue_app.command("update")
def queue_update(
    name: str,
    gpu_quota: float | None = _QUOTA,
    gpu_limit: float | None = _LIMIT,
    gpu_weight: float | None = _WEIGHT,
    priority: int | None = _PRIORITY,
    parent: str | None = _PARENT,
    description: str | None = _DESCRIPTION,
    ordering: str | None = _ORDERING,
    min_runtime_preempt: str | None = _MIN_PREEMPT,
    min_runtime_reclaim: str | None = _MIN_RECLAIM,
    budget: str | None = _BUDGET,
    user_gpus: str | None = _USER_GPUS,
    user_workloads: str | None = _USER_WORKLOADS,
    file: Path | None = _FILE,
) -> None:
    """Change some fields of a queue; the others keep their values."""
    fields = dict(locals())
    body = _queue_body(fields.pop("file"), {k: v for k, v in fields.items() if k != "name"})
    if not body:
        raise CliError(
            "nothing to change: give at least one of --gpu-quota, --gpu-limit, --gpu-weight, --priority, "
            "--parent, --description, --ordering, --min-runtime-preempt, --min-runtime-reclaim, --budget, "
            "--user-gpus, --user-workloads, --file"
        )
    q = client().update_queue(name, body)
    console.print(f"queue {q['name']} updated")


@queue_app.command("delete")
def queue_delete(name: str) -> None:
    """Delete a queue that has no pending or running work and no child queues.

    Finished work keeps its queue's name."""
    client().delete_queue(name)
    console.print(f"queue {name} deleted")


from gpupool.cli import audit as _audit  # noqa: E402, F401  (registers `gpupool audit`)
from gpupool.cli import health as _health  # noqa: E402, F401  (`gpupool top|health`, `node show|inject-fault`)
from gpupool.cli import nodes as _nodes  # noqa: E402, F401  (registers `gpupool node join-token|drain`)
from gpupool.cli import secrets as _secrets  # noqa: E402, F401  (registers `gpupool secret ...`)
from gpupool.cli import tokens as _tokens  # noqa: E402, F401  (registers `gpupool token ...`, `whoami`)
from gpupool.cli import wait as _wait  # noqa: E402, F401  (registers `gpupool wait`)
