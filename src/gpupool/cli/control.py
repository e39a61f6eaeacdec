"""`gpupool cancel`, `update`, `hold`, `requeue`, `release` and `scale`: changing work already submitted, as
Slurm's scancel and scontrol do."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import typer
from rich.markup import escape

from gpupool import spec  # its pydantic models load on first use (see gpupool.spec): not for `ps`, `logs`
from gpupool.cli import refs
from gpupool.cli.app import API_PAGE, app, client
from gpupool.cli.errors import CliError
from gpupool.cli.render import JSON_HELP, console, member_name, print_error, print_json
from gpupool.cli.submit import SlurmNames
from gpupool.client import ApiError, Client
from gpupool.spec import format_duration


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
    alone: set[int] = set()  # named as a job array's first task alone (`NAME[0]`)
    if queue is not None:
        c.queue(queue)  # a queue that does not exist is an error, not "nothing to cancel"
        ids = _active_ids(c, queue, state)
        if not ids:
            console.print(f"queue {queue} has no {state or 'pending or running'} work to cancel")
            return
    elif workloads:
        ids, alone = _named(c, workloads)
    else:
        raise CliError(
            "which workloads? give their ids or names (gpupool cancel 3 4), or --queue Q for a queue's work"
        )
    covered: set[int] = set()  # a service's replicas, cancelled with it

    def cancel_one(workload_id: int) -> None:
        if workload_id in covered:
            return
        try:
            w = c.cancel(workload_id, task=task or workload_id in alone)
        except ApiError as exc:
            if queue is None or exc.status != 409:
                raise
            console.print(f"{workload_id}: {escape(exc.message)}")  # it ended since it was listed: go on
            return
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
        name = w["name"] if tasks is not None else _label(w, replicas)  # an array cancelled whole: its name
        console.print(f"{workload_id} ({name}): {what}")

    each(ids, cancel_one)


def each(ids: list[int], act: Callable[[int], None]) -> None:
    """`act` on each of `ids` in turn, as scancel and scontrol do with several: one the server refuses (it
    has ended, or is not the caller's) is said on stderr and the rest still go on, whatever their order;
    exit 1 after them when any was refused. A lone id's refusal is the command's error."""
    refused = False
    for workload_id in ids:
        try:
            act(workload_id)
        except ApiError as exc:
            if len(ids) == 1:
                raise
            print_error(exc.message)
            refused = True
    if refused:
        raise typer.Exit(1)


@app.command(cls=SlurmNames)  # `--time`, `-p`, `--qos` answered with this command's own options
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
    ids, alone = _named(c, workloads)
    for workload_id in ids:
        w = c.update(
            workload_id,
            priority=value,
            max_duration=max_duration,
            queue=queue,
            task=task or workload_id in alone,
        )
        said = [f"priority {w['priority']}"] if priority is not None else []
        if max_duration is not None:
            limit = w["max_duration"]
            said.append("no time limit" if limit is None else f"max duration {format_duration(limit)}")
        if queue is not None:
            said.append(_moved(w, queue))
        console.print(
            f"{workload_id} ({_label(w, w['updated_ids'])}): {', '.join(said)}{_many(w['updated_ids'])}"
        )


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
    ids, alone = _named(c, workloads)

    def hold_one(workload_id: int) -> None:
        w = c.hold(workload_id, task=task or workload_id in alone)
        name = _label(w, w["held_ids"])
        if not w.get("changed_ids", True):
            console.print(f"{workload_id} ({name}): already held; nothing more to do")
            return
        release = f"{workload_id} --task" if workload_id in alone and not task else workload_id
        took = _some(w["held_ids"], w["changed_ids"], "already held")
        console.print(
            f"{workload_id} ({name}): held{took}; waits pending until `gpupool release "
            f"{release}` (running work stops first: SIGTERM, then SIGKILL after its grace period)"
        )

    each(ids, hold_one)


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
    named, alone = _named(c, workloads)

    def requeue_one(workload_id: int) -> None:
        w = c.requeue(workload_id, task=task or workload_id in alone)
        ids = w["requeued_ids"]
        if not ids:
            console.print(f"{workload_id} ({_label(w, ids)}): already stopping; nothing more to do")
            return
        console.print(
            f"{workload_id} ({_label(w, ids)}): requeued{_many(ids)}; stopping (SIGTERM, then SIGKILL after "
            "its grace period), then pending for the scheduler"
        )

    each(named, requeue_one)


@app.command()
def release(
    workloads: list[str] = typer.Argument(..., help=refs.IDS_HELP),
    task: bool = _task_option("release"),
) -> None:
    """Let held work be scheduled again (Slurm's scontrol release; Run:ai's resume)."""
    c = client()
    ids, alone = _named(c, workloads)

    def release_one(workload_id: int) -> None:
        w = c.release(workload_id, task=task or workload_id in alone)
        name = _label(w, w["held_ids"])
        if not w.get("changed_ids", True):
            console.print(f"{workload_id} ({name}): not held; nothing to release")
            return
        took = _some(w["held_ids"], w["changed_ids"], "not held")
        console.print(f"{workload_id} ({name}): released{took}; the scheduler may start it again")

    each(ids, release_one)


@app.command(context_settings={"ignore_unknown_options": True})  # `scale ID -1`: a count, said as one
def scale(
    service: str = typer.Argument(..., help="the service's id (or any of its replicas') or name"),
    replicas: str = typer.Argument(
        ..., help="how many copies run, 1..64; or MIN..MAX, the range of a service that scales itself"
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
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
    listed = ", ".join(
        f"replica {r['replica']}: {r['id']} {'stopping' if r.get('stopping') else r['state']}" for r in active
    )
    scaling = w["spec"].get("scaling")
    within = f", scaling itself within {scaling['min']}..{scaling['max']}" if scaling else ""
    many = f"{w['replicas']} replica{'' if w['replicas'] == 1 else 's'}"
    console.print(f"service {w['name']} (workload {w['id']}): {many}{within}: {listed}")


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


def _named(c: Client, workloads: list[str]) -> tuple[list[int], set[int]]:
    """The ids the arguments name, and those of them named as a job array's first task alone (`NAME[0]`
    of an array whose first index is 0: its id is also the array's, which names every task)."""
    named = refs.workload_refs(c, workloads, reading=False)
    return [i for i, _ in named], {i for i, first_task in named if first_task}


def _label(w: dict[str, Any], ids: list[int]) -> str:
    """How a message names what an action took: a service or array whole by its name, a replica or a task
    alone as `gpupool ps` shows it (NAME#N, NAME[N])."""
    return str(w["name"]) if len(ids) > 1 else member_name(w)


def _many(ids: list[int]) -> str:
    """What to add when an id named several workloads, e.g. " (3 workloads: 4, 5, 6)"; many: first..last."""
    if len(ids) < 2:
        return ""
    listed = ", ".join(map(str, ids)) if len(ids) <= 8 else f"{ids[0]}..{ids[-1]}"
    return f" ({len(ids)} workloads: {listed})"


def _some(named: list[int], changed: list[int], others: str) -> str:
    """What to add when an id named several workloads and an action changed only some of them, e.g.
    " (2 of 3 workloads: 4, 6; 1 already held)"."""
    if len(changed) == len(named):
        return _many(named)
    listed = ", ".join(map(str, changed)) if len(changed) <= 8 else f"{changed[0]}..{changed[-1]}"
    return f" ({len(changed)} of {len(named)} workloads: {listed}; {len(named) - len(changed)} {others})"


def _moved(w: dict[str, Any], queue: str) -> str:
    """What `update --queue` did: "queue nlp", or how many moved when running ones stayed."""
    moved, updated = w.get("moved_ids") or [], w["updated_ids"]
    if len(moved) == len(updated):
        return f"queue {queue}"
    stay = len(updated) - len(moved)
    return f"queue {queue} for the {len(moved)} pending; {stay} running stay where they are"
