"""Bearer-token authentication and the roles' rules (control/tokens.py); tokens are compared by SHA-256
hash, never stored in clear.

Every route under /api/v1 depends on `require_token`, which answers who calls (`Caller`), refuses a
viewer anything but reading, and refuses a caller over its rate limit (api/ratelimit.py). Routes that
change the pool itself (queues, nodes, join tokens, API tokens, health checks, bench results, faults) also
depend on `admin_only`; routes that change a workload check that the caller owns it (`may_change`).
"""

from __future__ import annotations

import time

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from gpupool.api.errors import ApiError
from gpupool.api.ratelimit import RateLimiter, retry_after
from gpupool.control.tokens import VIEWER, Caller, caller_of

CACHE_SECONDS = 5.0
READS = frozenset({"GET", "HEAD", "OPTIONS"})

_HINT = (
    "pass the token in 'Authorization: Bearer <token>' "
    "(the CLI reads $GPUPOOL_TOKEN, else $GPUPOOL_HOME/credentials; $GPUPOOL_HOME is ~/.gpupool unless set)"
)


class TokenCache:
    """Remembers recent verdicts briefly so each request does not query the store."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[Caller | None, float]] = {}

    def recent(self, token: str) -> tuple[bool, Caller | None]:
        """Whether a verdict on `token` is recent enough to use, and that verdict (its holder, or None)."""
        hit = self._seen.get(token)
        if hit is not None and time.monotonic() - hit[1] < CACHE_SECONDS:
            return True, hit[0]
        return False, None

    def caller(self, request: HTTPConnection, token: str) -> Caller | None:
        now = time.monotonic()
        hit = self._seen.get(token)
        if hit is not None and now - hit[1] < CACHE_SECONDS:
            return hit[0]
        caller = caller_of(request.app.state.runtime.store, token)
        if len(self._seen) > 10_000:
            self._seen.clear()
        self._seen[token] = (caller, now)
        return caller

    def forget(self) -> None:
        """Drop every verdict (a token was revoked: it stops working at once on this head)."""
        self._seen = {}


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
    """The holder of a request's or a WebSocket's bearer token; ApiError 401 with the fix when none."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "unauthorized", f"missing bearer token: {_HINT}")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", f"malformed Authorization header: {_HINT}")
    cache: TokenCache = request.app.state.tokens
    known, caller = cache.recent(token.strip())
    if not known:
        caller = await run_in_threadpool(cache.caller, request, token.strip())
    if caller is None:
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
