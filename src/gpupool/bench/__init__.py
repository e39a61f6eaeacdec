"""Hardware benchmarks: collective bandwidth (nccl-tests layout), GEMM TFLOPS, GPT training throughput.

Modules without `torch` in their name import no torch, so the CLI stays light; the runners import it.
"""
