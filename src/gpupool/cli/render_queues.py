"""How the CLI shows queues: `gpupool queues`' table, `gpupool queue show`'s lines, and what of a queue's
pending demand fair share does not count (also in `gpupool why`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.markup import escape
from rich.table import Table

from gpupool.cli.render import counted, folding_table, gpus
from gpupool.spec.quantities import format_figure

QUEUE_COLUMNS = (
    "NAME", "PARENT", "PRIO", "GPU QUOTA", "GPU LIMIT", "WEIGHT", "WEIGHT (NOW)", "FAIR SHARE", "GPUS ALLOC",
    "GPUS PEND", "RUN", "PEND",
)  # fmt: skip


def queues_table(queues: list[dict[str, Any]]) -> Table:
    """`gpupool queues`: a line per queue; a GPU-H BUDGET column when some queue has a budget. Short
    headers of short words (as squeue's and kubectl's) keep a line per queue from 100 columns."""
    budgets = any(q.get("budget") for q in queues)
    columns = (*QUEUE_COLUMNS, "GPU-H BUDGET") if budgets else QUEUE_COLUMNS
    names = {"NAME": [q["name"] for q in queues], "PARENT": [q["parent"] or "-" for q in queues]}
    table = folding_table(columns, names)
    for q in queues:
        gpu = q["resources"].get("gpu", {})
        limit = gpu.get("limit")
        budget = (_budget_cell(q["budget"], q.get("budget_spent_above")),) if budgets else ()
        table.add_row(
            q["name"],
            q["parent"] or "-",
            str(q["priority"]),
            f"{gpu.get('quota', 0):g}",
            "-" if limit is None else f"{limit:g}",
            f"{gpu.get('over_quota_weight', 1):g}",
            "-" if q.get("gpu_weight_now") is None else format_figure(q["gpu_weight_now"]),
            format_figure(q["fair_share"].get("gpu", 0)),
            f"{q['gpus_allocated']:g}"
            + (f" (+{below:g} below)" if (below := q.get("gpus_allocated_below")) else ""),
            f"{q['gpus_pending']:g}",
            str(q["running"]) + (f" (+{r} below)" if (r := q.get("running_below")) else ""),
            str(q["pending"]),
            *budget,
        )
    return table


def held_back_note(q: Mapping[str, Any]) -> str:
    """What of a queue's pending demand its fair share does not count: work the control loop holds back from
    the scheduler (a hold, a dependency, a backoff, a limit or a budget), and work that can never fit the
    pool; empty when none is."""
    held = q.get("gpus_held_back") or 0.0
    if not held:
        return ""
    share = "all" if held >= q["gpus_pending"] else f"{held:g}"
    return f" ({share} of them held back or never fitting, which fair share does not count)"


def queue_lines(q: Mapping[str, Any]) -> list[str]:
    """`gpupool queue show`: a head line, then a line per thing the queue sets or has (escaped markup)."""
    from gpupool.spec import format_duration  # quantities only: no pydantic for the CLI's start

    gpu = q["resources"].get("gpu", {})
    limit = gpu.get("limit")
    weight = f"{gpu.get('over_quota_weight', 1):g}"
    if q.get("gpu_weight_now") is not None and format_figure(q["gpu_weight_now"]) != weight:
        weight += f" (now {format_figure(q['gpu_weight_now'])})"
    head = (
        f"{q['name']}  GPU quota {gpu.get('quota', 0):g}  limit {'-' if limit is None else f'{limit:g}'}  "
        f"weight {weight}  priority {q['priority']}"
    )
    lines = [escape(head)]
    if q.get("description"):
        lines.append(f"  description: {escape(q['description'])}")
    if q.get("parent"):
        lines.append(f"  parent: {escape(q['parent'])}")
    for resource, unit in (("cpu", " CPUs"), ("memory", " bytes")):
        share = q["resources"].get(resource) or {}
        if share.get("quota") or share.get("limit") is not None:
            cap = "-" if share.get("limit") is None else f"{share['limit']:g}{unit}"
            lines.append(f"  {resource}: quota {share.get('quota', 0):g}{unit}, limit {cap}")
    fair = q["fair_share"].get("gpu", 0)
    lines.append(
        f"  now: {gpus(q['gpus_allocated'])} allocated, fair share {format_figure(fair)}; "
        f"{q['running']} running, {q['pending']} pending asking for {gpus(q['gpus_pending'])}"
        f"{held_back_note(q)}"
    )
    if q.get("gpus_allocated_below") or q.get("running_below"):
        lines.append(
            f"  the queues under it: {gpus(q['gpus_allocated_below'])} allocated, "
            f"{q['running_below']} running"
        )
    ordering = escape(q["ordering"]) if q.get("ordering") else "the server policy's"
    lines.append(f"  ordering: {ordering}")
    floors = [
        f"{format_duration(q[key])} before {kind}"
        for kind, key in (("preemption", "min_runtime_preempt"), ("reclaim", "min_runtime_reclaim"))
        if q.get(key)
    ]
    if floors:
        lines.append(f"  minimum runtime: {', '.join(floors)}")
    if q.get("budget"):
        budget = q["budget"]
        window = ""
        if budget.get("from") and budget.get("until"):
            window = f" ({budget['from'][:10]} to {budget['until'][:10]})"
        used = budget.get("used_gpu_hours")
        stops = budget.get("when_spent") == "stop"
        rule = "; when spent, running work stops too (when_spent: stop)" if stops else ""
        spent = ""
        if budget.get("spent"):
            spent = "; spent: its running work is stopped and waits" if stops else "; spent: new work waits"
        of = f"{format_figure(used)} of " if used is not None else ""
        lines.append(
            f"  budget: {of}{budget['gpu_hours']:g} GPU-hours a {budget['period']}{window}{rule}{spent}"
        )
    above = q.get("budget_spent_above")
    if above:
        waits = (
            "its running work is stopped and waits" if above.get("when_spent") == "stop" else "new work waits"
        )
        used = format_figure(above["used_gpu_hours"])
        lines.append(
            f"  under queue {above['queue']}'s budget, which is spent ({used} of {above['gpu_hours']:g} "
            f"GPU-hours a {above['period']}): {waits} until {above['until'][:16].replace('T', ' ')} UTC"
        )
    caps = q.get("user_limits") or {}
    if caps.get("gpus") is not None or caps.get("workloads") is not None:
        said = [
            gpus(caps["gpus"]) if caps.get("gpus") is not None else "",
            counted(caps["workloads"], "workload") if caps.get("workloads") is not None else "",
        ]
        lines.append(f"  each user at most: {', '.join(x for x in said if x)}")
    if q.get("max_priority") is not None:
        lines.append(f"  users' work at priority {q['max_priority']} at most (max_priority)")
    lines.append(f"  created {q['created_at']}, updated {q['updated_at']}")
    return lines


def _budget_cell(budget: Mapping[str, Any] | None, above: Mapping[str, Any] | None = None) -> str:
    """A queue's budget: GPU-hours used in this period (once the head counted them) of how many, per what;
    "-" with none, "- (nlp's spent)" under an ancestor's used budget."""
    if not budget:
        return f"- ({above['queue']}'s spent)" if above else "-"
    limit = f"{budget['gpu_hours']:g} a {budget['period']}"
    used = budget.get("used_gpu_hours")
    if used is None:
        return limit
    spent = ""
    if budget.get("spent"):
        spent = ", spent (running work stopped)" if budget.get("when_spent") == "stop" else ", spent"
    return f"{used:.3g} of {limit}{spent}" if used < 10 else f"{used:,.0f} of {limit}{spent}"
