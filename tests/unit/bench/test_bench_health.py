"""Stored bench results against the GPU model's expectations: a verdict naming measured and expected."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.bench.results import summarize
from gpupool.health.bench import judge
from gpupool.health.checks import HEALTHY, UNHEALTHY, WARNING
from gpupool.health.thresholds import HealthConfigError, parse_config
from tests.unit.bench.test_results import TRAIN, collective, gemm, gemm_row

NOW = 1_800_000_000.0
DEFAULTS = parse_config(None)


def stored(report: dict[str, Any], model: str = "H100", age: float = 60.0) -> dict[str, Any]:
    """A result as the head stores and serves it (control.bench.result_view)."""
    [s] = summarize(report)
    return {
        "kind": s.kind,
        "key": s.key,
        "gpu_model": model,
        "figures": s.figures,
        "parameters": s.parameters,
        "source": "job 7",
        "measured_at": "2027-01-15T08:00:00+00:00",
        "measured_at_unix": NOW - age,
    }


def slow_allreduce(busbw: float, nranks: int = 8, size: int = 1 << 33) -> dict[str, Any]:
    report = collective(nranks=nranks)
    report["rows"][-1].update(size=size, out_of_place={"busbw": busbw, "wrong": 0}, in_place=None)
    return report


def test_an_h100_node_below_azures_all_reduce_figure_gets_a_warning_naming_both_values() -> None:
    verdict = judge([stored(slow_allreduce(380.0))], DEFAULTS, NOW)
    assert verdict.health == WARNING
    assert verdict.evidence == (
        "bench all_reduce over 8 ranks: busbw 380 GB/s at 8 GiB < 460 GB/s expected for H100 "
        "(job 7, 2027-01-15T08:00:00Z)"
    )
    assert judge([stored(slow_allreduce(470.0))], DEFAULTS, NOW).health == HEALTHY


def test_all_reduce_runs_not_comparable_with_the_figure_are_not_judged() -> None:
    for report in (slow_allreduce(1.0, nranks=2), slow_allreduce(1.0, size=1 << 20)):
        verdict = judge([stored(report)], DEFAULTS, NOW)
        assert verdict.health == HEALTHY and verdict.checks == ("bench_collective",)
    assert judge([stored(slow_allreduce(1.0), model="L4")], DEFAULTS, NOW).health == HEALTHY  # no figure


def test_wrong_collective_results_are_always_a_finding() -> None:
    verdict = judge([stored(collective(op="all_gather", nranks=2, wrong=3))], DEFAULTS, NOW)
    assert verdict.health == WARNING and "bench all_gather: 3 wrong results" in verdict.evidence


def test_gemm_is_judged_on_the_slowest_gpu_against_the_fraction_of_peak() -> None:
    report = gemm(gemm_row("cuda:0", 8192, 780.0), gemm_row("cuda:3", 8192, 500.0))
    verdict = judge([stored(report)], DEFAULTS, NOW)
    assert verdict.health == WARNING
    assert verdict.evidence.startswith(
        "bench gemm bf16: cuda:3 500 TFLOPS = 51% of the H100 peak < 60% expected"
    )
    small = gemm(gemm_row("cuda:0", 1024, 100.0))  # small matmuls never reach the peak: not judged
    assert judge([stored(small)], DEFAULTS, NOW).health == HEALTHY


def test_thresholds_are_configurable_per_model_and_the_action_can_drain() -> None:
    config = parse_config(
        {
            "thresholds": {
                "*": {
                    "bench_gemm_min_tflops": 1e6,
                    "allreduce_gpus": 2,
                    "bench_allreduce_min_bytes": 0,
                    "bench_allreduce_min_busbw_gbps": 1e6,
                },
                "H100": {"bench_train_min_mfu": 0.5},
            },
            "bench": {"action": "unhealthy"},
        }
    )
    cpu_gemm = gemm(gemm_row("cpu", 64, 1e-5, peak=None))
    verdict = judge(
        [stored(cpu_gemm, model=""), stored(slow_allreduce(0.2, nranks=2, size=65536)), stored(TRAIN)],
        config,
        NOW,
    )
    assert verdict.health == UNHEALTHY
    messages = [f.message for f in verdict.findings]
    assert messages[0].startswith("bench gemm bf16: cpu 1e-05 TFLOPS < 1e+06 TFLOPS expected for this node")
    assert messages[1].startswith("bench all_reduce over 2 ranks: busbw 0.2 GB/s at 64 KiB < 1e+06 GB/s")
    assert messages[2].startswith("bench train 124M-parameter GPT bf16: MFU 40.4% < 50% expected for H100")


def test_results_older_than_max_age_are_not_judged() -> None:
    old = stored(slow_allreduce(1.0), age=31 * 86400.0)
    assert judge([old], DEFAULTS, NOW).checks == ()
    config = parse_config({"bench": {"max_age": 0}})
    assert judge([old], config, NOW).health == WARNING


@pytest.mark.parametrize(
    "document,message",
    [
        ({"bench": {"action": "drain"}}, "bench.action: 'drain'; one of warning, unhealthy"),
        ({"bench": {"max_days": 3}}, "bench.max_days: unknown field; fields: action, max_age"),
        ({"bench": {"max_age": -1}}, "bench.max_age: -1 is not a number at least 0"),
        ({"thresholds": {"H100": {"bench_gemm_min_tflops": "fast"}}}, "bench_gemm_min_tflops: 'fast'"),
        ({"benches": {}}, "unknown key 'benches'; use 'thresholds', 'schedule', 'bench' or 'check_jobs'"),
    ],
)
def test_a_bad_bench_config_names_the_key_and_the_fix(document: dict[str, Any], message: str) -> None:
    with pytest.raises(HealthConfigError, match=message.replace("(", r"\(").replace("+", r"\+")):
        parse_config(document, "health.yaml")
