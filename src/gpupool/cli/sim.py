"""`gpupool sim`: replay cluster traces through gpupool's own scheduler (docs/simulator.md).

`run` compares policies on a trace, `place` measures GPU fragmentation on pod lists, `whatif` (sim_whatif.py)
replays the live cluster's recent history (read through the API) on a changed cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from gpupool.cli.render import console, err_console, folding_table, print_error, print_warnings
from gpupool.sim.errors import SimError
from gpupool.spec import SpecError
from gpupool.spec.quantities import parse_duration

MIN_CYCLE_S = 1.0  # the shortest --cycle accepted (shorter ones were quietly raised to it before)

sim_app = typer.Typer(
    help="Trace-driven simulator: compare scheduling policies, measure fragmentation, plan capacity.",
    no_args_is_help=True,
)


@contextlib.contextmanager
def sim_errors() -> Iterator[None]:
    """A bad input is one readable line on stderr and exit code 1, like every other CLI error."""
    try:
        yield
    except SimError as exc:
        print_error(exc)
        raise typer.Exit(1) from None


def seconds(value: str, flag: str) -> float:
    try:
        return parse_duration(value, flag)
    except SpecError as exc:
        raise SimError(flag, f"{value!r} {exc.message}; e.g. 60s, 30m, 1h") from None


def _cycle_seconds(value: str) -> float:
    cycle = seconds(value, "--cycle")
    if cycle < MIN_CYCLE_S:
        raise SimError("--cycle", f"{value!r} is shorter than the shortest cycle, 1s; e.g. --cycle 60s")
    return cycle


@contextlib.contextmanager
def _progress(enabled: bool, unit: str = "jobs") -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    progress = Progress(
        TextColumn("[bold]{task.description:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    )
    with progress:
        yield progress


def check_outputs(json_out: Path | None, report: Path | None = None) -> None:
    """Refuse an output that could not be written before the replay, not after it: its folder is made now
    (as writing would make it), and must be writable; a file must not be a folder; plots need matplotlib."""
    if json_out is not None:
        if json_out.is_dir():
            example = json_out / "sim.json"
            raise SimError("--json", f"{json_out} is a folder; give a file name, e.g. {example}")
        _writable_folder(json_out.parent, "--json")
        _writable_file(json_out, "--json")
    if report is not None:
        from gpupool.sim.report import check_plotting

        check_plotting()
        if report.exists() and not report.is_dir():
            raise SimError("--report", f"{report} is a file; give a folder for the report")
        _writable_folder(report, "--report")


def _writable_file(path: Path, flag: str) -> None:
    """Open the file as writing it would (a folder's permissions do not tell all: root, a read-only or
    pseudo file system); one made only to ask is removed again."""
    existed = path.exists()
    try:
        with path.open("a"):
            pass
    except OSError as exc:
        raise SimError(flag, f"cannot write {path}: {exc.strerror or exc}") from None
    if not existed:
        path.unlink(missing_ok=True)


def _writable_folder(folder: Path, flag: str) -> None:
    for above in (folder, *folder.parents):  # the nearest that exists: mkdir's "File exists" hides which
        if above.exists():
            if not above.is_dir():
                raise SimError(flag, f"{above} is a file, not a folder; give {flag} a path in a folder")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimError(flag, f"cannot create {folder}: {exc.strerror or exc}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SimError(flag, f"cannot write into {folder}: permission denied")


def write_json(path: Path, data: Any) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        raise SimError("--json", f"cannot write {path}: {exc.strerror}") from None


def wide() -> Console:
    """The stdout console, or one wide enough for the comparison table when stdout is not a terminal."""
    return console if console.is_terminal else Console(width=170, soft_wrap=True, emoji=False)


def _print_figures(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    out = wide()
    for i, table in enumerate(_figures(title, columns, rows, out.width)):
        if i:
            out.print()
        out.print(table)


def _figures(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> list[Table]:
    """Figures by policy (each row: the policy's name, then its figures under `columns[1:]`) as tables
    `width` columns wide in which no figure is cut (Rich alone cuts `0.35` to `0.…` in a narrow terminal):
    one row a policy where every figure fits whole, headers wrapping between words; else turned, one row a
    figure and one column a policy, in as many tables one under the other as it takes."""
    needs = [_widest([*(row[i] for row in rows), *header.split()]) for i, header in enumerate(columns)]
    if sum(needs) + len(columns) - 1 <= width:  # one space between columns, as a tight folding_table has
        return [_figure_table(title, columns, rows)]
    room = width - _widest([*columns[1:], *columns[0].split()])  # what the labels leave
    parts: list[list[Sequence[str]]] = [[]]
    used = 0
    for row in rows:
        need = 1 + _widest([*row[1:], *row[0].split()])  # a name wider than the room folds, a figure never
        if parts[-1] and used + need > room:
            parts.append([])
            used = 0
        parts[-1].append(row)
        used += need
    return [
        _figure_table(
            title if i == 0 else "",
            [columns[0], *(row[0] for row in part)],
            [[label, *(row[j] for row in part)] for j, label in enumerate(columns[1:], start=1)],
        )
        for i, part in enumerate(parts)
    ]


def _figure_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    """A folding_table in which every cell keeps its whole width and only headers wrap: names or labels
    in the first column, figures right-aligned in the others."""
    table = folding_table(columns)
    table.title = title or None
    for i, column in enumerate(table.columns):
        column.min_width = _widest([row[i] for row in rows])
        column.justify = "right" if i else "left"
        column.header = Text(columns[i])  # as written: a policy file's "[x]" or ":x:" is no markup
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def _widest(texts: Sequence[str]) -> int:
    return max((cell_len(t) for t in texts), default=1)


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f}"


# The eviction costs a replay models, the same in `sim run` and `sim whatif`.
RESTART_OVERHEAD = typer.Option(
    "60s", "--restart-overhead", help="paid by each job the replays evict and start again"
)
CHECKPOINT_INTERVAL = typer.Option(
    "30m",
    "--checkpoint-interval",
    help="a job the replays evict loses the work since its last checkpoint; 0 = none",
)


@sim_app.command("run")
def run(
    trace: str = typer.Option(
        ..., "--trace", help="FORMAT:PATH; formats philly, tiresias, alibaba-openb, helios, csv"
    ),
    cluster: str | None = typer.Option(
        None, "--cluster", help="64x8, 32x8:H100,32x8:A100, tiresias:n32g4.csv or alibaba-openb:NODES.csv"
    ),
    nodes: str | None = typer.Option(None, "--nodes", help="alibaba-openb:NODES.csv (instead of --cluster)"),
    window: str | None = typer.Option(
        None, "--window", help="START..END: dates (2017-10-02..2017-10-09) or seconds (0..86400)"
    ),
    first: int | None = typer.Option(None, "--first", help="only the first N jobs (after --window)"),
    queues: str = typer.Option(
        "auto", "--queues", help="auto (a quota per tenant) or a queue-spec YAML file"
    ),
    policy: str = typer.Option(
        "fifo,las,gpupool",
        "--policy",
        help=(
            "comma-separated: fifo, fifo-backfill, sjf-oracle, srtf-oracle, las, drf, gpupool, or the "
            "variants gpupool-bands, -usage, -estimate, -oracle, -las (docs/simulator.md); all: every one"
        ),
    ),
    seed: int = typer.Option(
        0, "--seed", help="recorded with the results; the replay itself is deterministic"
    ),
    cycle: str = typer.Option("60s", "--cycle", help="virtual time between periodic scheduler cycles"),
    restart_overhead: str = RESTART_OVERHEAD,
    checkpoint_interval: str = CHECKPOINT_INTERVAL,
    json_out: Path | None = typer.Option(None, "--json", help="write the figures as JSON to this file"),
    report: Path | None = typer.Option(
        None, "--report", help="write report.md and PNG plots into this folder"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
    jobs: str = typer.Option(
        "auto",
        "--jobs",
        help="policies replayed at once, each in its own process; auto: one per policy, at most one per CPU",
    ),
) -> None:
    """Replay a trace window through each policy and compare JCT, fairness, quotas and utilization."""
    from gpupool.sim import experiment as ex
    from gpupool.sim.queues import quota_warnings
    from gpupool.sim.report import unfinished
    from gpupool.sim.results import SimOptions
    from gpupool.sim.trace import adjusted_note

    with sim_errors():
        options = SimOptions(
            cycle=_cycle_seconds(cycle),
            restart_overhead=seconds(restart_overhead, "--restart-overhead"),
            checkpoint_interval=seconds(checkpoint_interval, "--checkpoint-interval"),
            seed=seed,
        )
        exp = ex.prepare(trace, cluster, nodes, window, first, queues, policy, options, jobs)
        check_outputs(json_out, report)
        console.print(
            escape(
                f"{ex.counted(len(exp.jobs), 'job')} from {exp.trace.path} on "
                f"{ex.counted(exp.cluster.gpus, 'GPU')} ({ex.counted(len(exp.cluster.nodes), 'node')}), "
                f"{ex.counted(len(exp.queues), 'queue')}"
            ),
            highlight=False,
        )
        if (note := ex.left_out(exp)) is not None:
            console.print(escape(note), highlight=False)
        # accepted, as the server accepts them, but what the rows or quotas say is not what the replay does
        warnings = [f"--trace: {note}"] if (note := adjusted_note(exp.trace)) is not None else []
        warnings += [f"--queues: {said}" for said in quota_warnings(exp.queues, exp.cluster.gpus)]
        print_warnings({"warnings": warnings})
        with _progress(not quiet) as bar:
            tasks: dict[str, Any] = {}
            if bar is not None:
                for p in exp.policies:
                    tasks[p.name] = bar.add_task(escape(p.name), total=len(exp.jobs))

            def advance(name: str, done: int, total: int) -> None:
                if bar is not None:
                    bar.update(tasks[name], completed=done, total=total)

            ex.run(exp, advance)
        _print_figures("policies side by side (times in hours)", *_summary(exp))
        if (note := ex.dropped(exp)) is not None:
            console.print(escape(note), highlight=False)
        print_warnings({"warnings": unfinished(exp)})  # figures of fewer jobs than the table's neighbours
        data = ex.as_json(exp)
        if json_out is not None:
            write_json(json_out, data)
            console.print(escape(f"figures written to {json_out}"), highlight=False)
        if report is not None:
            from gpupool.sim.report import write_report

            path = write_report(exp, report)
            console.print(escape(f"report written to {path}"), highlight=False)


def _summary(exp: Any) -> tuple[list[str], list[list[str]]]:
    """The columns and rows of the policies side by side; `vs fifo` (each policy's average JCT over
    fifo's) only where fifo ran."""
    from gpupool.sim.experiment import summary_rows

    against = "fifo" in exp.metrics
    columns = ["policy", "avg JCT", *(["vs fifo"] if against else []), "p50", "p99", "slowdown", "queued",
               "util", "Jain", "quota viol.", "preempt.", "dropped", "wall s"]  # fmt: skip
    rows = []
    for row in summary_rows(exp):
        ratio = row["vs_fifo"]
        rows.append(
            [
                row["policy"],
                _hours(row["avg_jct_s"]),
                *([f"{ratio:.2f}" if ratio is not None else "-"] if against else []),
                _hours(row["p50_jct_s"]),
                _hours(row["p99_jct_s"]),
                "-" if row["mean_slowdown"] is None else f"{row['mean_slowdown']:.2f}",
                _hours(row["avg_queue_s"]),
                f"{row['gpu_util']:.1%}",
                f"{row['jain']:.3f}",
                f"{row['quota_violation']:.2%}",
                str(row["preemptions"]),
                str(row["dropped"]),
                f"{row['wall_s']:.1f}",
            ]
        )
    return columns, rows


MAX_STOP = 10.0  # x capacity: pods are drawn with replacement, so a larger stop only costs time


@sim_app.command("place")
def place(
    trace: str = typer.Option(..., "--trace", help="alibaba-openb:PODS.csv (the pod list)"),
    nodes: str | None = typer.Option(None, "--nodes", help="alibaba-openb:NODES.csv (the node list)"),
    cluster: str | None = typer.Option(None, "--cluster", help="or a cluster spec such as 100x8:V100"),
    policy: str = typer.Option(
        "binpack,spread,fragmentation",
        "--policy",
        help="placements, comma-separated: binpack, spread, fragmentation",
    ),
    seed: int = typer.Option(42, "--seed", help="seed of the random draw of pods"),
    stop: float = typer.Option(1.3, "--stop", help="stop when arrived GPU demand reaches this x capacity"),
    json_out: Path | None = typer.Option(None, "--json", help="write the figures as JSON to this file"),
    report: Path | None = typer.Option(
        None, "--report", help="write a PNG of allocation against demand here"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
) -> None:
    """Fragmentation: place randomly drawn pods with no departures; allocated share at 100% demand (FGD)."""
    from gpupool.sim import experiment as ex
    from gpupool.sim import place as pl
    from gpupool.sim.cluster import load_cluster

    with sim_errors():
        if (nodes is None) == (cluster is None):
            raise SimError(
                "--nodes", "give the node list (--nodes alibaba-openb:NODES.csv) or --cluster, one of them"
            )
        if not 1.0 <= stop <= MAX_STOP:  # NaN fails too
            raise SimError(
                "--stop",
                f"{stop} must be from 1.0 (the figure is taken at 100% demand) to {MAX_STOP:g}; "
                "e.g. 1.3 (130%)",
            )
        built = load_cluster(nodes or cluster or "", "--nodes" if nodes else "--cluster")
        if built.gpus <= 0:
            raise SimError("--nodes", "the cluster has no GPUs")
        placements = [p.strip() for p in policy.split(",") if p.strip()]
        if not placements:
            raise SimError("--policy", f"no placement given; one or more of {', '.join(pl.PLACEMENTS)}")
        for name in placements:
            if name not in pl.PLACEMENTS:
                raise SimError("--policy", f"unknown placement {name!r}; one of {', '.join(pl.PLACEMENTS)}")
        pods = pl.load_pods(trace)
        check_outputs(json_out, report)
        drawn = pl.draw(pods, built.gpus, seed, stop)
        console.print(
            f"{ex.counted(len(drawn), 'pod')} drawn (seed {seed}) from a list of "
            f"{ex.counted(len(pods), 'pod')}, onto {ex.counted(built.gpus, 'GPU')} "
            f"({ex.counted(len(built.nodes), 'node')})",
            highlight=False,
        )
        results: dict[str, Any] = {}
        with _progress(not quiet, "pods") as bar:
            for name in placements:
                # One `decide` call places the whole draw and reports nothing on the way: the bar pulses,
                # with the time taken so far, until that call returns (fragmentation: the longest).
                task = bar.add_task(name, total=None) if bar is not None else None
                results[name] = pl.place(drawn, built, name)
                if bar is not None and task is not None:
                    bar.update(task, total=len(drawn), completed=len(drawn))
        columns = ["policy", "alloc ratio at 100%", "at end", "pods placed", "GPU pods failed", "wall s"]
        rows = [
            [name, f"{r['alloc_ratio_at_100']:.2%}", f"{r['alloc_ratio_at_end']:.2%}",
             f"{r['pods_placed']:,}/{r['pods_drawn']:,}", str(r["gpu_pods_failed"]), f"{r['wall_s']:.1f}"]
            for name, r in results.items()
        ]  # fmt: skip
        _print_figures("GPU allocation when arrived demand reached 100% of capacity", columns, rows)
        data = {"trace": trace, "nodes": built.spec, "gpus": built.gpus, "seed": seed, "stop": stop,
                "policies": results}  # fmt: skip
        if json_out is not None:
            write_json(json_out, data)
            console.print(escape(f"figures written to {json_out}"), highlight=False)
        if report is not None:
            from gpupool.sim.report import write_place_plot

            console.print(
                escape(f"plot written to {write_place_plot(results, report, stop)}"), highlight=False
            )


# `whatif` registers on sim_app as it is imported, after `run` and `place`: `gpupool sim --help`'s order.
from gpupool.cli import sim_whatif as _sim_whatif  # noqa: E402, F401  (registers `gpupool sim whatif`)
