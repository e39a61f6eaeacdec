"""The bench check: a node's newest stored bench results against its GPU model's expectations.

Pure: `judge` takes the newest result of each series of one node (control.bench.result_view dicts) and
the health config; each figure below its threshold is a Finding whose severity is the config's
`bench.action` (warning by default; unhealthy drains the node until a newer result passes). A collective
that returned wrong data is always a finding. Thresholds: health/thresholds.py (`bench_*` fields).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.health.checks import UNHEALTHY, WARNING, Finding, Verdict, verdict
from gpupool.health.thresholds import HealthConfig

CHECKS = ("bench_collective", "bench_gemm", "bench_train")


def _bytes_text(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def judge(results: Sequence[Mapping[str, Any]], config: HealthConfig, now: float) -> Verdict:
    """The verdict of one node's newest results (older than `bench.max_age` are not judged)."""
    severity = UNHEALTHY if config.bench.action == "unhealthy" else WARNING
    findings: list[Finding] = []
    judged: set[str] = set()
    for r in results:
        age = now - float(r["measured_at_unix"])
        if config.bench.max_age and age > config.bench.max_age:
            continue
        model = str(r.get("gpu_model") or "")
        limits = config.for_model(model)
        f, p, kind = r["figures"], r["parameters"], str(r["kind"])
        whose = f"{model} " if model else ""  # "H100 peak"
        for_whom = model or "this node"
        where = f"({r['source']}, {str(r['measured_at'])[:19]}Z)"
        judged.add(f"bench_{kind}")
        if kind == "collective":
            op = str(r["key"])
            if f.get("wrong"):
                findings.append(
                    Finding("bench_collective", severity, f"bench {op}: {f['wrong']} wrong results {where}")
                )
            least = limits.bench_allreduce_min_busbw_gbps
            if least is None:
                least = limits.allreduce_min_busbw_gbps
            busbw, size = f.get("busbw"), f.get("max_bytes")
            if (
                op == "all_reduce"
                and least is not None
                and busbw is not None
                and int(f.get("nranks") or 0) == limits.allreduce_gpus
                and int(size or 0) >= limits.bench_allreduce_min_bytes
                and busbw < least
            ):
                findings.append(
                    Finding(
                        "bench_collective", severity,
                        f"bench all_reduce over {f['nranks']} ranks: busbw {busbw:.3g} GB/s at "
                        f"{_bytes_text(int(size or 0))} < {least:g} GB/s expected for {for_whom} {where}",
                    )
                )  # fmt: skip
        elif kind == "gemm":
            worst, device = f.get("worst_gpu_tflops"), f.get("worst_gpu")
            large = int(f.get("largest_size") or 0) >= limits.bench_gemm_min_size
            fraction = f.get("worst_gpu_fraction_of_peak")
            floor = limits.bench_gemm_min_fraction
            if floor is None:
                floor = limits.gemm_min_fraction
            dtype = p.get("dtype", r["key"])
            if large and fraction is not None and fraction < floor:
                findings.append(
                    Finding(
                        "bench_gemm", severity,
                        f"bench gemm {dtype}: {device} {worst:.4g} TFLOPS = {fraction:.0%} of the "
                        f"{whose}peak < {floor:.0%} expected {where}",
                    )
                )  # fmt: skip
            least_tflops = limits.bench_gemm_min_tflops
            if least_tflops is not None and worst is not None and worst < least_tflops:
                findings.append(
                    Finding(
                        "bench_gemm", severity,
                        f"bench gemm {dtype}: {device} {worst:.4g} TFLOPS < {least_tflops:g} TFLOPS expected "
                        f"for {for_whom} {where}",
                    )
                )  # fmt: skip
        elif kind == "train":
            mfu, least_mfu = f.get("mfu"), limits.bench_train_min_mfu
            if mfu is not None and least_mfu is not None and mfu < least_mfu:
                params = (p.get("model") or {}).get("parameters")
                shape = f"{params / 1e6:.0f}M-parameter " if isinstance(params, int | float) else ""
                findings.append(
                    Finding(
                        "bench_train", severity,
                        f"bench train {shape}GPT {r['key']}: MFU {mfu:.1%} < {least_mfu:.0%} expected for "
                        f"{for_whom} {where}",
                    )
                )  # fmt: skip
    return verdict(findings, sorted(judged))
