"""`gpupool queues` and `gpupool queue list|show|create|update|delete`: the queues, their quotas, limits
and budgets."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from gpupool import spec  # its pydantic models load on first use (see gpupool.spec): not for `ps`, `logs`
from gpupool.cli.app import app, client, listing_aliases, queue_app
from gpupool.cli.errors import CliError
from gpupool.cli.render import JSON_HELP, console, print_json, print_warnings
from gpupool.cli.render_queues import queue_lines, queues_table


@app.command()
def queues(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Queues with their GPU quota, limit, weight and current use.

    PRIO is the queue's priority; WEIGHT the spec's over-quota weight, WEIGHT (NOW) the one the last
    scheduling pass used; GPUS ALLOC and GPUS PEND count GPUs allocated and asked for by pending work,
    RUN and PEND its running and pending workloads; GPU-H BUDGET the GPU-hours used of its budget."""
    rows = client().queues()
    if as_json:
        print_json(rows)
        return
    console.print(queues_table(rows))


listing_aliases(queue_app, queues, "Every queue, as `gpupool queues` lists them (also `gpupool queue ls`).")


@queue_app.command("show")
def queue_show(name: str, as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """One queue: its quotas and limits, its fair share and use now, its ordering, minimum runtimes,
    budget and per-user caps (as `scontrol show partition`)."""
    q = client().queue(name)
    if as_json:
        print_json(q)
        return
    for line in queue_lines(q):
        console.print(line, highlight=False)


def _queue_body(file: Path | None, fields: dict[str, Any]) -> dict[str, Any]:
    """A queue spec from an optional YAML file plus the flags given (flags win)."""
    from gpupool.spec.document import load_yaml  # with pydantic: loaded by the commands that need it

    body: dict[str, Any] = {}
    budget = _budget(fields.pop("budget", None), fields.pop("budget_when_spent", None))
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
    limit = fields.pop("gpu_limit", None)  # "none": the cap removed, so not dropped as unset below
    cap = fields.pop("max_priority", None)
    if cap is not None:
        body["max_priority"] = _or_none(cap, "--max-priority", int, "a whole number, e.g. 50")
    parent = fields.pop("parent", None)
    if parent is not None:
        body["parent"] = None if parent.strip().lower() in ("none", "") else parent  # none: top-level
    gpu = {key: fields.pop(flag) for flag, key in _GPU_FLAGS.items() if fields.get(flag) is not None}
    if limit is not None:
        gpu["limit"] = _or_none(limit, "--gpu-limit", float, "a number of GPUs, e.g. 16")
    if gpu:
        body.setdefault("resources", {}).setdefault("gpu", {}).update(gpu)
    body.update({key: value for key, value in fields.items() if value is not None and key not in _GPU_FLAGS})
    if budget == "none":
        body["budget"] = None
    elif isinstance(budget, dict):  # the flags win over the file's budget, field by field
        loaded_budget = body.get("budget")
        body["budget"] = {**loaded_budget, **budget} if isinstance(loaded_budget, dict) else budget
    if caps is not None:
        body["user_limits"] = {**(body.get("user_limits") or {}), **caps}
    _refuse_non_finite(body, "")
    return body


# The flag that sets each number of a queue spec, for an error that names what the user typed.
_FLAG_OF = {
    "resources.gpu.quota": "--gpu-quota",
    "resources.gpu.limit": "--gpu-limit",
    "resources.gpu.over_quota_weight": "--gpu-weight",
    "budget.gpu_hours": "--budget",
    "user_limits.gpus": "--user-gpus",
    "user_limits.workloads": "--user-workloads",
}


def _refuse_non_finite(value: Any, path: str) -> None:
    """nan and inf (which float() reads, and YAML's .nan and .inf) are no quota, limit or budget: said here,
    as the server would say it, where JSON could not carry them there."""
    if isinstance(value, dict):
        for key, inner in value.items():
            _refuse_non_finite(inner, f"{path}.{key}" if path else str(key))
    elif isinstance(value, float) and not math.isfinite(value):
        flag = _FLAG_OF.get(path)
        said = f"{flag} {value}" if flag else f"{path}: {value}"
        raise CliError(f"{said} is not a finite number; give a number such as 16, or none to remove it")


_GPU_FLAGS = {"gpu_quota": "quota", "gpu_limit": "limit", "gpu_weight": "over_quota_weight"}
_QUOTA = typer.Option(None, "--gpu-quota", help="GPUs guaranteed to this queue")
_LIMIT = typer.Option(None, "--gpu-limit", help="hard cap on GPUs in use; none removes it")
_WEIGHT = typer.Option(None, "--gpu-weight", help="share of idle GPUs beyond quota (over-quota weight)")
_PRIORITY = typer.Option(None, "--priority", help="queue priority 0..1000")
_MAX_PRIORITY = typer.Option(
    None, "--max-priority", help="the highest priority users may give work here (max_priority); none: any"
)
_PARENT = typer.Option(None, "--parent", help="parent queue (department); none: a top-level queue")
_DESCRIPTION = typer.Option(None, "--description", help="a line about the team or project")
_ORDERING = typer.Option(None, "--ordering", help="fifo | attained | las | estimate")
_MIN_PREEMPT = typer.Option(None, "--min-runtime-preempt", help="e.g. 10m: no preemption of younger work")
_MIN_RECLAIM = typer.Option(None, "--min-runtime-reclaim", help="e.g. 30m: no reclaim of younger work")
_BUDGET = typer.Option(
    None,
    "--budget",
    help="GPU-hours per calendar day, week or month (UTC) for this queue and those below it, e.g. "
    "5000/month, 200/week, 24/day; a bare number keeps the budget's period (a month for a new budget); none "
    "removes it",
)
_BUDGET_WHEN_SPENT = typer.Option(
    None,
    "--budget-when-spent",
    help="what the queue's running work does once its budget is used: wait (runs on; only new work waits; "
    "the default) or stop (stopped as `gpupool requeue` stops it, to wait pending until the next period or "
    "a raised budget)",
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


def _or_none(text: str, flag: str, kind: Callable[[str], float], said: str) -> float | None:
    """A flag's number, or None for `none` (the setting removed)."""
    if text.strip().lower() == "none":
        return None
    try:
        return kind(text)
    except ValueError:
        raise CliError(f"{flag} {text}: {said}, or none to remove it") from None


WHEN_SPENT = ("wait", "stop")  # the spec's budget.when_spent (spec/queue.py BudgetWhenSpent)


def _budget(text: str | None, when_spent: str | None = None) -> dict[str, Any] | str | None:
    """--budget and --budget-when-spent as the spec's `budget` (None: neither flag; "none": remove the
    budget)."""
    when: dict[str, Any] = {}
    if when_spent is not None:
        if when_spent.strip().lower() not in WHEN_SPENT:
            raise CliError(
                f"--budget-when-spent {when_spent}: wait (running work goes on once the budget is used) or "
                "stop (it is stopped and waits pending)"
            )
        when["when_spent"] = when_spent.strip().lower()
    if text is None:
        return when or None
    if text.strip().lower() == "none":
        if when:
            raise CliError("--budget none removes the budget: give --budget-when-spent only with a budget")
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
    return {"gpu_hours": given, **({"period": period.strip()} if period.strip() else {}), **when}


@queue_app.command("create")
def queue_create(
    name: str | None = typer.Argument(None, help="the queue's name (or `name:` in the --file spec)"),
    gpu_quota: float | None = _QUOTA,
    gpu_limit: str | None = _LIMIT,
    gpu_weight: float | None = _WEIGHT,
    priority: int | None = _PRIORITY,
    max_priority: str | None = _MAX_PRIORITY,
    parent: str | None = _PARENT,
    description: str | None = _DESCRIPTION,
    ordering: str | None = _ORDERING,
    min_runtime_preempt: str | None = _MIN_PREEMPT,
    min_runtime_reclaim: str | None = _MIN_RECLAIM,
    budget: str | None = _BUDGET,
    budget_when_spent: str | None = _BUDGET_WHEN_SPENT,
    user_gpus: str | None = _USER_GPUS,
    user_workloads: str | None = _USER_WORKLOADS,
    file: Path | None = _FILE,
) -> None:
    """Create a queue: gpupool queue create nlp --gpu-quota 8 --gpu-limit 16 [--budget 5000]
    [--budget-when-spent stop]"""
    fields = dict(locals())
    body = _queue_body(fields.pop("file"), {k: v for k, v in fields.items() if k != "name"})
    named = body.get("name")
    if name is None and not named:
        raise CliError("give the queue's name: gpupool queue create NAME, or `name:` in the --file spec")
    if name is not None and named and named != name:
        raise CliError(f"{file} names the queue {named!r} and the command {name!r}: give one name")
    body["name"] = name or named
    try:
        spec.parse_queue_spec(body)
    except spec.SpecError as exc:
        raise CliError(f"{file}: {exc}" if file is not None else str(exc)) from exc
    q = client().create_queue(body)
    console.print(f"queue {q['name']} created")
    print_warnings(q)


@queue_app.command("update")
def queue_update(
    name: str,
    gpu_quota: float | None = _QUOTA,
    gpu_limit: str | None = _LIMIT,
    gpu_weight: float | None = _WEIGHT,
    priority: int | None = _PRIORITY,
    max_priority: str | None = _MAX_PRIORITY,
    parent: str | None = _PARENT,
    description: str | None = _DESCRIPTION,
    ordering: str | None = _ORDERING,
    min_runtime_preempt: str | None = _MIN_PREEMPT,
    min_runtime_reclaim: str | None = _MIN_RECLAIM,
    budget: str | None = _BUDGET,
    budget_when_spent: str | None = _BUDGET_WHEN_SPENT,
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
            "--max-priority, "
            "--parent, --description, --ordering, --min-runtime-preempt, --min-runtime-reclaim, --budget, "
            "--budget-when-spent, --user-gpus, --user-workloads, --file"
        )
    q = client().update_queue(name, body)
    console.print(f"queue {q['name']} updated")
    print_warnings(q)


@queue_app.command("delete")
def queue_delete(name: str) -> None:
    """Delete a queue that has no pending or running work and no child queues.

    Finished work keeps its queue's name."""
    q = client().delete_queue(name)
    console.print(f"queue {name} deleted")
    print_warnings(q)
