"""A GPT-2-style decoder in plain torch: the model whose FLOPs gpt.megatron_flops counts.

Pre-norm blocks (LayerNorm, causal self-attention through scaled_dot_product_attention, LayerNorm, a 4h
GELU MLP), learned position embeddings, and an output layer tied to the token embedding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from gpupool.bench.gpt import GptShape


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_attn = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln_mlp = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln_attn(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.ln_mlp(x)), approximate="tanh"))
        return out


class Gpt(nn.Module):
    def __init__(self, shape: GptShape, *, recompute: bool = False) -> None:
        super().__init__()
        self.shape, self.recompute = shape, recompute
        self.tokens = nn.Embedding(shape.vocab, shape.hidden)
        self.positions = nn.Embedding(shape.seq, shape.hidden)
        self.blocks = nn.ModuleList(Block(shape.hidden, shape.heads) for _ in range(shape.layers))
        self.ln_out = nn.LayerNorm(shape.hidden)
        self.apply(_init)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of predicting targets (idx shifted by one) from idx."""
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(positions)
        for block in self.blocks:
            recompute = self.recompute and self.training
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        logits = self.ln_out(x) @ self.tokens.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def _init(module: nn.Module) -> None:
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
