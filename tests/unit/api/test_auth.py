"""The token cache: recent verdicts answered from memory, and bad tokens never pushing out good ones."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api import auth
from gpupool.api.auth import CACHE_SECONDS, TokenCache
from gpupool.control.tokens import Caller
from tests.support.process import Clock

ALICE = Caller("alice", "user")


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tokens looked up in the store, which knows one: "good"."""
    looked_up: list[str] = []

    def caller_of(_store: Any, token: str) -> Caller | None:
        looked_up.append(token)
        return ALICE if token == "good" else None

    monkeypatch.setattr(auth, "caller_of", caller_of)
    return looked_up


def test_a_verdict_is_read_once_and_kept_for_a_few_seconds(reads: list[str]) -> None:
    clock = Clock()
    cache = TokenCache(clock=clock)
    assert cache.recent("good") == (False, None)
    assert [cache.caller(None, "good") for _ in range(3)] == [ALICE] * 3
    assert [cache.caller(None, "bad") for _ in range(3)] == [None] * 3
    assert reads == ["good", "bad"]
    assert cache.recent("good") == (True, ALICE) and cache.recent("bad") == (True, None)
    clock.now += CACHE_SECONDS
    assert cache.recent("good") == (False, None)
    cache.caller(None, "good")
    cache.forget()  # a token was revoked
    assert cache.recent("good") == (False, None)


def test_tokens_that_match_nothing_never_push_out_a_good_one(reads: list[str]) -> None:
    cache = TokenCache(clock=Clock())
    cache.caller(None, "good")
    for i in range(3 * auth.MAX_REFUSED + 20_000):  # once past 10,000 of them flushed every verdict
        cache.caller(None, f"guess-{i}")
    assert cache.recent("good") == (True, ALICE)
    assert len(cache._refused) <= auth.MAX_REFUSED


def test_good_verdicts_stay_bounded_dropping_stale_ones_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "MAX_GOOD", 3)
    monkeypatch.setattr(auth, "caller_of", lambda _store, token: Caller(token, "user"))
    clock = Clock()
    cache = TokenCache(clock=clock)
    cache.caller(None, "old")
    clock.now += CACHE_SECONDS
    cache.caller(None, "a")
    cache.caller(None, "b")
    cache.caller(None, "c")  # full: the stale verdict goes, the fresh ones stay
    assert sorted(cache._good) == ["a", "b", "c"]
