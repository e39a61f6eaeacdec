"""The `gpupool` command line: every command talks to the server through the SDK in gpupool.client.

Here: the Typer apps the commands register on, the global options, `client()`, and what several commands
share. Each themed module registers its commands as it is imported, at the end of this one.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import typer
from rich.markup import escape

from gpupool.cli.bench import bench_app
from gpupool.cli.render import JSON_HELP, err_console, rank_hint
from gpupool.cli.sim import sim_app
from gpupool.client import Client, WaitTimeout
from gpupool.client.client import RIDE_OUT, Outage, ride_out


def _flags_without_type() -> None:
    """Typer 0.29 labels an on/off flag `<bool>` in help, which reads as if it took a value (`--all true`);
    a flag shows no type, as in click's own help and in Slurm's man pages."""
    option = getattr(getattr(typer, "core", None), "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if option is None or shown is None or getattr(shown, "_gpupool", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if self.is_flag and self.metavar is None:
            return None
        return shown(self, ctx)  # type: ignore[no-any-return]

    display_type_rich._gpupool = True  # type: ignore[attr-defined]
    option.display_type_rich = display_type_rich


_flags_without_type()

app = typer.Typer(
    name="gpupool",
    help="gpupool: one shared, fairly scheduled GPU pool for AI work.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command's, as its subcommands inherit
)
node_app = typer.Typer(help="List and show nodes; take them in and out of service.", no_args_is_help=True)
queue_app = typer.Typer(
    help="List, show, create, change and delete queues (teams, projects).", no_args_is_help=True
)
app.add_typer(node_app, name="node")
app.add_typer(queue_app, name="queue")
app.add_typer(bench_app, name="bench")
app.add_typer(sim_app, name="sim")


class Options:
    server: str | None = None
    token: str | None = None


_options = Options()


def _version(asked: bool) -> None:
    if asked:
        from gpupool import __version__

        print(f"gpupool {__version__}")
        raise typer.Exit()


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
    version: bool = typer.Option(
        False, "--version", is_eager=True, help="print gpupool's version and exit", callback=_version
    ),
) -> None:
    _options.server, _options.token = server, token


def client() -> Client:
    return Client(_options.server, _options.token)


API_PAGE = 100_000  # the most workloads the API lists at once


def listing_aliases(group: typer.Typer, listing: Callable[[bool], None], what: str) -> None:
    """`gpupool GROUP list` and its hidden alias `ls`: the top-level `listing` (e.g. `gpupool nodes`) under
    the group, where people reach for it as for `kubectl get`."""

    def list_all(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
        listing(as_json)

    list_all.__doc__ = what
    group.command("list")(list_all)
    group.command("ls", hidden=True)(list_all)


def stream_log(
    c: Client,
    workload_id: int,
    *,
    attempt: int | None = None,
    rank: int = 0,
    follow: bool = True,
    deadline: float | None = None,
    say_unstarted: bool = False,
    say_waiting: float | None = None,
) -> bool:
    """Print a workload's output: the latest attempt's, or from `attempt` on. With `follow`, on as it comes
    until the workload ends, each later attempt's after the last (a retry, a restart after preemption).
    False when `deadline` (a time.monotonic() time) passed first. With `say_unstarted`, a workload that has
    not run yet is said so on stderr (rather than printing nothing). With `say_waiting` (seconds), work
    still pending after that long says why on stderr, and again whenever the reason changes (a wait that
    would otherwise print nothing: it may never fit, or its queue is at its limit)."""
    offset = 0
    chosen = attempt
    began, said_why = time.monotonic(), ""
    outage, note = Outage(), outage_note(c.server)
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        read = functools.partial(c.logs, workload_id, attempt=chosen, offset=offset, rank=rank)
        if not follow:
            chunk = read()
        else:  # the head restarting: the work and its output go on
            try:
                chunk = ride_out(read, deadline=deadline, on_outage=note, outage=outage)
            except WaitTimeout:
                return False
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
        if say_unstarted and chunk.get("no_log") and chunk.get("attempt_ended") and not chunk["data"]:
            say_unstarted = False  # its node could not start it: say why, rather than print nothing
            said = chunk.get("attempt_reason") or "it never ran"
            err_console.print(
                escape(f"attempt {chunk['attempt']} of workload {workload_id} has no output: {said}"),
                highlight=False,
            )
        why = chunk.get("reason") if chunk["state"] == "pending" else None
        if say_waiting is not None and why and why != said_why and time.monotonic() - began >= say_waiting:
            said_why = why
            err_console.print(escape(f"workload {workload_id} pending: {why}"), highlight=False)
        if chosen is None and chunk["attempt"] is not None:
            chosen = chunk["attempt"]
        offset = chunk["offset"]
        if chunk["data"]:
            sys.stdout.write(chunk["data"])
            sys.stdout.flush()
            continue  # the server sends a long log in chunks: read on until it has no more
        if not follow:
            _hint_rank(workload_id, chunk, rank)
            return True
        latest = chunk.get("latest_attempt")
        if chunk.get("attempt_ended") and chosen is not None and latest is not None and latest > chosen:
            chosen, offset = chosen + 1, 0  # read whole: the next attempt's output follows
            continue
        if chunk["eof"] and chunk["state"] != "pending":
            _hint_rank(workload_id, chunk, rank)
            return True  # the workload ended (a pending one waits for its next attempt)
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def _hint_rank(workload_id: int, chunk: dict[str, Any], shown: int) -> None:
    """Once an ended attempt's output is shown: where to read the rank that ended it, if another."""
    if chunk.get("attempt_ended"):
        hint = rank_hint(workload_id, chunk.get("attempt_reason") or "", shown)
        if hint is not None:
            err_console.print(escape(hint), highlight=False)


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


# Typer lists commands in the order they were registered: this order is `gpupool --help`'s (and `gpupool
# node --help`'s), not the alphabet's.
# isort: off
from gpupool.cli import submit as _submit  # noqa: E402, F401  (registers `gpupool submit|run`)
from gpupool.cli import workloads as _workloads  # noqa: E402, F401  (`gpupool ps|show|why|logs`)
from gpupool.cli import control as _control  # noqa: E402, F401  (`gpupool cancel|update|hold|...|scale`)
from gpupool.cli import access as _access  # noqa: E402, F401  (registers `gpupool ui|forward`)
from gpupool.cli import cordon as _cordon  # noqa: E402, F401  (`gpupool nodes`, `node list|cordon|...`)
from gpupool.cli import queues as _queues  # noqa: E402, F401  (`gpupool queues`, `queue list|show|...`)
from gpupool.cli import scheduling as _scheduling  # noqa: E402, F401  (registers `gpupool scheduling`)
from gpupool.cli import usage as _usage  # noqa: E402, F401  (registers `gpupool usage`)
from gpupool.cli import audit as _audit  # noqa: E402, F401  (registers `gpupool audit`)
from gpupool.cli import health as _health  # noqa: E402, F401  (`gpupool top|health`, `node show|inject-fault`)
from gpupool.cli import nodes as _nodes  # noqa: E402, F401  (registers `gpupool node join-token|drain`)
from gpupool.cli import secrets as _secrets  # noqa: E402, F401  (registers `gpupool secret ...`)
from gpupool.cli import tokens as _tokens  # noqa: E402, F401  (registers `gpupool token ...`, `whoami`)
from gpupool.cli import wait as _wait  # noqa: E402, F401  (registers `gpupool wait`)
# isort: on
