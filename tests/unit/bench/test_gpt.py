"""Megatron-LM's FLOPs formula and the GPT model it counts."""

from __future__ import annotations

import pytest

from gpupool.bench.errors import BenchError
from gpupool.bench.gpt import Batching, GptShape, megatron_flops


def test_flops_match_equation_3_of_narayanan_et_al_by_hand() -> None:
    # GPT-3 175B row of the paper's table: l=96, h=12288, s=2048, V=51200, B=1536.
    shape = GptShape(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
    b, s, layers, h, v = 1536, 2048, 96, 12288, 51200
    eq3 = 96 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))
    assert megatron_flops(shape, b, recompute=True) == pytest.approx(eq3, rel=1e-12)
    no_recompute = 72 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
    assert megatron_flops(shape, b) == pytest.approx(no_recompute, rel=1e-12)


def test_flops_of_a_tiny_model_by_hand() -> None:
    # l=2, h=64, s=32, V=256, B=8: per layer forward 24*8*32*64^2 + 4*8*32^2*64 = 25165824 + 2097152;
    # times 3 passes and 2 layers, plus the logits 6*8*32*64*256.
    shape = GptShape(layers=2, hidden=64, heads=4, seq=32, vocab=256)
    assert megatron_flops(shape, 8) == 3 * 2 * (25165824 + 2097152) + 6 * 8 * 32 * 64 * 256 == 188743680


def test_parameter_count_is_the_models() -> None:
    torch = pytest.importorskip("torch")
    from gpupool.bench.gpt_torch import Gpt

    shape = GptShape(layers=2, hidden=64, heads=4, seq=32, vocab=257)
    model = Gpt(shape)
    assert sum(p.numel() for p in model.parameters()) == shape.parameters()
    loss = model(torch.zeros(2, 32, dtype=torch.long), torch.zeros(2, 32, dtype=torch.long))
    assert loss.shape == () and float(loss.detach()) > 0


def test_gpt2_small_has_about_124m_parameters() -> None:
    assert 123e6 < GptShape(12, 768, 12, 1024, 50304).parameters() < 125e6


def test_batching_errors_name_the_flags_and_a_fix() -> None:
    assert Batching(micro_batch=2, global_batch=16, world_size=4).accumulation == 2
    with pytest.raises(
        BenchError, match=r"--global-batch 10 .* --micro-batch 2 x 4 ranks = 8; use --global-batch 8"
    ):
        Batching(2, 10, 4).validate()
    with pytest.raises(BenchError, match="--hidden 100 is not a multiple of --heads 12"):
        GptShape(2, 100, 12, 32, 256).validate()
