"""Trace loaders: each public trace format becomes a list of `TraceJob`s (see docs/simulator.md).

Formats: `philly` (Microsoft Philly, as in the Pollux artifact), `tiresias` (Tiresias' simulator input),
`alibaba-openb` (Alibaba PAI 2023 pod list), `helios` (SenseTime Helios / Shanghai AI Lab Acme job logs)
and `csv` (generic: submit_time, duration, num_gpus, queue, optional gpu_model and user).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpupool.sim.errors import SimError
from gpupool.sim.input_files import MIB, models_field, number_field, read_rows, whole_field

MAX_WINDOW_S = 1e12  # seconds (31,700 years) from 1970 or the start: a --window bound beyond is a typo


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
    """A loaded trace. `skipped` and `adjusted` count the whole file's rows until `select` narrows them to
    the rows submitted inside its selection (what `--window` and `--first` replay)."""

    format: str
    path: Path
    jobs: list[TraceJob]
    dated: bool  # submit times are seconds since the epoch (a --window may use dates)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows left out
    # how the replay runs rows otherwise than they read -> rows so run (`adjusted_note`)
    adjusted: dict[str, int] = field(default_factory=dict)
    # every row left out, and every row adjusted, as (its submit time, the reason): what `select` counts
    skipped_rows: list[tuple[float, str]] = field(default_factory=list)
    adjusted_rows: list[tuple[float, str]] = field(default_factory=list)


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
    row: dict[str, str], columns: tuple[str, str], path: Path, line: int, submit: float, left: LeftOut
) -> tuple[float, float] | None:
    """(GPUs, duration) of a public trace's row, or None for a row it records but that never ran on GPUs
    (noted in `left`: no GPUs, no run time, or a negative figure of the logs' own making)."""
    gpus_column, duration_column = columns
    gpus = gpu_count(row, gpus_column, path, line)
    duration = number_field(row, duration_column, path, line)
    if gpus < 0 or duration < 0:
        left.append((submit, f"a negative {gpus_column if gpus < 0 else duration_column}"))
    elif gpus == 0:
        left.append((submit, "no GPUs"))
    elif duration == 0:
        left.append((submit, "no run time"))
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


LeftOut = list[tuple[float, str]]  # rows left out (or adjusted): (submit time, reason)


def _counts(rows: LeftOut) -> dict[str, int]:
    """Reason -> rows, of rows noted as (submit time, reason)."""
    counts: dict[str, int] = {}
    for _, reason in rows:
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def _trace(fmt: str, path: Path, jobs: list[TraceJob], dated: bool, left: LeftOut,
           adjusted: LeftOut | None = None) -> Trace:  # fmt: skip
    adjusted = adjusted or []
    return Trace(fmt, path, jobs, dated, _counts(left), _counts(adjusted), left, adjusted)


# -- formats --------------------------------------------------------------------------------------------


def load_philly(path: Path) -> Trace:
    drafts: list[tuple[float, float, float, str]] = []  # submit, duration, GPUs, queue: numbered once sorted
    left: LeftOut = []
    required = ("timestamp", "duration", "num_gpus", "cluster")
    for line, row in enumerate(read_rows(path, "philly", required), start=2):
        submit = _time(row, "timestamp", path, line)
        counts = _public_counts(row, ("num_gpus", "duration"), path, line, submit, left)
        if counts is None:
            continue
        gpus, duration = counts
        drafts.append((submit, duration, gpus, row["cluster"].strip() or "default"))
    drafts.sort(key=_submit_of)  # stable: the file's order among jobs submitted at one moment, as _by_submit
    jobs = [
        TraceJob(i, submit, duration, gpus, queue) for i, (submit, duration, gpus, queue) in enumerate(drafts)
    ]
    return _trace("philly", path, jobs, True, left)


def _submit_of(draft: tuple[float, float, float, str]) -> float:
    return draft[0]


def load_tiresias(path: Path) -> Trace:
    jobs: list[TraceJob] = []
    left: LeftOut = []
    for line, row in enumerate(read_rows(path, "tiresias", ("num_gpu", "submit_time", "duration")), start=2):
        submit = number_field(row, "submit_time", path, line)
        counts = _public_counts(row, ("num_gpu", "duration"), path, line, submit, left)
        if counts is None:
            continue
        gpus, duration = counts
        jobs.append(TraceJob(len(jobs), submit, duration, gpus, "default", user=row.get("model_name", "")))
    return _trace("tiresias", path, _by_submit(jobs), False, left)


OPENB_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")


def openb_gpus(row: dict[str, str], path: Path, line: int) -> tuple[float, str | None]:
    """A pod's GPUs (`gpu_milli` / 1000 of one GPU when below 1000 with `num_gpu` 1, else `num_gpu`), or 0
    and why it has none: "no GPUs", or "a negative num_gpu" (or gpu_milli), a figure the logs got wrong.
    A fraction above 1 is an error (`gpu_count`)."""
    num_gpu = gpu_count(row, "num_gpu", path, line)
    milli = number_field(row, "gpu_milli", path, line)
    if num_gpu < 0 or milli < 0:
        return 0.0, f"a negative {'num_gpu' if num_gpu < 0 else 'gpu_milli'}"
    if num_gpu == 0 or milli == 0:
        return 0.0, "no GPUs"
    return (milli / 1000.0 if num_gpu == 1 and milli < 1000 else num_gpu), None


def load_alibaba_openb(path: Path) -> Trace:
    """Pods with creation and deletion times run as jobs: a fraction of a GPU when gpu_milli < 1000."""
    jobs: list[TraceJob] = []
    left: LeftOut = []
    required = (*OPENB_POD_COLUMNS, "creation_time", "deletion_time")
    for line, row in enumerate(read_rows(path, "alibaba-openb", required), start=2):
        created = number_field(row, "creation_time", path, line)
        gpus, why_not = openb_gpus(row, path, line)
        if why_not is not None:
            left.append((created, why_not))
            continue
        if not (row.get("deletion_time") or "").strip():
            left.append((created, "no deletion time"))
            continue
        deleted = number_field(row, "deletion_time", path, line)
        scheduled_raw = (row.get("scheduled_time") or "").strip()
        began = number_field(row, "scheduled_time", path, line) if scheduled_raw else created
        if deleted <= began:
            left.append((created, "no run time" if deleted == began else "a negative run time"))
            continue
        cpu_milli = number_field(row, "cpu_milli", path, line)
        memory_mib = number_field(row, "memory_mib", path, line)
        if cpu_milli < 0 or memory_mib < 0:
            left.append((created, f"a negative {'cpu_milli' if cpu_milli < 0 else 'memory_mib'}"))
            continue
        jobs.append(
            TraceJob(
                len(jobs),
                created,
                deleted - began,
                gpus,
                (row.get("qos") or "").strip() or "default",
                user=row["name"].strip(),
                gpu_models=models_field(row, "gpu_spec", path, line),
                nodes=1,
                cpus=cpu_milli / 1000.0,
                memory_bytes=int(memory_mib * MIB),
            )
        )
    return _trace("alibaba-openb", path, _by_submit(jobs), False, left)


# The engine runs a job of node_num pods as node_num pods of the same size: gpu_num rounded up to a multiple.
HELIOS_UNEVEN = (
    "gpu_num not a multiple of node_num; each runs as node_num pods of gpu_num / node_num GPUs rounded "
    "up, more GPUs than the row asks for (gpu_num 3 on node_num 2: 2 pods x 2 GPUs)"
)


def load_helios(path: Path) -> Trace:
    """Helios (HeliosData) and Acme (AcmeTrace) job logs: submit_time, duration, gpu_num, vc, user."""
    jobs: list[TraceJob] = []
    left: LeftOut = []
    adjusted: LeftOut = []
    dated = False
    for line, row in enumerate(
        read_rows(path, "helios", ("submit_time", "duration", "gpu_num", "vc")), start=2
    ):
        submit = _time(row, "submit_time", path, line)
        counts = _public_counts(row, ("gpu_num", "duration"), path, line, submit, left)
        if counts is None:
            continue
        gpus, duration = counts
        has_nodes = bool((row.get("node_num") or "").strip())
        nodes = whole_field(row, "node_num", path, line, "nodes") if has_nodes else 0
        if nodes < 0:
            left.append((submit, "a negative node_num"))
            continue
        raw = (row.get("submit_time") or "").strip()
        dated = dated or not raw.replace(".", "", 1).isdigit()
        nodes = nodes if nodes > 1 else 0
        if nodes and gpus % nodes:
            adjusted.append((submit, HELIOS_UNEVEN))
        jobs.append(
            TraceJob(
                len(jobs),
                submit,
                duration,
                gpus,
                row["vc"].strip() or "default",
                user=(row.get("user") or "").strip(),
                nodes=nodes,
                cpus=number_field(row, "cpu_num", path, line) if (row.get("cpu_num") or "").strip() else 0.0,
            )
        )
    return _trace("helios", path, _by_submit(jobs), dated, left, adjusted)


def load_csv(path: Path) -> Trace:
    jobs: list[TraceJob] = []
    left: LeftOut = []
    for line, row in enumerate(
        read_rows(path, "csv", ("submit_time", "duration", "num_gpus", "queue")), start=2
    ):
        submit = _seconds(row, "submit_time", path, line)
        gpus = _not_negative(gpu_count(row, "num_gpus", path, line), "num_gpus", path, line, "GPUs")
        duration = number_field(row, "duration", path, line)
        duration = _not_negative(duration, "duration", path, line, "seconds of run time")
        if gpus == 0 or duration == 0:
            left.append((submit, "no GPUs" if gpus == 0 else "no run time"))
            continue
        jobs.append(
            TraceJob(
                len(jobs),
                submit,
                duration,
                gpus,
                row["queue"].strip() or "default",
                user=(row.get("user") or "").strip(),
                gpu_models=models_field(row, "gpu_model", path, line),
            )
        )
    return _trace("csv", path, _by_submit(jobs), False, left)


def _seconds(row: dict[str, str], column: str, path: Path, line: int) -> float:
    """A csv trace's time: seconds (from the trace's start, or since 1970); a date says where dates go."""
    try:
        return number_field(row, column, path, line)
    except SimError:
        raw = (row.get(column) or "").strip()
        if raw[4:5] != "-":
            raise
        raise SimError(
            "--trace",
            f"{path} line {line}: {column} {raw!r} is not a number: a csv trace's times are seconds; for "
            "date-times use the helios format (--trace helios:FILE, columns submit_time, duration, gpu_num, "
            "vc), or convert them to seconds",
        ) from None


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
    """`START..END`: seconds (finite, at most MAX_WINDOW_S either side of 0), or dates/date-times
    (`2017-10-02..2017-10-09`) for dated traces; END after START."""
    start_raw, sep, end_raw = value.partition("..")
    if not sep or not start_raw.strip() or not end_raw.strip():
        raise SimError("--window", f"{value!r} is not START..END; e.g. --window 2017-10-02..2017-10-09")
    bounds = []
    for raw in (start_raw, end_raw):
        try:
            seconds = float(raw)
        except ValueError:
            pass
        else:
            if not abs(seconds) <= MAX_WINDOW_S:  # also NaN
                raise SimError(
                    "--window",
                    f"{raw.strip()!r} in {value!r} is not a time: give seconds between -1e12 and 1e12, "
                    "or a date (YYYY-MM-DD)",
                )
            bounds.append(seconds)
            continue
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
    if end == start:
        raise SimError("--window", f"{value!r} is empty: END must be after START")
    if end < start:
        raise SimError("--window", f"{value!r} ends before it starts")
    return start, end


def select(trace: Trace, window: str | None = None, first: int | None = None) -> tuple[list[TraceJob], float]:
    """The jobs submitted in the window (or the first N), and the window's start (time zero). The trace's
    `skipped` and `adjusted` then count the rows submitted in that selection only: in the window, and with
    `first` up to the moment of the last job taken (rows of that very moment all count)."""
    jobs = trace.jobs
    origin = jobs[0].submit if jobs else 0.0
    low, high = -math.inf, math.inf  # the selection's submit times, [low, high)
    if window is not None:
        low, high = parse_window(window, trace.dated)
        jobs = [j for j in jobs if low <= j.submit < high]
        origin = low
    if first is not None:
        if first <= 0:
            raise SimError("--first", f"{first} must be a positive number of jobs")
        if first < len(jobs):
            high = math.nextafter(jobs[first - 1].submit, math.inf)
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
    trace.skipped = _counts([r for r in trace.skipped_rows if low <= r[0] < high])
    trace.adjusted = _counts([r for r in trace.adjusted_rows if low <= r[0] < high])
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
