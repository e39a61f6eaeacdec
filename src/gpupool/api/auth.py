"""Bearer-token authentication; tokens are compared by SHA-256 hash, never stored in clear."""

from __future__ import annotations

import time

from fastapi import Request

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

    def role(self, request: Request, token: str) -> str | None:
        now = time.monotonic()
        hit = self._seen.get(token)
        if hit is not None and now - hit[1] < CACHE_SECONDS:
            return hit[0]
        role = service.token_role(request.app.state.runtime.store, token)
        if len(self._seen) > 10_000:
            self._seen.clear()
        self._seen[token] = (role, now)
        return role


def require_token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "unauthorized", f"missing bearer token: {_HINT}")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", f"malformed Authorization header: {_HINT}")
    cache: TokenCache = request.app.state.tokens
    role = cache.role(request, token.strip())
    if role is None:
        raise ApiError(401, "unauthorized", "invalid token: it matches no token of this server")
    return role
