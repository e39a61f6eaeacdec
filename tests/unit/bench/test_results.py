"""A bench's JSON report becomes the series and headline figures the head stores, or a clear refusal."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpupool.bench.results import (
    RESULT_MARKER,
    BenchResultError,
    kind_of,
    reports_in_log,
    result_line,
    summarize,
)


def cell(busbw: float, wrong: int = 0) -> dict[str, Any]:
    return {"time_us": 100.0, "algbw": busbw, "busbw": busbw, "wrong": wrong}


def collective(op: str = "all_reduce", nranks: int = 8, wrong: int = 0) -> dict[str, Any]:
    rows = [
        {"size": 1024, "count": 1, "out_of_place": None, "in_place": cell(100.0)},
        {"size": 1 << 33, "count": 1, "out_of_place": cell(470.5, wrong), "in_place": cell(480.0)},
    ]
    return {"op": op, "nranks": nranks, "dtype": "float", "backend": "nccl", "device": "cuda",
            "min_bytes": 1 << 20, "max_bytes": 1 << 33, "step_factor": 2, "iters": 20, "warmup_iters": 5,
            "blocking": False, "rows": rows, "avg_busbw": 287.0, "wrong": wrong}  # fmt: skip


def gemm_row(device: str, size: int, tflops: float, peak: float | None = 989.0) -> dict[str, Any]:
    return {"device": device, "device_name": "NVIDIA H100 80GB HBM3", "m": size, "n": size, "k": size,
            "dtype": "bf16", "time_us": 1.0, "tflops": tflops, "peak_tflops": peak,
            "fraction_of_peak": tflops / peak if peak else None}  # fmt: skip


def gemm(*rows: dict[str, Any]) -> dict[str, Any]:
    return {"benchmark": "gemm", "iters": 20, "warmup_iters": 5, "notes": [], "rows": list(rows),
            "best_tflops": max(r["tflops"] for r in rows), "best_fraction_of_peak": None}  # fmt: skip


TRAIN = {
    "benchmark": "train", "model": {"layers": 12, "hidden": 768, "heads": 12, "seq": 1024, "vocab": 50304,
    "parameters": 124_000_000}, "world_size": 8, "backend": "nccl", "device_name": "NVIDIA H100 80GB HBM3",
    "parallel": "ddp", "precision": "bf16", "micro_batch": 4, "global_batch": 32, "recompute": False,
    "data": "synthetic", "iters": 10, "warmup_iters": 2, "iteration_time_s": 0.5, "tokens_per_s": 65536.0,
    "tflops_per_gpu": 400.0, "mfu": 400.0 / 989.0,
}  # fmt: skip


def test_a_collective_is_judged_by_its_busbw_at_the_largest_size_out_of_place_first() -> None:
    [s] = summarize(collective())
    assert (s.kind, s.key) == ("collective", "all_reduce")
    assert s.figures == {"busbw": 470.5, "max_bytes": 1 << 33, "avg_busbw": 287.0, "wrong": 0, "nranks": 8}
    assert s.parameters["backend"] == "nccl" and s.parameters["nranks"] == 8


def test_a_multi_op_run_is_one_series_per_op() -> None:
    summaries = summarize({"ops": [collective("all_reduce"), collective("all_gather")]})
    assert [s.key for s in summaries] == ["all_reduce", "all_gather"]


def test_gemm_figures_name_the_slowest_gpu_so_one_slow_gpu_of_several_shows() -> None:
    [s] = summarize(gemm(gemm_row("cuda:0", 8192, 780.0), gemm_row("cuda:1", 8192, 400.0),
                         gemm_row("cuda:1", 2048, 300.0)))  # fmt: skip
    assert s.key == "bf16"
    assert s.figures["best_tflops"] == 780.0
    assert s.figures["worst_gpu"] == "cuda:1" and s.figures["worst_gpu_tflops"] == 400.0
    assert s.figures["worst_gpu_fraction_of_peak"] == pytest.approx(400.0 / 989.0)
    assert s.figures["largest_size"] == 8192 and s.parameters["shapes"] == [
        "8192x8192x8192",
        "2048x2048x2048",
    ]


def test_train_figures_are_tokens_tflops_and_mfu() -> None:
    [s] = summarize(TRAIN)
    assert (s.kind, s.key) == ("train", "bf16")
    assert s.figures["tokens_per_s"] == 65536.0 and s.figures["mfu"] == pytest.approx(0.4044, abs=1e-4)
    assert s.parameters["model"]["parameters"] == 124_000_000


@pytest.mark.parametrize(
    "report,message",
    [
        ({"hello": 1}, "report: not a bench result"),
        ([1, 2], "report: expected the JSON object"),
        ({"ops": []}, "report.ops: empty"),
        ({**collective(), "nranks": "8"}, "report.nranks: '8' is not an integer"),
        ({**collective(), "avg_busbw": None}, "report.avg_busbw: None is not a number"),
        ({"benchmark": "gemm", "rows": []}, "report.rows: empty"),
        ({**TRAIN, "tokens_per_s": "fast"}, "report.tokens_per_s: 'fast' is not a number"),
        # figures no bench measures, that a hand-made file recorded before
        ({**collective(), "avg_busbw": -3.0}, "report.avg_busbw: -3.0 is not a number >= 0"),
        ({**TRAIN, "tokens_per_s": float("inf")}, "report.tokens_per_s: inf is not a number >= 0"),
        ({**collective(), "wrong": -1}, "report.wrong: -1 is below 0"),
    ],
)
def test_a_bad_report_is_refused_naming_the_field(report: Any, message: str) -> None:
    with pytest.raises(BenchResultError, match="^" + message.replace("(", r"\(").replace("[", r"\[")):
        summarize(report)


def test_a_bad_cell_deep_in_the_rows_is_named_by_its_path() -> None:
    report = collective()
    report["rows"][1]["in_place"] = {"busbw": "x"}
    with pytest.raises(BenchResultError, match=r"^report\.rows\[1\]\.in_place\.busbw"):
        summarize(report)


def test_a_kind_that_disagrees_with_the_report_is_refused() -> None:
    with pytest.raises(BenchResultError, match="kind: 'gemm', but the report is a collective result"):
        summarize(collective(), "gemm")
    assert kind_of(TRAIN) == "train"


def test_a_report_survives_the_trip_through_a_job_log() -> None:
    report = copy.deepcopy(TRAIN)
    lines = [
        "rank 0 says hi",
        result_line(report),
        result_line(report, 1),
        RESULT_MARKER + "{not json",
        RESULT_MARKER + '{"node_rank": 0}',
    ]
    assert list(reports_in_log("\n".join(lines))) == [(None, report), (1, report)]


def test_a_report_says_when_it_was_measured_and_an_older_one_without_it_has_no_time() -> None:
    from datetime import UTC, datetime

    [dated] = summarize({**TRAIN, "measured_at": "2026-12-01T08:00:00+01:00"})
    assert dated.measured_at == datetime(2026, 12, 1, 7, 0, tzinfo=UTC)
    [naive] = summarize({**TRAIN, "measured_at": "2026-12-01T08:00:00"})  # no zone: UTC
    assert naive.measured_at == datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    ops = summarize({"ops": [collective(), collective("all_gather")], "measured_at": "2026-12-01T08:00:00Z"})
    assert {s.measured_at for s in ops} == {datetime(2026, 12, 1, 8, 0, tzinfo=UTC)}
    assert summarize(TRAIN)[0].measured_at is None
    for bad in ("yesterday", 1764576000, ""):
        with pytest.raises(BenchResultError, match=r"^report\.measured_at: .* is not an ISO 8601 time"):
            summarize({**TRAIN, "measured_at": bad})
