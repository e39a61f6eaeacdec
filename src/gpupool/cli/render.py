"""How the CLI shows things: Rich tables for people, JSON for scripts. Queues' and usage's own tables are in
render_queues.py and render_usage.py."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

# A pipe or a file gets whole lines, as squeue's and kubectl's output does (`gpupool ps | grep running`
# finds a workload's whole row), not the 80 columns Rich assumes when it cannot ask a terminal; a
# terminal's own width, or $COLUMNS, is kept.
PIPE_WIDTH = 250


def _width(stream: TextIO) -> int | None:
    if os.environ.get("COLUMNS") or stream.isatty():
        return None
    return PIPE_WIDTH


# No emoji codes: what the CLI prints holds users' names and commands and Slurm's words, where ":b:" is text
# (a job named ':fire:' showed a flame, a Slurm reason "NtasksPerN:B:S:C" a letter in a box).
console = Console(soft_wrap=True, width=_width(sys.stdout), emoji=False)
err_console = Console(stderr=True, soft_wrap=True, width=_width(sys.stderr), emoji=False)


def print_error(message: object) -> None:
    """`error: MESSAGE` on stderr, one line. The message is printed as written: its brackets (an example
    such as `commands: [python train.py]`) are text, not Rich markup that would swallow them."""
    err_console.print(f"[red]error:[/red] {escape(str(message))}", highlight=False, soft_wrap=True)


def rank_hint(workload_id: int, reason: str, shown: int = 0) -> str | None:
    """Where to read the output of the gang rank whose end ended the attempt ("... (rank 1 on node-b exited
    with code 2)"), when it is not the rank shown: its traceback is in its own log, not rank 0's."""
    found = re.search(r"\brank (\d+) on ", reason)
    if found is None or int(found.group(1)) == shown:
        return None
    rank = int(found.group(1))
    return f"rank {rank} ended the attempt: its output is `gpupool logs {workload_id} --rank {rank}`"


def print_warnings(view: Mapping[str, Any]) -> None:
    """`warning: ...` on stderr for each of a view's `warnings` (what the head accepted but would not
    hold as the caller may think: a quota that is no guarantee, a node that has not joined)."""
    for warning in view.get("warnings") or ():
        err_console.print(escape(f"warning: {warning}"), highlight=False)


STATE_STYLE = {
    "pending": "yellow",
    "running": "cyan",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "ready": "green",
    "cordoned": "yellow",
    "draining": "yellow",
    "drained": "yellow",
    "unhealthy": "red",
    "lost": "red",
    "healthy": "green",
    "warning": "yellow",
}


JSON_HELP = "print the API's JSON instead of a table (for scripts and jq)"


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def human_age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m"
    if seconds < 86400:
        return f"{seconds // 3600:.0f}h{(seconds % 3600) // 60:02.0f}m"
    return f"{seconds // 86400:.0f}d{(seconds % 86400) // 3600:.0f}h"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}TiB"


def efficiency_line(attempt: Mapping[str, Any], now: datetime) -> str | None:
    """Slurm's seff in one line for an attempt of `gpupool show`: its GPUs x hours, mean utilization, peak
    memory; "no GPU telemetry" when none was recorded (never 0%); None for an attempt without GPUs."""
    pods = attempt.get("pods") or [attempt]
    gpus = sum(len(p.get("gpu_indices") or ()) * (p.get("gpu_fraction") or 1.0) for p in pods)
    if gpus <= 0:
        return None
    started, finished = attempt.get("started_at"), attempt.get("finished_at")
    seconds = 0.0
    if started:
        end = datetime.fromisoformat(finished) if finished else now
        seconds = max(0.0, (end - datetime.fromisoformat(started)).total_seconds())
    held = f"{counted(gpus, 'GPU')} x {human_age(seconds)}"
    mean = attempt.get("gpu_utilization_pct")
    if mean is None:
        return f"{held}, no GPU telemetry"
    peak, total = attempt.get("gpu_memory_peak_bytes"), attempt.get("gpu_memory_total_bytes")
    memory = f", peak memory {human_bytes(peak or 0)}" + (f" of {human_bytes(total)}" if total else "")
    so_far = " so far" if not finished else ""
    return f"{held}, mean utilization {mean:.0f}%{memory}{so_far}"


def counted(count: float, noun: str, digits: str = "g") -> str:
    """A count and its noun, plural but for one: "1 GPU", "0.5 GPUs", "3 workloads" (`digits`: its format,
    e.g. ".3g")."""
    shown = format(count, digits)
    return f"{shown} {noun}" if shown == "1" else f"{shown} {noun}s"


def gpus(count: float, digits: str = "g") -> str:
    """A count of GPUs in words: "1 GPU", "0.5 GPUs", "16 GPUs"."""
    return counted(count, "GPU", digits)


def styled(state: str) -> str:
    style = STATE_STYLE.get(state)
    return f"[{style}]{state}[/{style}]" if style else state


PS_COLUMNS = ("id", "name", "queue", "state", "gpus", "node", "age")
NODE_LIST_WIDTH = 24  # the most a NODE cell takes; a longer list is its first node and how many more


def node_list(nodes: Sequence[str]) -> str:
    """The nodes a workload runs on, for a narrow column, as Slurm's NODELIST writes them: "node-1",
    "node-[1-2]", "gpu-[01,03-04]"; where the names share no stem before a number, or the list would be
    wider than NODE_LIST_WIDTH, the first (rank 0's) and how many more: "node-1+3". "-" for none."""
    if not nodes:
        return "-"
    unique = list(dict.fromkeys(nodes))
    if len(unique) == 1:
        return unique[0]
    shortened = f"{unique[0]}+{len(unique) - 1}"
    numbered = [re.fullmatch(r"(.*?)(\d+)", name) for name in unique]
    stems = {found.group(1) for found in numbered if found is not None}
    if None in numbered or len(stems) != 1:
        return shortened
    digits = sorted((found.group(2) for found in numbered if found is not None), key=int)
    runs: list[list[str]] = []
    for number in digits:
        last = runs[-1][-1] if runs else None
        if last is not None and int(number) == int(last) + 1 and (len(number) == len(last) or last[0] != "0"):
            runs[-1].append(number)
        else:
            runs.append([number])
    ranges = ",".join(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)
    listed = f"{stems.pop()}[{ranges}]"
    return listed if len(listed) <= NODE_LIST_WIDTH else shortened


def ps_rows(workloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for w in workloads:
        gpus = w["gpus"]
        if (w.get("nodes") or 1) > 1:  # a gang: GPUs on each of its nodes (-N 2 --gpus 8 is 2x8, 16 GPUs)
            gpus = f"{w['nodes']}x{gpus}"
        if w.get("gpu_indices"):
            gpus = f"{gpus} [{','.join(str(i) for i in w['gpu_indices'])}]"
        rows.append(
            {
                "id": w["id"],
                "name": w["name"],
                "user": w.get("user"),
                "queue": w["queue"],
                "state": w["state"],
                "gpus": w["gpus"],
                "gpu_indices": w.get("gpu_indices", []),
                "node": w.get("node"),
                # every rank's node (a gang's), running or, once ended, where its last attempt ran
                "node_list": w.get("node_list") or ([w["node"]] if w.get("node") else []),
                "age": human_age(w.get("age_seconds", 0.0)),
                "age_seconds": w.get("age_seconds", 0.0),
                "reason": w.get("reason", ""),
                "reason_code": w.get("reason_code", ""),
                "exit_code": w.get("exit_code"),
                # a running service's readiness probe: true, false (and what the probe saw), null without
                "ready": w.get("ready"),
                "readiness": w.get("readiness"),
                "service_id": w.get("service_id"),
                "replica": w.get("replica", 0),
                "_gpus_text": gpus,
                # a service's replicas after the first: NAME#N (as `docker compose` numbers containers)
                "array_id": w.get("array_id"),
                "array_index": w.get("array_index"),
                "_name_text": member_name(w),
            }
        )
    return rows


def member_name(w: Mapping[str, Any]) -> str:
    """A service's replicas after the first: NAME#N (as `docker compose` numbers containers); a job array's
    tasks: NAME[INDEX] (as Slurm's squeue shows ID_[INDEX])."""
    if w.get("array_id") is not None:
        return f"{w['name']}[{w['array_index']}]"
    return f"{w['name']}#{w['replica']}" if w.get("replica") else str(w["name"])


class _WordWrappingTable(Table):
    """A table that, too wide for the terminal, narrows its widest columns so that headers wrap first,
    then cells, between words. Rich alone narrows the widest columns evenly and splits words ("ALLOCAT /
    ED"); here a word is split only when even the longest ones do not fit, with one space between
    columns (two where they fit, as in a wide terminal)."""

    _roomy: tuple[bool, bool] | None = None  # collapse_padding and pad_edge as made

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self._roomy is None:
            self._roomy = (self.collapse_padding, self.pad_edge)
        self.collapse_padding, self.pad_edge = self._roomy  # fitted afresh for each width rendered at
        _, right, _, left = self.padding
        room = options.max_width - (left + right) * len(self.columns)
        whole = [column.min_width or 1 for column in self.columns]
        # per column, the width of: its longest word, its widest cell, and its widest cell or header
        words: list[int] = []
        cells: list[int] = []
        widest: list[int] = []
        for column, kept in zip(self.columns, whole, strict=True):
            column.max_width = None  # fitted afresh for each width rendered at
            header = Measurement.get(console, options, column.header if self.show_header else "")
            sizes = [Measurement.get(console, options, cell) for cell in column.cells]
            words.append(max([kept, header.minimum, *(size.minimum for size in sizes)]))
            cells.append(max([words[-1], *(size.maximum for size in sizes)]))
            widest.append(max(cells[-1], header.maximum))
        if sum(words) > room and left + right > 1:
            # a word would be split (an 80-column terminal's `gpupool queues`: "PARE / NT"): one space
            # between columns, none at the edges
            self.collapse_padding, self.pad_edge = True, False
            room = options.max_width - max(right, left) * (len(self.columns) - 1)
        widths = list(widest)
        # headers wrap first, then cells; words fold only when even the longest do not fit, and the
        # names keep their width throughout
        for floors in (cells, words, whole):
            while sum(widths) > room:
                wider = [index for index, width in enumerate(widths) if width > floors[index]]
                if not wider:
                    break
                widths[max(wider, key=widths.__getitem__)] -= 1
        for column, width, high in zip(self.columns, widths, widest, strict=True):
            if width < high:
                column.max_width = width
        yield from super().__rich_console__(console, options)


def folding_table(columns: Sequence[str], whole: Mapping[str, Sequence[str]] | None = None) -> Table:
    """A table that folds, never cuts, in a narrow terminal: `whole` gives, for some columns, the values
    that keep their full width (names), so that only the other columns fold. Too wide for the terminal,
    it wraps headers and cells between words before it splits one."""
    table = _WordWrappingTable(box=None, header_style="bold")
    for column in columns:
        keep = (whole or {}).get(column, ())
        table.add_column(column, overflow="fold", min_width=max(map(len, keep), default=None))
    return table


def ps_table(workloads: list[dict[str, Any]], *, wide: bool = False) -> Table:
    """`gpupool ps`: a line per workload; a USER column after NAME when the work is more than one user's."""
    table = Table(box=None, header_style="bold")
    users = len({w.get("user") for w in workloads}) > 1
    columns = (*PS_COLUMNS[:2], "user", *PS_COLUMNS[2:]) if users else PS_COLUMNS
    for column in (*columns, "reason"):
        table.add_column(column.upper(), overflow="fold", max_width=70 if column == "reason" else None)
    for row in _fold_waiting_tasks(ps_rows(workloads)):
        shown = (
            wide or row["state"] in ("pending", "failed", "cancelled") or row.get("reason_code") == "stopping"
        )
        reason = row["reason"] if shown else ""
        if row["state"] in ("succeeded", "failed", "cancelled") and not reason:
            # its exit code; work that never ran has none: why it ended
            code = row["exit_code"]
            reason = f"exit {code}" if code is not None else row["reason"]
        if row["state"] == "running" and row.get("ready") is False and not reason:
            reason = f"not ready: {row['readiness']}"  # the head's proxy holds its requests back meanwhile
        cells = [row.get("_id_text") or str(row["id"]), row["_name_text"]]
        if users:
            cells.append(row["user"])
        cells += [
            row["queue"],
            styled(row["state"]),
            row["_gpus_text"],
            escape(node_list(row["node_list"])),
            row["age"],
        ]
        cells.append(reason)
        table.add_row(*cells)
    return table


FOLD_AT = 3  # pending tasks of one array, in a row and waiting for the same reason, shown as one line


def _fold_waiting_tasks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run of pending tasks of one job array that wait for the same reason as one row, as Slurm's
    squeue shows `12_[5-999]`: ids FIRST..LAST, name NAME[FIRST_INDEX..LAST_INDEX], the count in the
    reason. Everything else row by row."""
    folded: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []

    def close() -> None:
        if len(run) < FOLD_AT:
            folded.extend(run)
        else:
            first, last = run[0], run[-1]
            name = first["_name_text"].rpartition("[")[0]
            folded.append(
                {
                    **first,
                    "_id_text": f"{first['id']}..{last['id']}",
                    "_name_text": f"{name}[{first['array_index']}..{last['array_index']}]",
                    "reason": f"{len(run)} tasks: {first['reason']}",
                }
            )
        run.clear()

    for row in rows:
        same = (
            row["state"] == "pending"
            and row.get("array_id") is not None
            and (not run or (row["array_id"] == run[-1]["array_id"] and _waits_as(row) == _waits_as(run[-1])))
        )
        if not same:
            close()
        if row["state"] == "pending" and row.get("array_id") is not None:
            run.append(row)
        else:
            folded.append(row)
    close()
    return folded


_AHEAD = re.compile(r"; [0-9]+ workloads? ahead.*$")


def _waits_as(row: dict[str, Any]) -> str:
    """A pending row's reason less how many wait ahead of it, which differs task by task (the folded row
    keeps the first task's)."""
    return _AHEAD.sub("", str(row.get("reason") or ""))


def foreign_table(jobs: list[dict[str, Any]]) -> Table:
    """Jobs the backend runs outside gpupool (`gpupool ps --all`)."""
    table = Table(box=None, header_style="bold")
    for column in ("backend", "job", "name", "user", "state", "gpus/node", "nodes"):
        table.add_column(column.upper())
    for job in jobs:
        table.add_row(
            job["backend"],
            job["job_id"],
            job["name"],
            job["user"],
            job["state"],
            f"{job['gpus_per_node']:g}",
            ",".join(job["nodes"]),
        )
    return table


def ending_line(w: Mapping[str, Any]) -> str:
    """One line on how a workload ended (`wait`, `run --wait`, `logs -f`)."""
    state = w["state"]
    code = w.get("exit_code")
    said = f" with exit code {code}" if state == "failed" and code is not None else ""
    why = w.get("reason") or ""
    reason = f": {why}" if why and state != "succeeded" and why != f"exit code {code}" else ""
    name = member_name(w)
    return f"workload {w['id']} ({escape(name)}) {styled(state)}{said}{escape(reason)}"
