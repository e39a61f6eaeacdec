"""Active checks on real GPUs (torch with CUDA): `python -m gpupool.health.active_torch --level quick`.

Prints one JSON object (the shape of `checks.ActiveResult`) on stdout; progress goes to stderr.
- gemm: BF16 matmul TFLOPS per GPU (bench.gemm_torch.run_gemm; 8192^3 quick, 16384^3 full).
- h2d / d2h: pinned host memory to and from each GPU, 1 GiB quick / 4 GiB full, GB/s = 1e9 B/s.
- memtest: fills 1 GiB (quick) or 90% of the free memory (full) with two bit patterns, then each word's
  index, and counts mismatches, 256 MiB compared at a time.
- allreduce (full, 2+ GPUs): `gpupool bench collective --op all_reduce` at 1 GiB over NCCL; best busbw.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from typing import Any

GIB = 1 << 30
CHUNK = 256 << 20  # bytes of the memory test compared at a time
FULL_MEMTEST_SHARE = 0.9  # of the memory free once the other checks' buffers are released


def _copy_gbps(device: Any, nbytes: int, to_device: bool, iters: int = 5) -> float:
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src, dst = (host, dev) if to_device else (dev, host)
    dst.copy_(src, non_blocking=True)  # warm-up
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(iters):
        dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    seconds = float(start.elapsed_time(end)) / 1e3
    return nbytes * iters / seconds / 1e9


def _memtest(device: Any, nbytes: int, chunk_bytes: int = CHUNK) -> int:
    """Mismatched 8-byte words after writing two bit patterns, then every word's own index, over one buffer
    of `nbytes`. Compared `chunk_bytes` at a time, so the comparison's temporaries stay that small whatever
    the buffer's size (comparing the whole buffer at once made a bool and an int64 copy of it: the full
    check, a third of an H200's free memory, ran out of memory on a healthy GPU)."""
    import torch

    words, step = nbytes // 8, max(1, chunk_bytes // 8)
    buf = torch.empty(words, dtype=torch.int64, device=device)
    errors = torch.zeros((), dtype=torch.int64, device=device)
    spans = [(start, min(start + step, words)) for start in range(0, words, step)]
    for pattern in (0x5555555555555555, -0x5555555555555556):  # 0101... then 1010...
        buf.fill_(pattern)
        for start, end in spans:
            errors += torch.count_nonzero(buf[start:end] != pattern)
    for start, end in spans:  # the whole buffer written before any of it is read: catches aliased addresses
        torch.arange(start, end, dtype=torch.int64, device=device, out=buf[start:end])
    for start, end in spans:
        errors += torch.count_nonzero(
            buf[start:end] != torch.arange(start, end, dtype=torch.int64, device=device)
        )
    return int(errors.item())


def _allreduce_busbw(nbytes: int) -> float | None:
    command = [
        sys.executable, "-m", "gpupool.main", "bench", "collective", "--op", "all_reduce",
        "--backend", "nccl", "-b", str(nbytes), "-e", str(nbytes), "-n", "10", "-w", "3", "--json", "-",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    rows = json.loads(done.stdout)["rows"]
    cells = [r[k] for r in rows for k in ("out_of_place", "in_place") if r.get(k)]
    return max((float(c["busbw"]) for c in cells), default=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--level", choices=("quick", "full"), default="quick")
    args = parser.parse_args(argv)
    import torch

    from gpupool.bench.gemm_torch import device_peak, run_gemm
    from gpupool.gpu.catalog import model_from_product_name

    if not torch.cuda.is_available():
        print("torch sees no CUDA GPU here; active checks need a CUDA build of torch", file=sys.stderr)
        return 2
    full = args.level == "full"
    size = 16384 if full else 8192
    copy_bytes = (4 if full else 1) * GIB
    gpus: list[dict[str, Any]] = []
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        name, peak = device_peak(device, "bf16")
        row: dict[str, Any] = {
            "index": index,
            "model": model_from_product_name(name),
            "peak_tflops": peak.tflops,
        }
        try:
            with contextlib.redirect_stdout(sys.stderr):
                rows, _ = run_gemm([device], [(size, size, size)], "bf16", iters=20, warmup=5)
            row["gemm_tflops"] = round(max(r.tflops for r in rows), 1)
            row["h2d_gbps"] = round(_copy_gbps(device, copy_bytes, to_device=True), 2)
            row["d2h_gbps"] = round(_copy_gbps(device, copy_bytes, to_device=False), 2)
            torch.cuda.empty_cache()  # the GEMM's and copies' cached blocks back to the free memory
            free, _total = torch.cuda.mem_get_info(device)
            row["memtest_errors"] = _memtest(device, int(free * FULL_MEMTEST_SHARE) if full else GIB)
        except Exception as exc:  # a broken GPU must be reported, not crash the other GPUs' checks
            row["error"] = f"{type(exc).__name__}: {exc}"
        gpus.append(row)
        torch.cuda.empty_cache()
    busbw = _allreduce_busbw(GIB) if full and len(gpus) > 1 else None
    notes = [f"torch {torch.__version__}, CUDA {torch.version.cuda}"]
    print(json.dumps({"gpus": gpus, "allreduce_busbw_gbps": busbw, "notes": notes}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
