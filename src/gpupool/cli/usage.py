"""`gpupool usage`: GPU-hours used per queue, user, workload, node, model, day or outcome, and their cost."""

from __future__ import annotations

import sys

import typer

from gpupool.cli.app import app, client
from gpupool.cli.errors import CliError
from gpupool.cli.render import JSON_HELP, console, print_json, usage_table, write_usage_csv

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
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
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
