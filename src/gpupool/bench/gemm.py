"""GEMM sizes and FLOPs (pure): what `gpupool bench gemm --sizes` accepts and what a matmul costs."""

from __future__ import annotations

import re

from gpupool.bench.errors import BenchError

GEMM_DTYPES = ("float", "bf16", "half")
DEFAULT_GPU_SIZES = "2048,4096,8192,16384"
DEFAULT_CPU_SIZES = "128,256,512,1024"
_SHAPE = re.compile(r"^(\d+)(?:x(\d+)x(\d+))?$")


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """`4096` (square) or `MxNxK`, comma separated: "1024,4096x4096x1024"."""
    shapes = []
    if any(not p.strip() for p in text.split(",")) and text.strip():
        raise BenchError(f"--sizes {text!r}: an empty item; give N or MxNxK, comma separated, e.g. 1024,4096")
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        match = _SHAPE.match(part)
        if not match:
            raise BenchError(f"--sizes {part!r}: give N for an N x N x N matmul or MxNxK, comma separated")
        m = int(match.group(1))
        n, k = (int(match.group(2)), int(match.group(3))) if match.group(2) else (m, m)
        if min(m, n, k) < 1:
            raise BenchError(f"--sizes {part!r}: every dimension must be at least 1")
        shapes.append((m, n, k))
    if not shapes:
        raise BenchError("--sizes is empty; give e.g. 4096 or 1024,2048,4096")
    return shapes


def parse_gemm_dtype(text: str) -> str:
    key = {"float32": "float", "fp32": "float", "bfloat16": "bf16", "fp16": "half", "float16": "half"}.get(
        text.strip().lower(), text.strip().lower()
    )
    if key not in GEMM_DTYPES:
        raise BenchError(f"--dtype {text!r}: give one of {', '.join(GEMM_DTYPES)}")
    return key


def gemm_flops(m: int, n: int, k: int) -> float:
    """C[m,n] = A[m,k] @ B[k,n]: m*n*k multiplies and as many adds."""
    return 2.0 * m * n * k
