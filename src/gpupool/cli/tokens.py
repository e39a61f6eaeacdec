"""`gpupool token create|list|revoke` (admin) and `gpupool whoami`: API tokens for people and scripts."""

from __future__ import annotations

import typer
from rich.table import Table

from gpupool.cli.app import app, client
from gpupool.cli.render import JSON_HELP, console, err_console, print_json

ROLES = ("admin", "user", "viewer")
token_app = typer.Typer(
    help="API tokens for people and scripts: admin, user (submits, changes its own work) or viewer (reads).",
    no_args_is_help=True,
)
app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(
    name: str = typer.Argument(..., help="who holds it, e.g. alice: the user of the work it submits"),
    role: str = typer.Option("user", "--role", help="admin, user or viewer"),
    queue: list[str] = typer.Option(
        [], "--queue", "-q", help="a user token submits only to these queues (repeatable; default any)"
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Make a token (admin): printed once; its holder sets GPUPOOL_TOKEN (and GPUPOOL_SERVER) to use it."""
    pool = client()
    row = pool.create_token(name, role, queue)
    if as_json:
        print_json(row)
        return
    where = f", queues {', '.join(row['queues'])}" if row["queues"] else ""
    console.print(f"token for {row['name']} (role {row['role']}{where}; shown once):", highlight=False)
    print(row["token"])
    err_console.print(  # the token once only (above, on stdout); the server as this CLI reached it
        f"give it to {row['name']}: export GPUPOOL_TOKEN=<the token above> GPUPOOL_SERVER={pool.server}",
        highlight=False,
    )


@token_app.command("list")
def token_list(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """The tokens by name and role (admin); never the tokens themselves."""
    rows = client().tokens()
    if as_json:
        print_json(rows)
        return
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "ROLE", "QUEUES", "CREATED"):
        table.add_column(column)
    for row in rows:
        created = (row["created_at"] or "")[:16].replace("T", " ")
        table.add_row(row["name"], row["role"], ", ".join(row["queues"]) or "any", created)
    console.print(table)


@token_app.command("revoke")
def token_revoke(name: str = typer.Argument(..., help="the token's name")) -> None:
    """Revoke a token (admin): it stops working at once.

    The admin token is replaced with
    `gpupool server --new-admin-token` instead."""
    row = client().revoke_token(name)
    console.print(f"revoked the token of {row['name']} (role {row['role']})", highlight=False)


@app.command()
def whoami(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Who your token says you are: name, role, and the queues you may submit to."""
    me = client().whoami()
    if as_json:
        print_json(me)
        return
    if me["role"] == "viewer":
        may = "reads everything, submits and changes nothing"
    else:
        may = "submits to " + (", ".join(me["queues"]) or "any queue")
    console.print(f"{me['name']} (role {me['role']}; {may})", highlight=False)
