"""Matrix-multiply throughput: C = A @ B timed like the collectives (warm-up, n launches, one sync).

TFLOPS = 2 m n k / time (one multiply and one add per term), compared with the device's dense peak for
the dtype from gpupool.gpu.catalog. float32 on a GPU runs as true FP32 (TF32 stays off, torch's default).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass

import torch

from gpupool.bench.errors import BenchError
from gpupool.bench.gemm import gemm_flops
from gpupool.bench.peak import Peak, peak_for

TORCH_DTYPES = {"float": "float32", "bf16": "bfloat16", "half": "float16"}


@dataclass(frozen=True)
class GemmRow:
    device: str  # "cuda:0" or "cpu"
    device_name: str
    m: int
    n: int
    k: int
    dtype: str
    time_us: float  # mean time of one matmul
    tflops: float
    peak_tflops: float | None  # dense peak of this device and dtype; None when the table has none
    fraction_of_peak: float | None  # tflops / peak_tflops


def devices_for(choice: str) -> list[torch.device]:
    """`auto` (every visible GPU, else the CPU), `cpu`, `all` (every visible GPU), or a GPU index."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if choice == "auto":
        return [torch.device("cuda", i) for i in range(gpus)] or [torch.device("cpu")]
    if choice == "cpu":
        return [torch.device("cpu")]
    if choice == "all":
        if not gpus:
            raise BenchError("--device all: no GPU is visible to torch here; use --device cpu")
        return [torch.device("cuda", i) for i in range(gpus)]
    if choice.isdigit():
        if not gpus:
            raise BenchError(f"--device {choice}: no GPU is visible to torch here; use --device cpu")
        if int(choice) >= gpus:
            raise BenchError(f"--device {choice}: only {gpus} GPUs are visible here (indices 0..{gpus - 1})")
        return [torch.device("cuda", int(choice))]
    raise BenchError(f"--device {choice!r}: give auto, cpu, all or a GPU index such as 0")


def device_peak(device: torch.device, dtype: str) -> tuple[str, Peak]:
    if device.type != "cuda":
        return "cpu", peak_for(None, None, dtype)
    props = torch.cuda.get_device_properties(device)
    return str(props.name), peak_for(str(props.name), int(props.total_memory), dtype)


def run_gemm(
    devices: list[torch.device], shapes: list[tuple[int, int, int]], dtype: str, iters: int, warmup: int
) -> tuple[list[GemmRow], list[str]]:
    """Measure every shape on every device; print the table as it goes; return the rows and the notes."""
    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
    rows, notes = [], []
    print(
        f"# gpupool bench gemm: C = A @ B, dtype {dtype}, {iters} iterations after {warmup} warm-up; "
        "TFLOPS = 2*m*n*k / time"
    )
    for device in devices:
        name, peak = device_peak(device, dtype)
        what = f"peak {peak.tflops:g} TFLOPS, {peak.note}" if peak.tflops else peak.note
        notes.append(f"{device}: {what}" if device.type == "cpu" else f"{device}: {name}: {what}")
        print(f"# {notes[-1]}")
    print(
        f"# {'device':>8s}  {'m':>6s}  {'n':>6s}  {'k':>6s}  {'dtype':>5s}  {'time(us)':>10s}  "
        f"{'TFLOPS':>8s}  {'%peak':>6s}"
    )
    sys.stdout.flush()
    for device in devices:
        name, peak = device_peak(device, dtype)
        for m, n, k in shapes:
            seconds = _time_matmul(device, m, n, k, torch_dtype, iters, warmup)
            tflops = gemm_flops(m, n, k) / seconds / 1e12
            fraction = tflops / peak.tflops if peak.tflops else None
            row = GemmRow(str(device), name, m, n, k, dtype, seconds * 1e6, tflops, peak.tflops, fraction)
            rows.append(row)
            pct = f"{fraction * 100:6.1f}" if fraction is not None else f"{'-':>6s}"
            print(
                f"  {row.device:>8s}  {m:6d}  {n:6d}  {k:6d}  {dtype:>5s}  {row.time_us:10.1f}  "
                f"{tflops:8.2f}  {pct}"
            )
            sys.stdout.flush()
    best = max(rows, key=lambda r: r.tflops)
    tail = (
        f" = {best.fraction_of_peak * 100:.1f}% of the {best.peak_tflops:g} TFLOPS peak"
        if best.fraction_of_peak
        else " (no peak to compare with)"
    )
    print(f"# Best: {best.tflops:.2f} TFLOPS at {best.m}x{best.n}x{best.k} on {best.device}{tail}")
    return rows, notes


def _time_matmul(
    device: torch.device, m: int, n: int, k: int, dtype: torch.dtype, iters: int, warmup: int
) -> float:
    gen = torch.Generator(device=device).manual_seed(0)
    try:
        a = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
        b = torch.randn(k, n, device=device, dtype=dtype, generator=gen)
        out = torch.empty(m, n, device=device, dtype=dtype)
    except torch.OutOfMemoryError as exc:
        raise BenchError(
            f"--sizes {m}x{n}x{k} does not fit in {device}'s memory; give smaller sizes"
        ) from exc
    for _ in range(warmup):
        torch.matmul(a, b, out=out)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(iters):
            torch.matmul(a, b, out=out)
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3 / iters
    began = time.perf_counter()
    for _ in range(iters):
        torch.matmul(a, b, out=out)
    return (time.perf_counter() - began) / iters


def report(rows: list[GemmRow], notes: list[str], iters: int, warmup: int) -> dict[str, object]:
    best = max(rows, key=lambda r: r.tflops)
    return {
        "benchmark": "gemm",
        "iters": iters,
        "warmup_iters": warmup,
        "notes": notes,
        "rows": [asdict(r) for r in rows],
        "best_tflops": best.tflops,
        "best_fraction_of_peak": best.fraction_of_peak,
    }
