"""Bearer-token authentication and the roles' rules (control/tokens.py); tokens are compared by SHA-256
hash, never stored in clear.

Every route under /api/v1 depends on `require_token`, which answers who calls (`Caller`), refuses a
viewer anything but reading, and refuses a caller over its rate limit and a client address that sent too
many tokens matching nothing (api/ratelimit.py). Routes that change the pool itself (queues, nodes, join
tokens, API tokens, health checks, bench results, faults) also depend on `admin_only`; routes that change
a workload check that the caller owns it (`may_change`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from gpupool.api.errors import ApiError
from gpupool.api.ratelimit import RateLimiter, retry_after
from gpupool.control.tokens import VIEWER, Caller, caller_of
from gpupool.store.db import Store

CACHE_SECONDS = 5.0
MAX_GOOD = 10_000  # verdicts on good tokens kept; past it, those older than CACHE_SECONDS are dropped
MAX_REFUSED = 1_000  # verdicts on tokens that matched nothing kept; past it, all of those are dropped
READS = frozenset({"GET", "HEAD", "OPTIONS"})
FAILED_AUTH_LABEL = "(invalid tokens)"  # gpupool_api_rate_limited_total's token for refused bad tokens

_HINT = (
    "pass the token in 'Authorization: Bearer <token>' "
    "(the CLI reads $GPUPOOL_TOKEN, else $GPUPOOL_HOME/credentials; $GPUPOOL_HOME is ~/.gpupool unless set)"
)


class TokenCache:
    """Remembers recent verdicts briefly so each request does not query the store. Verdicts on tokens that
    match nothing are kept apart, and fewer: however many bad tokens are sent, no good one is pushed out."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._good: dict[str, tuple[Caller, float]] = {}  # token -> (its holder, when read)
        self._refused: dict[str, float] = {}  # token that matched nothing -> when read
        self._clock = clock

    def recent(self, token: str) -> tuple[bool, Caller | None]:
        """Whether a verdict on `token` is recent enough to use, and that verdict (its holder, or None)."""
        now = self._clock()
        hit = self._good.get(token)
        if hit is not None and now - hit[1] < CACHE_SECONDS:
            return True, hit[0]
        refused = self._refused.get(token)
        return (refused is not None and now - refused < CACHE_SECONDS), None

    def caller(self, store: Store, token: str) -> Caller | None:
        """The holder of `token`, from a recent verdict or else read from the store (and remembered)."""
        known, caller = self.recent(token)
        if known:
            return caller
        caller = caller_of(store, token)
        now = self._clock()
        if caller is None:
            if len(self._refused) >= MAX_REFUSED:
                self._refused = {}
            self._refused[token] = now
            return None
        if token not in self._good and len(self._good) >= MAX_GOOD:
            fresh = {t: hit for t, hit in self._good.items() if now - hit[1] < CACHE_SECONDS}
            self._good = fresh if len(fresh) < MAX_GOOD else {}
        self._good[token] = (caller, now)
        return caller

    def forget(self) -> None:
        """Drop every verdict (a token was revoked: it stops working at once on this head)."""
        self._good, self._refused = {}, {}


async def require_token(request: Request) -> Caller:
    """Who calls, by the bearer token; a viewer may only read. Run on the event loop: a token seen in the
    last seconds is answered from memory, without the hop to a worker thread that a store read takes (a
    thread switch costs the loop more than the check, docs/benchmarks.md#service-proxy)."""
    caller = await caller_from(request)
    refuse_viewer_change(caller, request.method, request.url.path)
    limiter: RateLimiter = request.app.state.limiter
    wait = limiter.wait(caller.name)
    if wait > 0:
        request.app.state.runtime.metrics.rate_limited.labels(caller.name).inc()
        raise ApiError(
            429,
            "rate_limited",
            f"the token {caller.name!r} made more than {limiter.burst} requests at once or "
            f"{limiter.rate:g} a second for a while: wait {wait:.2f} s (Retry-After) and send it again, "
            "unchanged (it changed nothing); the SDK and CLI do so by themselves. An admin sets the limit "
            "with `gpupool server --rate-limit N --rate-burst N`",
            headers={"Retry-After": retry_after(wait)},
        )
    return caller


def refuse_viewer_change(caller: Caller, method: str, path: str) -> None:
    """Refuse (403) a viewer anything but reading."""
    if caller.role == VIEWER and method not in READS:
        raise ApiError(
            403,
            "forbidden",
            f"{method} {path}: the token {caller.name!r} is a viewer's, which may only read; ask an admin "
            "for a user token (`gpupool token create NAME --role user`)",
        )


async def admin_only(request: Request, caller: Caller = Depends(require_token)) -> Caller:
    """Refuse (403) anyone but an admin: for the routes that change the pool itself, or read what only
    admins see (the audit log, the tokens)."""
    if not caller.admin:
        what = "is for admins only" if request.method in READS else "changes the pool itself"
        raise ApiError(
            403,
            "forbidden",
            f"{request.method} {request.url.path} {what}, which takes an admin token; "
            f"the token {caller.name!r} has role {caller.role}",
        )
    return caller


async def caller_from(request: HTTPConnection) -> Caller:
    """The holder of a request's or a WebSocket's bearer token; ApiError 401 with the fix when none, 429
    when the client's address sent too many tokens that matched nothing (`failed_auth`, by address)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "unauthorized", f"missing bearer token: {_HINT}")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", f"malformed Authorization header: {_HINT}")
    cache: TokenCache = request.app.state.tokens
    known, caller = cache.recent(token.strip())
    if caller is not None:
        return caller
    # Only a token not known to be good gets this far: a client that guessed too often waits before the
    # store is read for it again, and a good token, once seen, goes on from any address.
    failures: RateLimiter = request.app.state.failed_auth
    address = request.client.host if request.client is not None else "unknown"
    wait = failures.waiting(address)
    if wait > 0:
        request.app.state.runtime.metrics.rate_limited.labels(FAILED_AUTH_LABEL).inc()
        raise ApiError(
            429,
            "rate_limited",
            f"more than {failures.burst} tokens that match no token of this server came from {address} "
            f"lately: wait {wait:.2f} s (Retry-After), then send the call again with a valid token; "
            f"{_HINT}",
            headers={"Retry-After": retry_after(wait)},
        )
    if not known:
        caller = await run_in_threadpool(cache.caller, request.app.state.runtime.store, token.strip())
    if caller is None:
        failures.wait(address)  # counted
        raise ApiError(401, "unauthorized", "invalid token: it matches no token of this server")
    return caller


def may_change(caller: Caller, owner: str, what: str) -> None:
    """Refuse (403) a change of someone else's work to anyone but an admin."""
    if not caller.admin and owner != caller.name:
        raise ApiError(
            403,
            "forbidden",
            f"{what} belongs to {owner}: only they or an admin may change it (your token: {caller.name})",
        )
