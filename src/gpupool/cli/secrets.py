"""`gpupool secret set|list|delete`: values kept on the head for your work's environment (spec `secrets`)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from gpupool.cli.app import app, client
from gpupool.cli.errors import CliError
from gpupool.cli.render import JSON_HELP, console, print_json

secret_app = typer.Typer(help="Your secrets: values your work gets in its environment (spec secrets).")
app.add_typer(secret_app, name="secret")


@secret_app.command("set")
def secret_set(
    name: str = typer.Argument(..., help="its name, which is also the environment variable's (HF_TOKEN)"),
    from_file: Path | None = typer.Option(
        None, "--from-file", help="read the value from this file (default: stdin, or a hidden prompt)"
    ),
) -> None:
    """Make or replace a secret (its value from stdin, a hidden prompt or --from-file).

    The value comes from stdin (`echo $TOKEN | gpupool secret set HF_TOKEN`),
    a hidden prompt, or --from-file; never from the command line, where shell history would keep it.
    Work started after gets the new value."""
    if from_file is not None:
        try:
            value = from_file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"--from-file {from_file}: cannot read it ({exc})") from None
    elif sys.stdin.isatty():
        value = typer.prompt(f"value of {name}", hide_input=True)
    else:
        value = sys.stdin.read()
    value = value.removesuffix("\n").removesuffix("\r")  # what echo and editors add
    if not value:
        raise CliError(f"the secret {name} would be empty; give its value on stdin or with --from-file")
    row = client().set_secret(name, value)
    console.print(f"set the secret {escape(row['name'])} of {escape(row['owner'])}", highlight=False)


@secret_app.command("list")
def secret_list(
    owner: str | None = typer.Option(None, "--owner", help="another user's (admin)"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Your secrets' names and when each was set; never their values.

    One the head cannot decrypt (its
    key is not in the head's key file) is marked unreadable, with the reason: work that needs it fails."""
    rows = client().secrets(owner)
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no secrets; make one with `gpupool secret set NAME`")
        return
    table = Table(box=None, header_style="bold")
    table.add_column("NAME")
    table.add_column("SET (UTC)")
    unreadable = [row for row in rows if row.get("unreadable")]
    if unreadable:
        table.add_column("NOTE")
    for row in rows:
        cells = [escape(row["name"]), (row["updated_at"] or "")[:19].replace("T", " ")]
        if unreadable:
            cells.append("[red]unreadable[/red]" if row.get("unreadable") else "")
        table.add_row(*cells)
    console.print(table)
    for row in unreadable:  # the reason names the key it needs and the fix
        console.print(f"{escape(row['name'])}: {escape(row['unreadable'])}", highlight=False)


@secret_app.command("delete")
def secret_delete(name: str = typer.Argument(..., help="the secret's name")) -> None:
    """Delete a secret: work that names it fails when it next starts, saying so."""
    row = client().delete_secret(name)
    console.print(f"deleted the secret {escape(row['name'])}", highlight=False)
