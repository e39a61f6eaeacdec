"""Bench results as the head keeps them: a bench's JSON report cut into series with headline figures.

A series is (node, kind, key): `collective` keyed by the op (one series per op of a multi-op run), `gemm`
by the dtype, `train` by the precision. Each result keeps the report as the bench wrote it, the parameters
that make two results comparable, and the figures the health checks and /metrics read:

- collective: `busbw` (GB/s) at the largest size measured (out-of-place, else in-place: torch has no
  out-of-place all-reduce), `max_bytes` (that size), `avg_busbw` (nccl-tests' footer), `wrong`, `nranks`;
- gemm: `best_tflops`; per GPU its best TFLOPS, and `worst_gpu_tflops` / `worst_gpu_fraction_of_peak`
  (the slowest GPU's best, so one slow GPU of eight shows), `largest_size` (smallest of m, n, k of the
  largest shape), `by_size` (each row's device, `MxNxK`, TFLOPS and fraction of peak);
- train: `tokens_per_s`, `tflops_per_gpu`, `mfu`, `iteration_time_s`, `world_size`.

A report says when it was measured (`measured_at`, UTC ISO 8601, which `gpupool bench` writes); reports
written before it did have none, and the head then takes the time they arrive.

Pure: no I/O, no torch. Also the line a bench run as a gpupool job prints so the head can read its
result from the job's log (`RESULT_MARKER`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

KINDS = ("collective", "gemm", "train")
HISTORY_PER_SERIES = 50  # results the head keeps per (node, kind, key); older ones are dropped
RESULT_MARKER = "# gpupool-bench-result "  # a job's log line: the marker, then the report as one JSON line


class BenchResultError(ValueError):
    """A report the head cannot use; the message names the field (report.rows[2].tflops) and the fix."""


@dataclass(frozen=True)
class BenchSummary:
    kind: str
    key: str
    parameters: dict[str, Any]
    figures: dict[str, Any]
    report: dict[str, Any]
    measured_at: datetime | None = None  # the report's `measured_at`; None: an older report without it


def kind_of(report: Any) -> str:
    """collective, gemm or train, from the report's shape (as `gpupool bench ... --json` writes it)."""
    if not isinstance(report, Mapping):
        raise BenchResultError("report: expected the JSON object a bench wrote with --json")
    if "ops" in report or "op" in report:
        return "collective"
    if report.get("benchmark") in ("gemm", "train"):
        return str(report["benchmark"])
    raise BenchResultError(
        "report: not a bench result (no 'op', 'ops' or 'benchmark' field); give the file that "
        "`gpupool bench collective|gemm|train --json FILE` wrote"
    )


def summarize(report: Any, kind: str | None = None) -> list[BenchSummary]:
    """The series of one report; raises BenchResultError naming the first bad field."""
    found = kind_of(report)
    if kind is not None and kind != found:
        if kind not in KINDS:
            raise BenchResultError(f"kind: {kind!r} is not a bench kind; one of {', '.join(KINDS)}")
        raise BenchResultError(f"kind: {kind!r}, but the report is a {found} result; drop kind or fix it")
    at = measured_at(report)
    if found == "collective":
        if "ops" in report:
            ops = _field(report, "ops", list, "report")
            if not ops:
                raise BenchResultError("report.ops: empty; a collective result has at least one op")
            series = [_collective(op, f"report.ops[{i}]") for i, op in enumerate(ops)]
        else:
            series = [_collective(report, "report")]
    elif found == "gemm":
        series = [_gemm(report)]
    else:
        series = [_train(report)]
    return [replace(s, measured_at=at) for s in series]


def measured_at(report: Mapping[str, Any]) -> datetime | None:
    """When the report says it was measured (UTC; a time without a zone is UTC); None when it does not."""
    value = report.get("measured_at")
    if value is None:
        return None
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BenchResultError(
            f"report.measured_at: {value!r} is not an ISO 8601 time such as 2026-12-01T08:00:00+00:00; "
            "give the report exactly as the bench wrote it"
        ) from None
    return moment.astimezone(UTC) if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _collective(report: Any, where: str) -> BenchSummary:
    if not isinstance(report, Mapping):
        raise BenchResultError(f"{where}: expected an object with op, rows and avg_busbw")
    op = _field(report, "op", str, where)
    nranks = _field(report, "nranks", int, where)
    rows = _field(report, "rows", list, where)
    busbw, max_bytes = None, None
    for i, row in enumerate(rows):
        here = f"{where}.rows[{i}]"
        if not isinstance(row, Mapping):
            raise BenchResultError(f"{here}: expected an object with size, out_of_place and in_place")
        size = _field(row, "size", int, here)
        cells = [row.get("out_of_place"), row.get("in_place")]
        measured = [c for c in cells if c is not None]
        for name, cell in zip(("out_of_place", "in_place"), cells, strict=True):
            if cell is not None:
                _number(cell, "busbw", f"{here}.{name}")
        if measured and (max_bytes is None or size >= max_bytes):
            busbw, max_bytes = float(measured[0]["busbw"]), size
    parameters = {
        "op": op,
        "nranks": nranks,
        **{k: report.get(k) for k in ("dtype", "backend", "device", "min_bytes", "max_bytes", "step_factor")},
        **{k: report.get(k) for k in ("iters", "warmup_iters", "blocking")},
    }
    figures = {
        "busbw": busbw,
        "max_bytes": max_bytes,
        "avg_busbw": _number(report, "avg_busbw", where),
        "wrong": _field(report, "wrong", int, where),
        "nranks": nranks,
    }
    return BenchSummary("collective", op, parameters, figures, dict(report))


def _gemm(report: Mapping[str, Any]) -> BenchSummary:
    rows = _field(report, "rows", list, "report")
    if not rows:
        raise BenchResultError("report.rows: empty; a gemm result has at least one row")
    best: dict[str, tuple[float, float | None]] = {}  # device -> its best (tflops, fraction of peak)
    dtypes, shapes, names = set(), [], set()
    by_size: list[dict[str, Any]] = []  # every row: /metrics exports each GPU and size
    for i, row in enumerate(rows):
        here = f"report.rows[{i}]"
        if not isinstance(row, Mapping):
            raise BenchResultError(f"{here}: expected an object with device, m, n, k, dtype and tflops")
        device = _field(row, "device", str, here)
        dims = tuple(_field(row, d, int, here) for d in ("m", "n", "k"))
        tflops = _number(row, "tflops", here)
        fraction = row.get("fraction_of_peak")
        if fraction is not None:
            fraction = _number(row, "fraction_of_peak", here)
        dtypes.add(_field(row, "dtype", str, here))
        names.add(str(row.get("device_name", device)))
        if dims not in shapes:
            shapes.append(dims)
        if device not in best or tflops > best[device][0]:
            best[device] = (tflops, fraction)
        by_size.append(
            {
                "device": device,
                "size": "x".join(map(str, dims)),
                "tflops": tflops,
                "fraction_of_peak": fraction,
            }
        )
    if len(dtypes) != 1:
        raise BenchResultError(f"report.rows: one dtype per gemm result, found {sorted(dtypes)}")
    slowest = min(best, key=lambda d: best[d][0])
    parameters = {
        "dtype": dtypes.pop(),
        "shapes": ["x".join(map(str, s)) for s in shapes],
        "devices": len(best),
        "device_name": ", ".join(sorted(names)),
        "iters": report.get("iters"),
        "warmup_iters": report.get("warmup_iters"),
    }
    figures = {
        "best_tflops": max(t for t, _ in best.values()),
        "worst_gpu_tflops": best[slowest][0],
        "worst_gpu_fraction_of_peak": best[slowest][1],
        "worst_gpu": slowest,
        "gpu_tflops": {d: t for d, (t, _) in sorted(best.items())},
        "largest_size": max(min(s) for s in shapes),
        "by_size": by_size,
    }
    return BenchSummary("gemm", str(parameters["dtype"]), parameters, figures, dict(report))


def _train(report: Mapping[str, Any]) -> BenchSummary:
    model = _field(report, "model", dict, "report")
    precision = _field(report, "precision", str, "report")
    mfu = report.get("mfu")
    parameters = {
        "model": {k: model.get(k) for k in ("layers", "hidden", "heads", "seq", "vocab", "parameters")},
        "world_size": _field(report, "world_size", int, "report"),
        "precision": precision,
        **{k: report.get(k) for k in ("parallel", "micro_batch", "global_batch", "recompute", "data")},
        **{k: report.get(k) for k in ("backend", "device_name", "iters", "warmup_iters")},
    }
    figures = {
        "tokens_per_s": _number(report, "tokens_per_s", "report"),
        "tflops_per_gpu": _number(report, "tflops_per_gpu", "report"),
        "mfu": None if mfu is None else _number(report, "mfu", "report"),
        "iteration_time_s": _number(report, "iteration_time_s", "report"),
        "world_size": parameters["world_size"],
    }
    return BenchSummary("train", precision, parameters, figures, dict(report))


def _field(obj: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        what = {str: "a string", int: "an integer", list: "a list", dict: "an object"}.get(
            kind, kind.__name__
        )
        got = "missing" if key not in obj else f"{value!r} is not {what}"
        raise BenchResultError(f"{where}.{key}: {got}; give the report exactly as the bench wrote it")
    if isinstance(value, int) and value < 0:  # sizes, ranks and counts
        raise BenchResultError(
            f"{where}.{key}: {value} is below 0; give the report exactly as the bench wrote it"
        )
    return value


def _number(obj: Mapping[str, Any], key: str, where: str) -> float:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        # every figure a bench measures (GB/s, TFLOPS, tokens/s, seconds, a share) is finite and >= 0
        got = (
            "missing" if not isinstance(obj, Mapping) or key not in obj else f"{value!r} is not a number >= 0"
        )
        raise BenchResultError(f"{where}.{key}: {got}; give the report exactly as the bench wrote it")
    return float(value)


def result_line(report: Mapping[str, Any], node_rank: int | None = None) -> str:
    """The log line that carries a report to the head: `{"node_rank": R, "report": {...}}` on one line.
    The node rank (the job contract's GPUPOOL_NODE_RANK) names the node even where a backend writes every
    node's output into one file (Slurm's --output)."""
    return RESULT_MARKER + json.dumps({"node_rank": node_rank, "report": report}, separators=(",", ":"))


def reports_in_log(text: str) -> Iterator[tuple[int | None, dict[str, Any]]]:
    """(node rank or None, report) for each line a job printed with `result_line`, in order; lines that
    do not parse are skipped."""
    for line in text.splitlines():
        if not line.startswith(RESULT_MARKER):
            continue
        try:
            value = json.loads(line[len(RESULT_MARKER) :])
        except ValueError:
            continue
        if not isinstance(value, dict) or not isinstance(value.get("report"), dict):
            continue
        rank = value.get("node_rank")
        yield (rank if isinstance(rank, int) and not isinstance(rank, bool) else None), value["report"]
