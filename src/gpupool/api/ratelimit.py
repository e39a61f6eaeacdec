"""Rate limits on API calls: a token bucket per caller (the token's name), as Slurm's slurmctld keeps one
per user (`SlurmctldParameters=rl_enable`).

Each caller's bucket holds at most `burst` requests and refills at `rate` a second. A call takes one; a
call that finds the bucket empty is refused before the route runs (429, with `Retry-After`), so it changed
nothing and may be sent again as it is: the SDK and CLI wait and retry. One script polling in a tight loop
then slows to the rate, and everyone else's calls, the scheduler and the agents' heartbeats (not API
calls of a token) go on. Calls through the service proxy are the services' traffic and are not counted,
but for those without a token that make the head read the store (api/routes/proxy.py, by client address).

Tokens that match nothing are counted too, by client address (`FAILED_AUTH_RATE`, `FAILED_AUTH_BURST`):
each costs a store read, and guessing tokens at will must not be free. Past the bucket, a client's calls
with a token not known to be good get 429 before the store is read (api/auth.py `caller_from`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final

DEFAULT_RATE: Final = 50.0  # requests a second, sustained, per token
DEFAULT_BURST: Final = 200  # requests at once, after a quiet while
MAX_CALLERS: Final = 10_000  # buckets kept; full ones are forgotten first (a full bucket is a new one)
FAILED_AUTH_RATE: Final = 1.0  # bad tokens a second, sustained, per client address
FAILED_AUTH_BURST: Final = 20  # bad tokens at once, per client address (a person's typos stay far below)


class RateLimiter:
    """Token buckets by caller; `rate` 0 turns the limit off. Used from the event loop only (no lock)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate < 0 or not math.isfinite(rate):
            raise ValueError(f"rate {rate}: must be 0 (no limit) or more")
        if burst < 1:
            raise ValueError(f"burst {burst}: must be 1 or more")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # caller -> (requests left, when counted)

    def wait(self, caller: str) -> float:
        """0 when `caller` may make a request now (it is counted), else the seconds until it may."""
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        left, then = self._buckets.get(caller, (float(self.burst), now))
        left = min(float(self.burst), left + (now - then) * self.rate)
        if left >= 1.0:
            self._remember(caller, left - 1.0, now)
            return 0.0
        self._remember(caller, left, now)
        return (1.0 - left) / self.rate

    def waiting(self, caller: str) -> float:
        """The seconds until `caller` may make a request (0: now), counting none."""
        hit = self._buckets.get(caller)
        if self.rate <= 0 or hit is None:
            return 0.0
        left = min(float(self.burst), hit[0] + (self._clock() - hit[1]) * self.rate)
        return 0.0 if left >= 1.0 else (1.0 - left) / self.rate

    def _remember(self, caller: str, left: float, now: float) -> None:
        buckets = self._buckets
        if caller not in buckets and len(buckets) >= MAX_CALLERS:
            full = [name for name, (n, t) in buckets.items() if n + (now - t) * self.rate >= self.burst]
            for name in full:
                del buckets[name]
            if len(buckets) >= MAX_CALLERS:
                buckets.clear()  # every caller busy at once: forgetting gives each a full bucket again
        buckets[caller] = (left, now)


def retry_after(seconds: float) -> str:
    """`Retry-After` in whole seconds (RFC 9110, 10.2.3), at least 1."""
    return str(max(1, math.ceil(seconds)))
