"""Bearer-token authentication; tokens are compared by SHA-256 hash, never stored in clear."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from gpupool.api.errors import ApiError
from gpupool.control import service

CACHE_SECONDS = 5.0

_HINT = (
    "pass the token in 'Authorization: Bearer <token>' "
    "(the CLI reads ~/.gpupool/credentials or $GPUPOOL_TOKEN)"
)


class TokenCache:
    """Remembers recent verdicts briefly so each request does not query the store."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str | None, float]] = {}

    def recent(self, token: str) -> tuple[bool, str | None]:
        """Whether a verdict on `token` is recent enough to use, and that verdict (its role, or None)."""
        hit = self._seen.get(token)
        if hit is not None and time.monotonic() - hit[1] < CACHE_SECONDS:
            return True, hit[0]
        return False, None

    def role(self, request: HTTPConnection, token: str) -> str | None:
        now = time.monotonic()
        hit = self._seen.get(token)
        if hit is not None and now - hit[1] < CACHE_SECONDS:
            return hit[0]
        role = service.token_role(request.app.state.runtime.store, token)
        if len(self._seen) > 10_000:
            self._seen.clear()
        self._seen[token] = (role, now)
        return role


async def require_token(request: Request) -> str:
    """The request's role by its bearer token. Run on the event loop: a token seen in the last seconds is
    answered from memory, without the hop to a worker thread that a store read takes (a thread switch
    costs the loop more than the check, docs/benchmarks.md#service-proxy)."""
    return await role_of(request)


async def role_of(request: HTTPConnection) -> str:
    """The role of a request's or a WebSocket's bearer token; ApiError 401 with the fix when it has none."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "unauthorized", f"missing bearer token: {_HINT}")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", f"malformed Authorization header: {_HINT}")
    cache: TokenCache = request.app.state.tokens
    known, role = cache.recent(token.strip())
    if not known:
        role = await run_in_threadpool(cache.role, request, token.strip())
    if role is None:
        raise ApiError(401, "unauthorized", "invalid token: it matches no token of this server")
    return role
