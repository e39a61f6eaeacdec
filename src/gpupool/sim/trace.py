"""Trace loaders: each public trace format becomes a list of `TraceJob`s (see docs/simulator.md).

Formats: `philly` (Microsoft Philly, as in the Pollux artifact), `tiresias` (Tiresias' simulator input),
`alibaba-openb` (Alibaba PAI 2023 pod list), `helios` (SenseTime Helios / Shanghai AI Lab Acme job logs)
and `csv` (generic: submit_time, duration, num_gpus, queue, optional gpu_model and user).
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpupool.sim.errors import SimError

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace, in the simulator's units (seconds, GPUs, bytes)."""

    id: int
    submit: float  # seconds: since the epoch (UTC) for dated traces, else since the trace's start
    duration: float  # seconds of run time on the GPUs it asks for
    gpus: float  # GPUs in all; a fraction (< 1) of one shared GPU for alibaba-openb pods
    queue: str  # the tenant: Philly/Helios virtual cluster, openb QoS class, csv queue
    user: str = ""
    gpu_models: tuple[str, ...] = ()  # acceptable GPU models; () = any
    nodes: int = 0  # pods (one per node) when the trace says; 0 = derived from the cluster's node size
    cpus: float = 0.0  # CPU cores per pod
    memory_bytes: int = 0  # memory per pod
    preemptible: bool = True  # whether the scheduler may evict it (a live job's spec says, `sim whatif`)

    @property
    def gpu_time(self) -> float:
        return self.gpus * self.duration


@dataclass(slots=True)
class Trace:
    format: str
    path: Path
    jobs: list[TraceJob]
    dated: bool  # submit times are seconds since the epoch (a --window may use dates)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows left out
    # how the replay runs rows otherwise than they read -> rows so run (`adjusted_note`)
    adjusted: dict[str, int] = field(default_factory=dict)


def adjusted_note(trace: Trace) -> str | None:
    """The rows a replay runs otherwise than they read, and how: "2 rows of x.csv: gpu_num not a multiple
    of node_num: ..." (one clause a reason)."""
    if not trace.adjusted:
        return None
    return "; ".join(
        f"{n:,} row{'' if n == 1 else 's'} of {trace.path.name}: {reason}"
        for reason, n in sorted(trace.adjusted.items(), key=lambda r: -r[1])
    )


Loader = Callable[[Path], Trace]
FORMAT_HELP = "philly, tiresias, alibaba-openb, helios, csv"


def parse_trace_arg(value: str) -> tuple[str, Path]:
    """`FORMAT:PATH` -> (format, path); the format must be known."""
    fmt, sep, path = value.partition(":")
    if not sep or not path:
        raise SimError("--trace", f"{value!r} is not FORMAT:PATH; e.g. --trace philly:traces/philly.csv")
    if fmt not in LOADERS:
        raise SimError(
            "--trace", f"unknown trace format {fmt!r}; one of {FORMAT_HELP} (e.g. --trace philly:philly.csv)"
        )
    return fmt, Path(path)


def load_trace(value: str) -> Trace:
    fmt, path = parse_trace_arg(value)
    return LOADERS[fmt](path)


# -- reading --------------------------------------------------------------------------------------------


def read_rows(
    path: Path, fmt: str, required: tuple[str, ...], flag: str = "--trace"
) -> Iterator[dict[str, str]]:
    try:
        handle = path.open(
            newline="", encoding="utf-8-sig"
        )  # a spreadsheet's byte-order mark is not a column
    except FileNotFoundError:
        raise SimError(flag, f"{path}: no such file; check the path after '{fmt}:'") from None
    except OSError as exc:
        raise SimError(flag, f"cannot read {path}: {exc.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        try:
            yield from _checked_rows(reader, path, fmt, required, flag)
        except UnicodeDecodeError:
            # the text is decoded a block at a time, so the error does not know its line: look for it
            with path.open("rb") as raw:
                raise SimError(flag, not_utf8(path, raw)) from None
        except csv.Error as exc:
            where = f"{path} line {reader.line_num + 1}"  # the row it could not read follows the last read
            if "field limit" in str(exc):
                raise SimError(
                    flag,
                    f"{where}: a field longer than {csv.field_size_limit():,} characters: a quote "
                    '(") left open takes in every line after it; close it, or is this not a CSV file?',
                ) from None
            raise SimError(flag, f"{where}: not CSV ({exc})") from None


def _checked_rows(
    reader: csv.DictReader[str], path: Path, fmt: str, required: tuple[str, ...], flag: str
) -> Iterator[dict[str, str]]:
    header = [h.strip() for h in reader.fieldnames or []]
    missing = [c for c in required if c not in header]
    if missing:
        raise SimError(
            flag,
            f"{path} is not in the {fmt} format: missing column(s) {', '.join(missing)} "
            f"(it needs {', '.join(required)}; see docs/simulator.md)",
        )
    reader.fieldnames = header
    for row in reader:
        if None in row.values():  # csv's filler for the columns a short row lacks
            missing = [c for c in header if row[c] is None]
            raise SimError(
                flag,
                f"{path} line {reader.line_num}: no {', '.join(missing)} (the row has "
                f"{len(header) - len(missing)} fields, the header {len(header)}); complete or delete it",
            )
        yield row


UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")  # what a spreadsheet's "Unicode text" begins with


def read_text(path: Path, flag: str) -> str:
    """A whole file as UTF-8 text (a byte-order mark dropped); OSError is the caller's to word."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SimError(flag, not_utf8(path, data.splitlines(keepends=True))) from None


def not_utf8(path: Path, lines: Iterable[bytes]) -> str:
    """What is wrong with a file that is not UTF-8, at its first line that is not: "b.csv line 3: not UTF-8
    text (byte 0xe9 at column 12); save it as UTF-8"."""
    for number, line in enumerate(lines, start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            byte = f"byte 0x{line[exc.start]:02x} at column {exc.start + 1}"
            if number == 1 and line.startswith(UTF16_MARKS):
                converted = path.with_name(f"{path.stem}-utf8{path.suffix}")
                return (
                    f"{path} line 1: not UTF-8 text ({byte}: the file is UTF-16); save it as UTF-8, "
                    f"e.g. iconv -f UTF-16 -t UTF-8 {path} > {converted}"
                )
            return f"{path} line {number}: not UTF-8 text ({byte}); save it as UTF-8"
    return f"{path}: not UTF-8 text; save it as UTF-8"


def number_field(row: dict[str, str], column: str, path: Path, line: int, flag: str = "--trace") -> float:
    raw = (row.get(column) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise SimError(flag, f"{path} line {line}: {column} {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SimError(flag, f"{path} line {line}: {column} is {raw!r}; it must be a finite number")
    return value


def gpu_count(row: dict[str, str], column: str, path: Path, line: int) -> float:
    """A number of GPUs: whole GPUs, or a fraction below 1 (a share of one GPU). Whether a negative one is an
    error or a row to leave out is the format's to say."""
    value = number_field(row, column, path, line)
    if value > 1 and not value.is_integer():
        raise SimError(
            "--trace",
            f"{path} line {line}: {column} {value:g} is a fraction above 1; give whole GPUs (a fraction is "
            "meaningful only below 1: a share of one GPU)",
        )
    return value


def _not_negative(value: float, column: str, path: Path, line: int, unit: str) -> float:
    """A figure of a user's own csv: negative is an error there (0 leaves the row out, as in a public
    trace, where a negative figure is a row the logs got wrong: `_public_counts`)."""
    if value < 0:
        raise SimError(
            "--trace",
            f"{path} line {line}: {column} {value:g} is negative; give 0 or more {unit} "
            "(a row of 0 is left out)",
        )
    return value


def _public_counts(
    row: dict[str, str], columns: tuple[str, str], path: Path, line: int, skipped: dict[str, int]
) -> tuple[float, float] | None:
    """(GPUs, duration) of a public trace's row, or None for a row it records but that never ran on GPUs
    (counted in `skipped`: no GPUs, no run time, or a negative figure of the logs' own making)."""
    gpus_column, duration_column = columns
    gpus = gpu_count(row, gpus_column, path, line)
    duration = number_field(row, duration_column, path, line)
    if gpus < 0 or duration < 0:
        _skip(skipped, f"a negative {gpus_column if gpus < 0 else duration_column}")
    elif gpus == 0:
        _skip(skipped, "no GPUs")
    elif duration == 0:
        _skip(skipped, "no run time")
    else:
        return gpus, duration
    return None


def _time(row: dict[str, str], column: str, path: Path, line: int) -> float:
    """A time column: seconds, or a date-time (`YYYY-MM-DD HH:MM:SS`, UTC)."""
    raw = (row.get(column) or "").strip()
    looks_dated = raw[4:5] == "-"  # asked first: a failed parse costs as much as one that works
    for parse in (parse_timestamp, float) if looks_dated else (float, parse_timestamp):
        try:
            value = parse(raw)
        except ValueError:
            continue
        if not math.isfinite(value):
            raise SimError("--trace", f"{path} line {line}: {column} is {raw!r}; it must be a finite time")
        return value
    raise SimError(
        "--trace", f"{path} line {line}: {column} {raw!r} is neither seconds nor YYYY-MM-DD HH:MM:SS"
    )


EPOCH = dt.datetime(1970, 1, 1)


def parse_timestamp(raw: str) -> float:
    """`YYYY-MM-DD[ HH:MM[:SS]]` (UTC unless it says otherwise) -> seconds since the epoch."""
    stamp = dt.datetime.fromisoformat(raw.strip())
    if stamp.tzinfo is not None:
        return stamp.timestamp()
    # what .replace(tzinfo=UTC).timestamp() gives, at a third of the cost (the Philly trace has 82,000)
    return (stamp - EPOCH).total_seconds()


def _skip(skipped: dict[str, int], reason: str) -> None:
    skipped[reason] = skipped.get(reason, 0) + 1


# -- formats --------------------------------------------------------------------------------------------


def load_philly(path: Path) -> Trace:
    drafts: list[tuple[float, float, float, str]] = []  # submit, duration, GPUs, queue: numbered once sorted
    skipped: dict[str, int] = {}
    required = ("timestamp", "duration", "num_gpus", "cluster")
    for line, row in enumerate(read_rows(path, "philly", required), start=2):
        counts = _public_counts(row, ("num_gpus", "duration"), path, line, skipped)
        if counts is None:
            continue
        gpus, duration = counts
        submit = _time(row, "timestamp", path, line)
        drafts.append((submit, duration, gpus, row["cluster"].strip() or "default"))
    drafts.sort(key=_submit_of)  # stable: the file's order among jobs submitted at one moment, as _by_submit
    jobs = [
        TraceJob(i, submit, duration, gpus, queue) for i, (submit, duration, gpus, queue) in enumerate(drafts)
    ]
    return Trace("philly", path, jobs, dated=True, skipped=skipped)


def _submit_of(draft: tuple[float, float, float, str]) -> float:
    return draft[0]


def load_tiresias(path: Path) -> Trace:
    jobs: list[TraceJob] = []
    skipped: dict[str, int] = {}
    for line, row in enumerate(read_rows(path, "tiresias", ("num_gpu", "submit_time", "duration")), start=2):
        counts = _public_counts(row, ("num_gpu", "duration"), path, line, skipped)
        if counts is None:
            continue
        gpus, duration = counts
        submit = number_field(row, "submit_time", path, line)
        jobs.append(TraceJob(len(jobs), submit, duration, gpus, "default", user=row.get("model_name", "")))
    return Trace("tiresias", path, _by_submit(jobs), dated=False, skipped=skipped)


OPENB_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")


def load_alibaba_openb(path: Path) -> Trace:
    """Pods with creation and deletion times run as jobs: a fraction of a GPU when gpu_milli < 1000."""
    jobs: list[TraceJob] = []
    skipped: dict[str, int] = {}
    required = (*OPENB_POD_COLUMNS, "creation_time", "deletion_time")
    for line, row in enumerate(read_rows(path, "alibaba-openb", required), start=2):
        num_gpu = number_field(row, "num_gpu", path, line)
        milli = number_field(row, "gpu_milli", path, line)
        if num_gpu <= 0 or milli <= 0:
            _skip(skipped, "no GPUs")
            continue
        created = number_field(row, "creation_time", path, line)
        if not (row.get("deletion_time") or "").strip():
            _skip(skipped, "no deletion time")
            continue
        deleted = number_field(row, "deletion_time", path, line)
        scheduled_raw = (row.get("scheduled_time") or "").strip()
        began = number_field(row, "scheduled_time", path, line) if scheduled_raw else created
        if deleted <= began:
            _skip(skipped, "no run time")
            continue
        gpus = milli / 1000.0 if num_gpu == 1 and milli < 1000 else num_gpu
        jobs.append(
            TraceJob(
                len(jobs),
                created,
                deleted - began,
                gpus,
                (row.get("qos") or "").strip() or "default",
                user=row["name"].strip(),
                gpu_models=_models(row.get("gpu_spec", "")),
                nodes=1,
                cpus=number_field(row, "cpu_milli", path, line) / 1000.0,
                memory_bytes=int(number_field(row, "memory_mib", path, line) * MIB),
            )
        )
    return Trace("alibaba-openb", path, _by_submit(jobs), dated=False, skipped=skipped)


def _models(spec: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in spec.split("|") if m.strip())


# The engine runs a job of node_num pods as node_num pods of the same size: gpu_num rounded up to a multiple.
HELIOS_UNEVEN = (
    "gpu_num not a multiple of node_num; each runs as node_num pods of gpu_num / node_num GPUs rounded "
    "up, more GPUs than the row asks for (gpu_num 3 on node_num 2: 2 pods x 2 GPUs)"
)


def load_helios(path: Path) -> Trace:
    """Helios (HeliosData) and Acme (AcmeTrace) job logs: submit_time, duration, gpu_num, vc, user."""
    jobs: list[TraceJob] = []
    skipped: dict[str, int] = {}
    adjusted: dict[str, int] = {}
    dated = False
    for line, row in enumerate(
        read_rows(path, "helios", ("submit_time", "duration", "gpu_num", "vc")), start=2
    ):
        counts = _public_counts(row, ("gpu_num", "duration"), path, line, skipped)
        if counts is None:
            continue
        gpus, duration = counts
        raw = (row.get("submit_time") or "").strip()
        dated = dated or not raw.replace(".", "", 1).isdigit()
        node_num = number_field(row, "node_num", path, line) if (row.get("node_num") or "").strip() else 0.0
        nodes = int(node_num) if node_num > 1 else 0
        if nodes and gpus % nodes:
            _skip(adjusted, HELIOS_UNEVEN)
        jobs.append(
            TraceJob(
                len(jobs),
                _time(row, "submit_time", path, line),
                duration,
                gpus,
                row["vc"].strip() or "default",
                user=(row.get("user") or "").strip(),
                nodes=nodes,
                cpus=number_field(row, "cpu_num", path, line) if (row.get("cpu_num") or "").strip() else 0.0,
            )
        )
    return Trace("helios", path, _by_submit(jobs), dated=dated, skipped=skipped, adjusted=adjusted)


def load_csv(path: Path) -> Trace:
    jobs: list[TraceJob] = []
    skipped: dict[str, int] = {}
    for line, row in enumerate(
        read_rows(path, "csv", ("submit_time", "duration", "num_gpus", "queue")), start=2
    ):
        gpus = _not_negative(gpu_count(row, "num_gpus", path, line), "num_gpus", path, line, "GPUs")
        duration = number_field(row, "duration", path, line)
        duration = _not_negative(duration, "duration", path, line, "seconds of run time")
        if gpus == 0 or duration == 0:
            _skip(skipped, "no GPUs" if gpus == 0 else "no run time")
            continue
        jobs.append(
            TraceJob(
                len(jobs),
                number_field(row, "submit_time", path, line),
                duration,
                gpus,
                row["queue"].strip() or "default",
                user=(row.get("user") or "").strip(),
                gpu_models=_models(row.get("gpu_model") or ""),
            )
        )
    return Trace("csv", path, _by_submit(jobs), dated=False, skipped=skipped)


def _by_submit(jobs: list[TraceJob]) -> list[TraceJob]:
    """The jobs in submit order (the file's order among jobs submitted at one moment), numbered in it."""
    ordered = sorted(jobs, key=lambda j: (j.submit, j.id))
    return [j if j.id == i else replace(j, id=i) for i, j in enumerate(ordered)]


LOADERS: dict[str, Loader] = {
    "philly": load_philly,
    "tiresias": load_tiresias,
    "alibaba-openb": load_alibaba_openb,
    "helios": load_helios,
    "csv": load_csv,
}


# -- selecting a window ---------------------------------------------------------------------------------


def parse_window(value: str, dated: bool) -> tuple[float, float]:
    """`START..END`: seconds, or dates/date-times (`2017-10-02..2017-10-09`) for dated traces."""
    start_raw, sep, end_raw = value.partition("..")
    if not sep or not start_raw.strip() or not end_raw.strip():
        raise SimError("--window", f"{value!r} is not START..END; e.g. --window 2017-10-02..2017-10-09")
    bounds = []
    for raw in (start_raw, end_raw):
        try:
            bounds.append(float(raw))
            continue
        except ValueError:
            pass
        if not dated:
            raise SimError(
                "--window",
                f"{raw!r}: this trace's times are seconds from its start; give seconds, e.g. 0..86400",
            )
        try:
            bounds.append(parse_timestamp(raw))
        except ValueError:
            raise SimError(
                "--window", f"{raw!r} is neither seconds nor a date (YYYY-MM-DD or 'YYYY-MM-DD HH:MM')"
            ) from None
    start, end = bounds
    if end <= start:
        raise SimError("--window", f"{value!r} ends before it starts")
    return start, end


def select(trace: Trace, window: str | None = None, first: int | None = None) -> tuple[list[TraceJob], float]:
    """The jobs submitted in the window (or the first N), and the window's start (time zero)."""
    jobs = trace.jobs
    origin = jobs[0].submit if jobs else 0.0
    if window is not None:
        start, end = parse_window(window, trace.dated)
        jobs = [j for j in jobs if start <= j.submit < end]
        origin = start
    if first is not None:
        if first <= 0:
            raise SimError("--first", f"{first} must be a positive number of jobs")
        jobs = jobs[:first]
    if not jobs and window is None:
        left = sum(trace.skipped.values())
        reasons = ", ".join(
            f"{n:,} with {reason}" for reason, n in sorted(trace.skipped.items(), key=lambda r: -r[1])
        )
        why = f" ({left:,} row{'' if left == 1 else 's'} left out: {reasons})" if left else ""
        raise SimError("--trace", f"{trace.path} has no jobs to replay{why}")
    if not jobs:
        span = ""
        if trace.jobs:  # where its jobs are, to aim the window at
            first_at, last_at = trace.jobs[0].submit, trace.jobs[-1].submit
            span = (
                f" (its jobs are submitted from {_moment(first_at, trace.dated)} to "
                f"{_moment(last_at, trace.dated)})"
            )
        if window is not None and trace.dated and trace.jobs and _in_seconds(window):
            # as a trace of seconds refuses dates (parse_window): numbers here are seconds since 1970
            day = dt.datetime.fromtimestamp(trace.jobs[0].submit, dt.UTC).date()
            raise SimError(
                "--window",
                f"no jobs selected from {trace.path}: this trace is dated, and {window!r} reads as seconds "
                f"since 1970-01-01 UTC{span}; give dates, e.g. --window {day}..{day + dt.timedelta(days=7)}",
            )
        raise SimError(
            "--window" if window is not None else "--trace",
            f"no jobs selected from {trace.path}{span}; move or widen it",
        )
    return jobs, origin


def _in_seconds(window: str) -> bool:
    """Whether both bounds of a `START..END` are numbers (seconds), not dates."""
    try:
        for raw in window.split(".."):
            float(raw)
    except ValueError:
        return False
    return True


def _moment(at: float, dated: bool) -> str:
    """A trace time as --window takes it: a UTC date-time for dated traces, else seconds."""
    if not dated:
        return f"{at:g}"
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M")
