"""The API's rate limit: a token bucket per caller, on a clock the test moves."""

from __future__ import annotations

import pytest

from gpupool.api import ratelimit
from gpupool.api.ratelimit import RateLimiter, retry_after


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_caller_gets_its_burst_at_once_then_the_rate() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=2.0, burst=3, clock=clock)
    assert [limiter.wait("alice") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.wait("alice") == pytest.approx(0.5)  # one request refills in 1/rate
    assert limiter.wait("bob") == 0.0  # buckets are per caller
    clock.now += 0.25
    assert limiter.wait("alice") == pytest.approx(0.25)  # a refusal takes nothing from the bucket
    clock.now += 0.25
    assert limiter.wait("alice") == 0.0
    assert limiter.wait("alice") > 0
    clock.now += 60  # a quiet while refills it to the burst, never beyond
    assert [limiter.wait("alice") for _ in range(4)][:3] == [0.0, 0.0, 0.0]
    assert limiter.wait("alice") > 0


def test_rate_zero_is_no_limit_and_bad_settings_are_refused() -> None:
    limiter = RateLimiter(rate=0.0, burst=1)
    assert all(limiter.wait("alice") == 0.0 for _ in range(10_000))
    with pytest.raises(ValueError, match="rate -1"):
        RateLimiter(rate=-1.0, burst=1)
    with pytest.raises(ValueError, match="burst 0"):
        RateLimiter(rate=1.0, burst=0)


def test_memory_stays_bounded_and_busy_callers_keep_their_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ratelimit, "MAX_CALLERS", 10)
    clock = Clock()
    limiter = RateLimiter(rate=1.0, burst=2, clock=clock)
    for i in range(9):
        limiter.wait(f"quiet-{i}")
    clock.now += 5  # the quiet ones are full again
    limiter.wait("busy")
    limiter.wait("busy")  # empty now
    limiter.wait("new")  # an eleventh caller: the full buckets are forgotten, the busy one is kept
    assert sorted(limiter._buckets) == ["busy", "new"]
    assert limiter.wait("busy") == pytest.approx(1.0)
    for i in range(8):
        limiter.wait(f"more-{i}")  # ten callers, none full: when one more comes, all are forgotten
    limiter.wait("last")
    assert list(limiter._buckets) == ["last"]


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert retry_after(0.01) == "1"
    assert retry_after(1.0) == "1"
    assert retry_after(1.2) == "2"


def test_waiting_says_how_long_without_counting_a_request() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=2.0, burst=2, clock=clock)
    assert limiter.waiting("alice") == 0.0  # never seen: a full bucket
    limiter.wait("alice")
    assert [limiter.waiting("alice") for _ in range(5)] == [0.0] * 5  # asking takes nothing
    limiter.wait("alice")
    assert limiter.waiting("alice") == pytest.approx(0.5)
    clock.now += 0.5
    assert limiter.waiting("alice") == 0.0
    assert RateLimiter(rate=0.0, burst=1).waiting("alice") == 0.0
