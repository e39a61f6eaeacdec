"""`gpupool node join-token create|list|revoke` and `gpupool node drain [--rolling]` (node agents)."""

from __future__ import annotations

import time

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpupool.cli.app import client, node_app
from gpupool.cli.errors import CliError
from gpupool.cli.render import JSON_HELP, console, err_console, print_json, styled
from gpupool.client import Client
from gpupool.spec import SpecError, parse_duration

join_token_app = typer.Typer(help="Tokens that let node agents join the pool.", no_args_is_help=True)
node_app.add_typer(join_token_app, name="join-token")

POLL = 0.5  # seconds between looks at a draining node


@join_token_app.command("create")
def join_token_create(
    ttl: str = typer.Option("1h", "--ttl", help="how long it admits new agents: 30m, 1h, 7d, or never"),
    description: str = typer.Option("", "--description", help="what it is for (shown in list)"),
    gpus: int | None = typer.Option(
        None,
        "--gpus",
        help="GPUs each node joining with it has, as Slurm's configured Gres count: one that registers "
        "fewer is unhealthy (default: what each node first registers)",
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Create a join token; start agents with `gpupool agent --server URL --join-token TOKEN`."""
    if ttl != "never":
        try:
            parse_duration(ttl, "--ttl")
        except SpecError as exc:
            raise CliError(f"--ttl: {ttl!r} {exc.message}; e.g. --ttl 1h, or --ttl never") from exc
    row = client().create_join_token(ttl, description, gpus)
    if as_json:
        print_json(row)
        return
    console.print(f"join token (shown once; expires {row['expires_at'] or 'never'}):", highlight=False)
    print(row["token"])
    err_console.print(
        f"start an agent: gpupool agent --server {client().server} --join-token {row['token']}",
        highlight=False,
    )


@join_token_app.command("list")
def join_token_list(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Join tokens: prefix, state (valid, expired, revoked), expiry, how many nodes joined with each, and
    the GPUs it declares each has."""
    rows = client().join_tokens()
    if as_json:
        print_json(rows)
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "PREFIX", "STATE", "EXPIRES", "USES", "GPUS", "DESCRIPTION"):
        table.add_column(column)
    for r in rows:
        gpus = r.get("gpus")
        table.add_row(
            str(r["id"]), r["prefix"] + "...", r["state"], r["expires_at"] or "never", str(r["uses"]),
            "-" if gpus is None else str(gpus), r["description"],
        )  # fmt: skip
    console.print(table if rows else "no join tokens (create one with `gpupool node join-token create`)")


@join_token_app.command("revoke")
def join_token_revoke(
    ident: str = typer.Argument(..., help="the id or prefix `join-token list` shows"),
) -> None:
    """Revoke a join token: no new agent joins with it (nodes that joined keep their own credentials)."""
    row = client().revoke_join_token(ident)
    console.print(f"join token {row['id']} ({row['prefix']}...): {row['state']}")


@node_app.command("drain")
def node_drain(
    names: list[str] = typer.Argument(..., help="one or more node names"),
    rolling: bool = typer.Option(
        False, "--rolling", help="one node at a time: wait until its work runs again elsewhere first"
    ),
    reason: str | None = typer.Option(None, "--reason", help="why, shown in nodes and to waiting work"),
    timeout: str = typer.Option("30m", "--timeout", help="--rolling: give up on a node after this long"),
) -> None:
    """Stop placing work on nodes and move their work away (SIGTERM, grace period, resumed elsewhere)."""
    c = client()
    try:
        limit = parse_duration(timeout, "--timeout")
    except SpecError as exc:
        raise CliError(f"--timeout {timeout}: {exc}") from exc
    known = {n["name"] for n in c.nodes()}
    unknown = [name for name in names if name not in known]
    if unknown:  # before any is drained: all or none
        raise CliError(
            f"no node named {', '.join(map(repr, unknown))} (nodes: {', '.join(sorted(known)) or 'none'}); "
            "nothing was drained"
        )
    if not rolling:
        for name in names:
            n = c.drain(name, reason)
            console.print(f"node {n['name']}: {styled(n['state'])}; moving {len(n['workloads'])} workload(s)")
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=err_console,
    ) as progress:  # fmt: skip
        overall = progress.add_task("rolling drain", total=len(names))
        for name in names:
            n = c.drain(name, reason)
            moved = list(n["workloads"])
            task = progress.add_task(f"  {name}: moving {len(moved)} workload(s)", total=len(moved) or 1)
            deadline = time.monotonic() + limit
            while True:
                settled = _settled(c, name, moved)
                progress.update(task, completed=settled if moved else 1)
                if settled >= len(moved) and not _on_node(c, name):
                    break
                if time.monotonic() > deadline:
                    raise CliError(
                        f"node {name}: its work did not restart elsewhere within --timeout {timeout}; "
                        "see `gpupool ps` and `gpupool why ID`"
                    )
                time.sleep(POLL)
            progress.advance(overall)
            console.print(f"node {name}: drained; {len(moved)} workload(s) moved")


def _on_node(c: Client, name: str) -> list[int]:
    for n in c.nodes():
        if n["name"] == name:
            return list(n.get("workloads", []))
    return []


def _settled(c: Client, name: str, moved: list[int]) -> int:
    """How many of the moved workloads run again elsewhere, or ended."""
    done = 0
    for workload_id in moved:
        w = c.workload(workload_id)
        last = w["attempt_list"][-1] if w["attempt_list"] else None
        running_elsewhere = w["state"] == "running" and last is not None and name not in _nodes_of(last)
        if running_elsewhere or w["state"] in ("succeeded", "failed", "cancelled"):
            done += 1
    return done


def _nodes_of(attempt: dict[str, object]) -> set[str]:
    pods = attempt.get("pods") or [{"node": attempt.get("node")}]
    assert isinstance(pods, list)
    return {str(p["node"]) for p in pods}
