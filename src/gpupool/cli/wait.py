"""`gpupool wait` and `gpupool run|submit --wait`: block until work has ended and exit with how it ended, as
Slurm's `sbatch --wait` does, so that a script or a CI step can run a job and read its result.

Exit codes: 0 when every workload succeeded; else the highest exit code of those that failed (a lone job's
own; an array's highest over its tasks, as Slurm's `sbatch --wait`); 1 when none that failed has one
(cancelled, or failed before its command ran); 124 when `--timeout` passed first; 130 on Ctrl-C. Nothing is
cancelled by waiting less: the work goes on.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import Any, Final, NoReturn

import typer
from rich.markup import escape

from gpupool.cli import refs
from gpupool.cli.app import app, client, outage_note, stream_log
from gpupool.cli.errors import CliError
from gpupool.cli.render import ending_line, err_console, member_name
from gpupool.client import ApiError, Client, WaitTimeout
from gpupool.client.client import ride_out
from gpupool.spec import parse_duration

POLL: Final = 1.0  # seconds between looks at the workloads' states
TIMED_OUT: Final = 124  # as timeout(1)
INTERRUPTED: Final = 130  # 128 + SIGINT
SAY_WAITING: Final = 5.0  # seconds pending before `run --wait` says why its work waits


@app.command()
def wait(
    workloads: list[str] = typer.Argument(..., help=f"{refs.IDS_HELP}; an array's id or name: all its tasks"),
    timeout: str | None = typer.Option(
        None, "--timeout", help="give up after this long, e.g. 30m, 2h (exit 124; the work goes on)"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print nothing; only the exit code says"),
) -> None:
    """Wait until workloads end (Slurm's sbatch --wait, for work already submitted).

    Exit 0 when all succeeded, else the highest exit code of those that failed (1 when none has one:
    cancelled); 124 on --timeout, 130 on Ctrl-C (the work goes on)."""
    seconds = check_timeout(timeout)
    began = time.monotonic()
    c = client()
    try:  # the head may be restarting as the wait begins, as while it goes on: the same ride-out
        ids = ride_out(
            lambda: _members(c, refs.workload_refs(c, workloads, reading=True)),
            poll=POLL,
            deadline=None if seconds is None else began + seconds,
            on_outage=None if quiet else outage_note(c.server),
        )
    except WaitTimeout:
        if not quiet:
            err_console.print(f"--timeout {timeout} passed before the head answered; the work goes on")
        raise typer.Exit(TIMED_OUT) from None
    finish(c, ids, logs=False, timeout=timeout, quiet=quiet, began=began)


def check_timeout(timeout: str | None) -> float | None:
    """The seconds `--timeout` gives, refused (CliError) before anything is submitted when it is bad."""
    if timeout is None:
        return None
    try:
        seconds = parse_duration(timeout, "--timeout")
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if seconds <= 0:
        raise CliError(f"--timeout {timeout}: must be longer than 0, e.g. 30m")
    return seconds


def refuse_service(kind: str) -> None:
    if kind == "service":
        raise CliError(
            "--wait: a service runs until it is cancelled, so there is no end to wait for; drop --wait "
            "(follow its output with `gpupool logs -f ID`)"
        )


def finish(
    c: Client,
    ids: list[int],
    *,
    logs: bool,
    timeout: str | None,
    quiet: bool = False,
    began: float | None = None,
) -> NoReturn:
    """Wait for `ids` to end (printing the lone one's output as it comes when `logs`), say how each ended,
    and exit with the code the module docstring gives. `began`: when the wait began (time.monotonic(); by
    default now), from which `timeout` counts."""
    seconds = check_timeout(timeout)
    deadline = None if seconds is None else (time.monotonic() if began is None else began) + seconds
    try:
        if logs:
            # every attempt, from the first; work still pending after a few seconds says why
            ended = stream_log(c, ids[0], attempt=0, deadline=deadline, say_waiting=SAY_WAITING)
            done = _ended(c, ids, deadline, quiet=True) if ended else None
        else:
            done = _ended(c, ids, deadline, quiet=quiet)
    except KeyboardInterrupt:
        if not quiet:
            err_console.print(f"stopped waiting: {_named(ids)} (gpupool ps; gpupool cancel ...)")
        raise typer.Exit(INTERRUPTED) from None
    if done is None:
        if not quiet:
            err_console.print(f"--timeout {timeout} passed before the end: {_named(ids)}")
        raise typer.Exit(TIMED_OUT)
    if not quiet:
        for w in done:
            err_console.print(ending_line(w), highlight=False)
        if len(done) > 1:
            good = sum(1 for w in done if w["state"] == "succeeded")
            err_console.print(f"{good} of {len(done)} succeeded")
    raise typer.Exit(exit_code(done))


def exit_code(workloads: list[dict[str, Any]]) -> int:
    """0 when every one succeeded; else the highest exit code (1..255) of those that failed, as Slurm's
    `sbatch --wait` gives an array's; 1 when none that failed has one (cancelled, never ran)."""
    if all(w["state"] == "succeeded" for w in workloads):
        return 0
    codes = (w.get("exit_code") for w in workloads if w["state"] == "failed")
    return max((code for code in codes if isinstance(code, int) and 0 < code < 256), default=1)


def _members(c: Client, named: list[tuple[int, bool]]) -> list[int]:
    """The ids the (id, first task alone) pairs of `refs.workload_refs` stand for: an array's tasks by the
    array's id (unless named as its first task alone), else each itself (listed a thousand at a time; only
    an array's id is asked about alone, for its tasks); a service is refused (it never ends by itself)."""
    wanted = list(dict.fromkeys(i for i, _ in named))
    alone = {i for i, first_task in named if first_task}
    found: dict[int, dict[str, Any]] = {}
    for at in range(0, len(wanted), 1000):
        page = wanted[at : at + 1000]
        found.update((w["id"], w) for w in c.workloads(all=True, ids=page, limit=len(page)))
    ids: list[int] = []
    for workload_id in wanted:
        w = found.get(workload_id)
        if w is None:
            raise CliError(f"no workload with id {workload_id}; list them with `gpupool ps --all`")
        refuse_service(w["kind"])
        if w.get("array_id") == workload_id and workload_id not in alone:
            ids.extend(t["id"] for t in c.workload(workload_id).get("task_list") or ())
        else:
            ids.append(workload_id)
    return list(dict.fromkeys(ids))


def _ended(c: Client, ids: list[int], deadline: float | None, *, quiet: bool) -> list[dict[str, Any]] | None:
    """Every workload of `ids` once all have ended (in the order of `ids`), or None at the deadline; shows
    how many have ended while it waits (`Client.wait`)."""
    shown = not quiet and sys.stderr.isatty()
    said = _Reasons() if not quiet and not shown else None
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        with err_console.status("waiting", spinner="dots") if shown else _Silent() as status:

            def progress(ended: int, waiting: list[dict[str, Any]]) -> None:
                status.update(_progress(ended, len(ids), waiting))
                if said is not None:
                    said.saw(waiting[0])

            return c.wait(
                ids,
                timeout=timeout,
                poll=POLL,
                progress=progress,
                on_outage=None if quiet else outage_note(c.server),
            )
    except WaitTimeout:
        return None
    except ApiError as exc:
        raise CliError(exc.message) from exc


def _progress(ended: int, total: int, waiting: list[dict[str, Any]]) -> str:
    first = waiting[0]
    why = f": {first['reason']}" if first["state"] == "pending" and first.get("reason") else ""
    head = f"{ended} of {total} ended; " if total > 1 else ""
    return escape(f"{head}{first['id']} ({member_name(first)}) {first['state']}{why}")[:200]


def _named(ids: Iterable[int]) -> str:
    """What goes on running, in words."""
    listed = list(ids)
    if len(listed) == 1:
        return f"workload {listed[0]} goes on"
    return f"the {len(listed)} workloads go on"


class _Reasons:
    """Where stderr is no terminal (a CI log, a pipe) there is no status line to update: a line instead each
    time the first waiting workload waits pending for a new reason, so that work that waits, and why, is in
    the log ("57 (big) pending: can never fit this pool ...")."""

    def __init__(self) -> None:
        self.said = ""

    def saw(self, first: dict[str, Any]) -> None:
        why = first.get("reason") if first["state"] == "pending" else None
        if why and why != self.said:
            self.said = why
            err_console.print(escape(f"{first['id']} ({member_name(first)}) pending: {why}"), highlight=False)


class _Silent:
    """A status that shows nothing (not a terminal, or --quiet)."""

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def update(self, _: str) -> None:
        return None
