"""`gpupool usage`: GPU-hours used per queue, user, workload, node, model, day or outcome, and their cost."""

from __future__ import annotations

import sys

import typer

from gpupool.cli.app import app, client
from gpupool.cli.errors import CliError
from gpupool.cli.render import JSON_HELP, console, print_json
from gpupool.cli.render_usage import usage_table, write_usage_csv

USAGE_GROUPS = ("queue", "user", "workload", "node", "model", "day", "outcome")
# Groupings in which one workload can fall in several lines (its attempts ended differently, ran on several
# nodes or models, or over midnight): their WORKLOADS column is not additive.
SPLIT_GROUPS = ("node", "model", "day", "outcome")
WORKLOADS_NOTE = (
    "WORKLOADS: a workload counts in each line its attempts fall in (one that failed, then succeeded, in "
    "both), so the lines can add up to more than TOTAL"
)


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
    user: list[str] | None = typer.Option(
        None,
        "--user",
        "-u",
        help="only the work this user submitted (repeatable, or comma separated: -u alice,bob; "
        "Slurm's sacct -u)",
    ),
    me: bool = typer.Option(False, "--me", help="only your own work (with --user: yours too)"),
    top: int = typer.Option(
        0, "--top", min=0, help="show only the first N lines (0: all); the total counts all"
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    as_csv: bool = typer.Option(False, "--csv", help="CSV for a spreadsheet: a line per row, no total"),
) -> None:
    """GPU-hours used per queue (or user, workload, node, ...), and what they cost.

    Per queue (or user, workload, node, GPU model, day, or how the attempts ended) over a window, priced
    with $GPUPOOL_HOME/prices.yaml: Slurm's sreport, Run:ai's consumption report. Counts the GPUs
    allocated, whether or not the programs used them; USED and UTIL weigh them by the mean GPU
    utilization their attempts' telemetry showed (Slurm's seff), "no telemetry" without it. WORKLOADS
    counts a workload in every line its attempts fall in (--by outcome: one that failed, then succeeded,
    is in both lines), so the lines can add up to more than TOTAL."""
    if by not in USAGE_GROUPS:
        raise CliError(f"--by {by}: not one of {', '.join(USAGE_GROUPS)}; e.g. --by queue")
    if as_json and as_csv:
        raise CliError("--json and --csv: give one of them")
    users = _users(user or [])
    c = client()
    if me:
        users.append(c.whoami()["name"])
    report = c.usage(since=since, until=until, by=by, queue=queue, users=users or None)
    if as_json:
        print_json(report)
        return
    if as_csv:
        write_usage_csv(report, sys.stdout)
        return
    table = usage_table(report, top)
    if by in SPLIT_GROUPS:
        table.caption = f"{table.caption}; {WORKLOADS_NOTE}"
    if report.get("users"):
        table.caption = f"{table.caption}. Only the work of {', '.join(report['users'])}"
    console.print(table)


def _users(given: list[str]) -> list[str]:
    """--user as given: repeated, comma separated, or both; an empty name is refused, not ignored."""
    names = [name.strip() for item in given for name in item.split(",")]
    if not all(names):
        raise CliError(f"--user {','.join(given)!r}: an empty name; give names such as --user alice,bob")
    return names
