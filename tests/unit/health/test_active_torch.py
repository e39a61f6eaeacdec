"""The active checks' memory test, on the CPU: every word checked, in chunks of any size."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpupool.health.active_torch import _memtest  # noqa: E402


@pytest.mark.parametrize("chunk_bytes", [8, 800, 4096, 1 << 20])
def test_the_memory_test_finds_no_mismatch_on_good_memory_whatever_the_chunk(chunk_bytes: int) -> None:
    # 10,001 words: the last chunk is a short one (and with 8-byte chunks every word is its own chunk)
    assert _memtest("cpu", 10_001 * 8 + 5, chunk_bytes=chunk_bytes) == 0


def test_the_memory_test_counts_words_that_do_not_hold_what_was_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a stuck word: the buffer's word 7 reads 0 whatever was written to it
    real_empty = torch.empty

    class Stuck(torch.Tensor):
        def __ne__(self, other: object) -> torch.Tensor:  # type: ignore[override]
            seen = torch.Tensor.clone(self).as_subclass(torch.Tensor)
            seen[7] = 0
            return torch.Tensor.__ne__(seen, other)

    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).as_subclass(Stuck))
    # one chunk; three passes (two patterns, then each word's index): word 7 differs in each
    assert _memtest("cpu", 100 * 8, chunk_bytes=100 * 8) == 3
