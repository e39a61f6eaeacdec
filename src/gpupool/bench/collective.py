"""Collective bandwidth in nccl-tests' terms: the operations, their byte counts, algbw/busbw, the table.

Pure (no torch): the runner in `collective_torch.py` measures; this module names, counts and prints.
Formulas and layout follow NVIDIA nccl-tests (doc/PERFORMANCE.md; src/common.cu, src/util.cu, and each
operation's GetCollByteCount/GetBw): algbw = S / t with S the bytes in the size column and t the mean time
of one operation; busbw = algbw x a factor of the operation and the rank count n, chosen so that busbw
compares with the hardware's peak bandwidth whatever n is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from gpupool.bench.errors import BenchError


@dataclass(frozen=True)
class DType:
    name: str  # nccl-tests' type name, printed in the `type` column: "float", "half", "bfloat16"
    torch_name: str  # attribute of the torch module: "float32", "float16", "bfloat16"
    size: int  # bytes per element


DTYPES: dict[str, DType] = {
    "float": DType("float", "float32", 4),
    "half": DType("half", "float16", 2),
    "bf16": DType("bfloat16", "bfloat16", 2),
    "double": DType("double", "float64", 8),
}
_DTYPE_ALIASES = {"float32": "float", "fp32": "float", "float16": "half", "fp16": "half", "bfloat16": "bf16"}


def parse_dtype(text: str) -> DType:
    key = _DTYPE_ALIASES.get(text.strip().lower(), text.strip().lower())
    if key not in DTYPES:
        raise BenchError(
            f"--dtype {text!r} is not one of {', '.join(DTYPES)} (also: float32, fp16, bfloat16)"
        )
    return DTYPES[key]


@dataclass(frozen=True)
class Counts:
    """Elements per rank for one size, as nccl-tests' GetCollByteCount gives them."""

    send: int  # elements each rank sends (its input buffer)
    recv: int  # elements each rank receives (its output buffer)
    param: int  # the `count` column: the count argument of the NCCL call


def _same(count: int, nranks: int) -> Counts:
    return Counts(count, count, count)


def _gather(count: int, nranks: int) -> Counts:
    per_rank = count // nranks
    return Counts(per_rank, per_rank * nranks, per_rank)


def _scatter(count: int, nranks: int) -> Counts:
    per_rank = count // nranks
    return Counts(per_rank * nranks, per_rank, per_rank)


def _alltoall(count: int, nranks: int) -> Counts:
    per_rank = count // nranks
    return Counts(per_rank * nranks, per_rank * nranks, per_rank)


@dataclass(frozen=True)
class Op:
    """One collective as nccl-tests measures it."""

    name: str  # --op value: "all_reduce"
    nccl_test: str  # the nccl-tests binary it compares with: "all_reduce_perf"
    redop: str  # the `redop` column: "sum" for reductions, else "none"
    root: int  # the `root` column: 0 for rooted operations, else -1
    counts: Callable[[int, int], Counts]  # (elements in the size, ranks) -> per-rank element counts
    bus_factor: Callable[[int], float]  # ranks -> busbw / algbw
    bus_formula: str  # the factor as people write it
    out_of_place: bool  # torch.distributed offers a form with separate input and output buffers
    in_place: bool  # ... and one where they are the same memory


OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op(
            "all_reduce",
            "all_reduce_perf",
            "sum",
            -1,
            _same,
            lambda n: 2 * (n - 1) / n,
            "2(n-1)/n",
            out_of_place=False,
            in_place=True,
        ),
        Op(
            "all_gather",
            "all_gather_perf",
            "none",
            -1,
            _gather,
            lambda n: (n - 1) / n,
            "(n-1)/n",
            out_of_place=True,
            in_place=True,
        ),
        Op(
            "reduce_scatter",
            "reduce_scatter_perf",
            "sum",
            -1,
            _scatter,
            lambda n: (n - 1) / n,
            "(n-1)/n",
            out_of_place=True,
            in_place=True,
        ),
        Op(
            "broadcast",
            "broadcast_perf",
            "none",
            0,
            _same,
            lambda n: 1.0,
            "1",
            out_of_place=False,
            in_place=True,
        ),
        Op("reduce", "reduce_perf", "sum", 0, _same, lambda n: 1.0, "1", out_of_place=False, in_place=True),
        Op(
            "alltoall",
            "alltoall_perf",
            "none",
            -1,
            _alltoall,
            lambda n: (n - 1) / n,
            "(n-1)/n",
            out_of_place=True,
            in_place=False,
        ),
        Op(
            "sendrecv",
            "sendrecv_perf",
            "none",
            -1,
            _same,
            lambda n: 1.0,
            "1",
            out_of_place=True,
            in_place=False,
        ),
    )
}
WHY_NOT_MEASURED = {
    "all_reduce": "out-of-place: torch.distributed.all_reduce reduces in place only",
    "broadcast": "out-of-place: torch.distributed.broadcast works in place only",
    "reduce": "out-of-place: torch.distributed.reduce works in place only",
    "alltoall": "in-place: all_to_all_single with one buffer for input and output is undefined",
    "sendrecv": "in-place: a rank receiving into the buffer it is sending from is undefined",
}


def parse_ops(text: str) -> list[Op]:
    """`all_reduce`, a comma list, or `all`."""
    names = [n.strip().lower().replace("-", "_") for n in text.split(",")]
    if names == ["all"]:
        return list(OPS.values())
    unknown = [n for n in names if n not in OPS]
    if unknown or not names:
        raise BenchError(f"--op {text!r}: give one of {', '.join(OPS)}, a comma list of them, or all")
    return [OPS[n] for n in dict.fromkeys(names)]


_SIZE = re.compile(r"^\s*(\d+)\s*([kKmMgG]?)[iI]?[bB]?\s*$")
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(text: str, flag: str) -> int:
    """Bytes, as nccl-tests reads -b/-e: 8, 1K, 128M, 1G (powers of 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise BenchError(f"{flag} {text!r} is not a size; write bytes like 8, 64K, 128M or 1G")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def size_steps(min_bytes: int, max_bytes: int, factor: int) -> Iterator[int]:
    """The sizes nccl-tests visits with -b min -e max -f factor."""
    if min_bytes < 1:
        raise BenchError("-b/--minbytes must be at least 1 byte")
    if max_bytes < min_bytes:
        raise BenchError(f"-e/--maxbytes ({max_bytes}) is smaller than -b/--minbytes ({min_bytes})")
    if factor < 2:
        raise BenchError(f"-f/--stepfactor must be 2 or more (got {factor})")
    size = min_bytes
    while size <= max_bytes:
        yield size
        size *= factor


@dataclass(frozen=True)
class Cell:
    """One measurement: out-of-place or in-place, one size."""

    time_us: float  # mean time of one operation, averaged over the ranks
    algbw: float  # GB/s (1e9 bytes per second): size / time
    busbw: float  # GB/s: algbw x the operation's bus factor
    wrong: int  # elements that differ from the expected result, summed over the ranks


@dataclass(frozen=True)
class Row:
    size: int  # bytes: the larger of a rank's input and output buffers
    count: int  # elements: the NCCL count argument
    type: str
    redop: str
    root: int
    out_of_place: Cell | None  # None: not measured (see WHY_NOT_MEASURED)
    in_place: Cell | None


@dataclass(frozen=True)
class Plan:
    """What one size measures: buffer sizes in elements and the columns it prints."""

    size: int
    counts: Counts


def plan_sizes(op: Op, dtype: DType, nranks: int, sizes: list[int]) -> tuple[list[Plan], list[int]]:
    """Sizes to measure and sizes skipped because they hold less than one element per rank."""
    plans, skipped = [], []
    for size in sizes:
        counts = op.counts(size // dtype.size, nranks)
        if counts.param == 0:
            skipped.append(size)
            continue
        plans.append(Plan(max(counts.send, counts.recv) * dtype.size, counts))
    return plans, skipped


def cell(op: Op, size: int, nranks: int, time_us: float, wrong: int) -> Cell:
    algbw = size / (time_us * 1e3) if time_us > 0 else 0.0  # bytes / (us * 1e3) = 1e9 bytes per second
    return Cell(time_us, algbw, algbw * op.bus_factor(nranks), wrong)


def avg_busbw(rows: list[Row]) -> float:
    """The mean busbw over every measured cell (out-of-place and in-place), as nccl-tests' footer."""
    values = [c.busbw for r in rows for c in (r.out_of_place, r.in_place) if c is not None]
    return sum(values) / len(values) if values else 0.0


# -- the nccl-tests text layout -----------------------------------------------------------------------------


def float_str(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: fewer decimals as the integer part grows, to keep the column width."""
    power, scale = 0, 1
    while value >= scale:
        power += 1
        scale *= 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    if power < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}"


def header_lines(
    op: Op,
    *,
    nranks: int,
    min_bytes: int,
    max_bytes: int,
    factor: int,
    warmup: int,
    iters: int,
    blocking: bool,
    backend: str,
    devices: list[str],
) -> list[str]:
    lines = [
        f"# gpupool bench collective: nccl-tests layout, torch.distributed backend {backend}, {nranks} ranks",
        f"# Collective test starting: {op.nccl_test}",
        f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: {factor}(factor) "
        f"warmup iters: {warmup} iters: {iters} agg iters: 1 validation: 1 graph: 0",
    ]
    if blocking:
        lines.append("# Blocking Enabled: wait for completion and barrier after each collective ")
    lines += ["#", "# Using devices", *devices]
    if op.name in WHY_NOT_MEASURED:
        lines.append(f"# N/A columns: {WHY_NOT_MEASURED[op.name]}")
    if nranks == 1:  # what the table measures (nccl-tests prints the same figures without saying so)
        meaning = (
            "busbw equals algbw (bus factor 1), and an in-place call moves no data"
            if op.bus_factor(1) > 0
            else "busbw is 0 by definition (bus factor 2(n-1)/n or (n-1)/n); time and algbw measure the call"
        )
        lines.append(f"# One rank: nothing crosses a bus; {meaning}")
    lines += [
        "#",
        f"# {'':>10s}  {'':>12s}  {'':>8s}  {'':>6s}  {'':>6s}           out-of-place"
        "                       in-place",
        _columns("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"),
        _columns("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""),
    ]
    return lines


def _columns(size: str, count: str, type_: str, redop: str, root: str, *cell: str) -> str:
    time, algbw, busbw, wrong = cell
    body = f"  {time:>7s}  {algbw:>6s}  {busbw:>6s}  {wrong:>6s}"
    return f"# {size:>10s}  {count:>12s}  {type_:>8s}  {redop:>6s}  {root:>6s}{body}{body}".rstrip()


def _body(c: Cell | None) -> str:
    if c is None:
        return f"  {'N/A':>7s}  {'N/A':>6s}  {'N/A':>6s}  {'N/A':>6s}"
    return f"  {float_str(c.time_us, 7)}  {float_str(c.algbw, 6)}  {float_str(c.busbw, 6)}  {c.wrong:6d}"


def row_line(row: Row) -> str:
    return (
        f"{row.size:12d}  {row.count:12d}  {row.type:>8s}  {row.redop:>6s}  {row.root:6d}"
        f"{_body(row.out_of_place)}{_body(row.in_place)}"
    )


def footer_lines(op: Op, rows: list[Row], skipped: list[int]) -> list[str]:
    wrong = sum(c.wrong for r in rows for c in (r.out_of_place, r.in_place) if c is not None)
    lines = []
    if skipped:
        sizes = ", ".join(str(s) for s in skipped)
        lines.append(f"# Skipped sizes (B) smaller than one element per rank: {sizes}")
    lines += [
        f"# {'Out of bounds values':<20s} : {wrong} {'FAILED' if wrong else 'OK'}",
        f"# {'Avg bus bandwidth':<20s} : {avg_busbw(rows):g} ",
        "#",
        f"# Collective test concluded: {op.nccl_test}",
    ]
    return lines


def report(op: Op, rows: list[Row], **fields: object) -> dict[str, object]:
    """The JSON of one operation's run: `rows[]` as printed, `avg_busbw`, `wrong`, plus the run's fields."""
    return {
        "op": op.name,
        "nccl_test": op.nccl_test,
        "bus_factor": op.bus_formula,
        **fields,
        "rows": [asdict(r) for r in rows],
        "avg_busbw": avg_busbw(rows),
        "wrong": sum(c.wrong for r in rows for c in (r.out_of_place, r.in_place) if c is not None),
    }
