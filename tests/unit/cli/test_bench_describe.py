"""`gpupool bench ... --record`'s line per stored result: a CPU is not called a GPU."""

from __future__ import annotations

from typing import Any

from gpupool.cli.bench_results import count_text, describe


def _gemm(devices: dict[str, float], name: str) -> dict[str, Any]:
    slowest = min(devices, key=devices.__getitem__)
    figures = {
        "best_tflops": max(devices.values()), "worst_gpu": slowest, "worst_gpu_tflops": devices[slowest],
        "worst_gpu_fraction_of_peak": None,
    }  # fmt: skip
    return {
        "kind": "gemm",
        "key": "fp32",
        "figures": figures,
        "parameters": {"devices": len(devices), "device_name": name},
    }


def test_a_gemm_on_gpus_names_the_slowest_gpu() -> None:
    line = describe(_gemm({"cuda:0": 700.0, "cuda:1": 400.0}, "NVIDIA H100"))
    assert line == "gemm fp32: best 700 TFLOPS, slowest GPU cuda:1 400 TFLOPS (2 x NVIDIA H100)"


def test_a_gemm_on_the_cpu_says_where_it_ran_not_slowest_gpu() -> None:
    line = describe(_gemm({"cpu": 0.25}, "cpu"))
    assert line == "gemm fp32: best 0.25 TFLOPS on cpu (1 x cpu)"


def test_a_small_training_models_parameters_are_not_rounded_to_nothing() -> None:
    figures = {"tokens_per_s": 3815.0, "tflops_per_gpu": 0.0002, "mfu": None, "world_size": 1}
    result = {"kind": "train", "key": "fp32", "figures": figures, "parameters": {"parallel": "ddp"}}
    for count, text in ((17_408, "17.4K"), (124_439_808, "124M"), (1_300_000_000, "1.3B"), (512, "512")):
        result["parameters"]["model"] = {"parameters": count}
        assert f"({text} parameters, 1 ranks, ddp)" in describe(result), count
    assert count_text(999) == "999" and count_text(1000) == "1K"
