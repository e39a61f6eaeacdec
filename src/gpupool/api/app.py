"""The FastAPI application: /healthz open, everything under /api/v1 behind a bearer token."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse

from gpupool import __version__
from gpupool.api import errors
from gpupool.api.auth import TokenCache, require_token
from gpupool.api.routes import nodes, queues, workloads
from gpupool.api.runtime import Runtime

MAX_BODY_BYTES = 1 << 20


def create_app(runtime: Runtime) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime.start()
        try:
            yield
        finally:
            runtime.stop()

    app = FastAPI(
        title="gpupool",
        version=__version__,
        description="One shared, fairly scheduled GPU pool for AI work.",
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.state.tokens = TokenCache()
    errors.install(app)

    @app.middleware("http")
    async def limit_body_size(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            message = f"request body of {int(length)} bytes is over the {MAX_BODY_BYTES}-byte limit"
            return JSONResponse({"error": {"code": "too_large", "message": message}}, status_code=413)
        return await call_next(request)

    @app.get("/healthz", tags=["health"], summary="Liveness: answers without a token")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "version": __version__}

    api = APIRouter(prefix="/api/v1", dependencies=[Depends(require_token)])
    api.include_router(workloads.router)
    api.include_router(nodes.router)
    api.include_router(queues.router)
    app.include_router(api)
    return app
