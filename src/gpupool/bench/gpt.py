"""A GPT decoder's shape, its parameter count and its training FLOPs by Megatron-LM's formula (pure).

The FLOPs formula is from Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (SC'21), section 5.1 and appendix: a transformer layer's forward pass costs
24 B s h^2 + 4 B s^2 h (the QKV, attention-output and two MLP matmuls with a 4h MLP, plus the attention
scores and their product with the values), the logit layer 2 B s h V; the backward pass costs twice the
forward, and activation recomputation one more forward of every layer. With recomputation this gives
their equation (3):

    F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))

and without it, which is the "model FLOPs" that MFU counts (recomputed work is not useful work):

    F = 72 B s l h^2 (1 + s / (6 h) + V / (12 l h))

B: sequences per iteration (the global batch), s: sequence length, l: layers, h: hidden size, V: vocabulary.
Layer norms, softmax, GELU, biases and the position embedding are left out, as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.bench.errors import BenchError


@dataclass(frozen=True)
class GptShape:
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int

    def validate(self) -> None:
        for flag, value in (
            ("--layers", self.layers),
            ("--hidden", self.hidden),
            ("--heads", self.heads),
            ("--seq", self.seq),
            ("--vocab", self.vocab),
        ):
            if value < 1:
                raise BenchError(f"{flag} must be at least 1 (got {value})")
        if self.hidden % self.heads:
            raise BenchError(
                f"--hidden {self.hidden} is not a multiple of --heads {self.heads}; "
                f"e.g. --heads {_divisor_near(self.hidden, self.heads)}"
            )

    def parameters(self) -> int:
        """Weights and biases of the model in gpt_torch.py (tied input and output embeddings)."""
        h, layer = self.hidden, 0
        layer += 3 * h * h + 3 * h  # QKV projection
        layer += h * h + h  # attention output projection
        layer += 4 * h * h + 4 * h + 4 * h * h + h  # MLP up and down
        layer += 4 * h  # two layer norms
        return self.layers * layer + self.vocab * h + self.seq * h + 2 * h


def _divisor_near(hidden: int, heads: int) -> int:
    return min((d for d in range(1, hidden + 1) if hidden % d == 0), key=lambda d: abs(d - heads))


def megatron_flops(shape: GptShape, batch: int, *, recompute: bool = False) -> float:
    """FLOPs of one training iteration over `batch` sequences (Narayanan et al. 2021, eq. 3)."""
    b, s, h, v = batch, shape.seq, shape.hidden, shape.vocab
    layer_forward = 24.0 * b * s * h * h + 4.0 * b * s * s * h
    passes = 4 if recompute else 3  # forward + backward (2x) [+ recomputed forward]
    return passes * shape.layers * layer_forward + 6.0 * b * s * h * v


@dataclass(frozen=True)
class Batching:
    micro_batch: int  # sequences per rank per forward/backward
    global_batch: int  # sequences per optimizer step, all ranks together
    world_size: int

    @property
    def accumulation(self) -> int:
        return self.global_batch // (self.micro_batch * self.world_size)

    def validate(self) -> None:
        if self.micro_batch < 1 or self.global_batch < 1:
            raise BenchError("--micro-batch and --global-batch must be at least 1")
        per_step = self.micro_batch * self.world_size
        if self.global_batch % per_step:
            raise BenchError(
                f"--global-batch {self.global_batch} is not a multiple of --micro-batch {self.micro_batch} x "
                f"{self.world_size} ranks = {per_step}; "
                f"use --global-batch {max(1, self.global_batch // per_step) * per_step}"
            )


def count_text(n: float) -> str:
    """A count as people write model sizes: 17.4K, 124M, 1.3B (three significant digits); 512 as is."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"
