"""The bench command the integration tests submit as a gpupool job: one 32x32x32 GEMM on the CPU."""

from __future__ import annotations

TINY_GEMM = ["bench", "gemm", "--device", "cpu", "--sizes", "32", "-n", "1", "-w", "0"]


def tiny_gemm_submit(*options: str) -> list[str]:
    """`bench gemm` of one CPU matmul, submitted as a one-GPU job (the CLI's words; options appended)."""
    return [*TINY_GEMM, "--submit", "--gpus", "1", *options]
