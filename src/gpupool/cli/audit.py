"""`gpupool audit`: the audit log (admin), who changed what and when (control/audit.py)."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from gpupool.cli.app import app, client
from gpupool.cli.render import console, print_json


@app.command()
def audit(
    since: str | None = typer.Option(
        None,
        "--since",
        help="from this time (2026-12-01, 2026-12-01T08:00) or this long before --until, else now (1d, 2h)",
    ),
    until: str | None = typer.Option(None, "--until", help="before this time, in the same forms"),
    kind: str | None = typer.Option(
        None, "--kind", help="only changes of: workload, attempt, node, queue, token, join-token"
    ),
    name: str | None = typer.Option(
        None,
        "--object",
        help="only this object (a queue's name, a workload's id, a node's name), with --kind",
    ),
    actor: str | None = typer.Option(None, "--actor", help="only changes made by this token's name"),
    limit: int = typer.Option(200, "--limit", "-n", help="the newest this many"),
    as_json: bool = typer.Option(False, "--json", help="as JSON, newest first"),
) -> None:
    """Who changed what, and when (admin).

    Workloads' and nodes' state changes, queues, tokens and join
    tokens made, changed or removed, oldest first (`--json`: newest first)."""
    rows = client().events(since=since, until=until, kind=kind, object=name, actor=actor, limit=limit)
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no changes match")
        return
    table = Table(box=None, header_style="bold")
    for column in ("AT (UTC)", "ACTOR", "KIND", "OBJECT", "CHANGE"):
        table.add_column(column, overflow="fold")
    for row in reversed(rows):
        state = f"{row['from'] or '-'} -> {row['to']}" if row["to"] and row["from"] != row["to"] else ""
        change = ": ".join(part for part in (state, row["change"]) if part)
        at = (row["at"] or "")[:19].replace("T", " ")
        table.add_row(at, escape(row["actor"]), row["kind"], escape(row["object"]), escape(change))
    console.print(table)
