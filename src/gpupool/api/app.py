"""The FastAPI application: /healthz open, everything under /api/v1 behind a bearer token."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from sqlalchemy import text
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpupool import __version__, web
from gpupool.api import errors
from gpupool.api.auth import TokenCache, admin_only, require_token
from gpupool.api.body import refuse_nul, refuse_unknown_query
from gpupool.api.ratelimit import FAILED_AUTH_BURST, FAILED_AUTH_RATE, RateLimiter
from gpupool.api.routes import (
    agents,
    bench,
    events,
    foreign,
    health,
    metrics,
    nodes,
    proxy,
    proxy_websocket,
    queues,
    scheduling,
    secrets,
    tokens,
    usage,
    workloads,
)
from gpupool.api.runtime import Runtime
from gpupool.backends.agent import LISTEN_TICK, AgentBackend
from gpupool.control.observe import ALIVE_INTERVAL

PROBED = ["GET", "HEAD"]  # the methods of the pages a probe may ask for
FAILING_NOT_READY = 30.0  # /readyz says not ready while two control passes failed within this many seconds,
# and until no pass has failed for this long: a store that fails writes fails a pass at least every
# ALIVE_INTERVAL (each head writes down that it is alive that often), so a head is ready again soon after
# its store mends
PASSING_AGAIN = ALIVE_INTERVAL + 2.0
MAX_BODY_BYTES = 1 << 20
# The dashboard runs only its own inline script (by its hash) and talks only to this server; no other site
# may frame it.
PAGE_HEADERS = {
    "Content-Security-Policy": f"default-src 'none'; script-src {web.script_sources()}; "
    "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class BodyLimit:
    """Refuse a request body over `limit` bytes with 413 before it is parsed or the caller is known: by its
    Content-Length at once, and a body sent without one (chunked) as its bytes arrive, so that nobody, with
    a token or none, makes the head hold more than `limit` bytes of it. Requests to a service through the
    proxy are left out: their bodies go on to the service as they arrive, never held (api/routes/proxy.py)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or proxy.is_proxied(scope["path"]):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._refuse(
                    send, f"request body of {int(value)} bytes is over the {self.limit}-byte limit"
                )
                return
        size, started, refused = 0, False, False

        async def counted() -> Message:
            nonlocal size, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > self.limit:
                    # Answered here, and to the route the client seems gone: it stops reading, and
                    # whatever it answers or raises after is dropped.
                    refused = True
                    if not started:
                        await self._refuse(send, f"request body over the {self.limit}-byte limit")
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, guarded)
        except Exception:
            if not refused:
                raise

    async def _refuse(self, send: Send, message: str) -> None:
        payload = json.dumps({"error": {"code": "too_large", "message": message}}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"connection", b"close"),  # the rest of the body is not read
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


async def _listen(backend: AgentBackend) -> None:
    """Tell the agent backend the event loop runs: node leases do not count time the head stood still."""
    while True:
        backend.listening()
        await asyncio.sleep(LISTEN_TICK)


def create_app(runtime: Runtime) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime.start()
        # What exists now (modules, the app, ORM mappings: most of the heap) lives as long as the server:
        # moved out of the garbage collector's reach, a full collection, which stops every thread, walks
        # only what came later (with 1,000 agents, ~120 ms every 2 s before, ~30 ms after). With so few
        # long-lived objects left, CPython's own brake on full collections (a quarter of them new) no
        # longer holds, and the reconcile pass's ORM objects set one off every second: a tenth as often.
        gc.freeze()
        first, second, _ = gc.get_threshold()
        gc.set_threshold(first, second, 100)  # docs/benchmarks.md#agents
        backend = runtime.backend
        listener = asyncio.create_task(_listen(backend)) if isinstance(backend, AgentBackend) else None
        try:
            yield
        finally:
            if listener is not None:
                listener.cancel()
            await app.state.proxy.client.aclose()
            runtime.stop()

    app = FastAPI(
        title="gpupool",
        version=__version__,
        description="One shared, fairly scheduled GPU pool for AI work.",
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.state.proxy = proxy.ProxyState()
    app.state.tokens = TokenCache()
    app.state.limiter = RateLimiter(runtime.settings.rate_limit, runtime.settings.rate_burst)
    app.state.failed_auth = RateLimiter(FAILED_AUTH_RATE, FAILED_AUTH_BURST)  # by client address
    app.state.node_credentials = agents.NodeCredentials()
    errors.install(app)

    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(agents.HeartbeatEndpoint, limit=MAX_BODY_BYTES)  # outermost: the agents' hot path

    # GET and HEAD: uptime checkers and load balancers probe with HEAD (the body is left out)
    @app.api_route("/", methods=PROBED, include_in_schema=False)
    def home() -> RedirectResponse:
        return RedirectResponse("/ui")

    @app.api_route(
        "/ui",
        methods=PROBED,
        tags=["dashboard"],
        summary="The dashboard page (its data: the API, with a token)",
    )
    def dashboard() -> HTMLResponse:
        return HTMLResponse(web.page(), headers=PAGE_HEADERS)

    @app.api_route("/healthz", methods=PROBED, tags=["health"], summary="Liveness: answers without a token")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "version": __version__}

    @app.api_route(
        "/readyz",
        methods=PROBED,
        tags=["health"],
        summary="Readiness: 200 while the server can reach its store and its control loop works, else 503 "
        "(no token)",
        responses={
            503: {"description": "the store cannot be reached, or every control pass has failed lately"}
        },
    )
    def readyz() -> JSONResponse:
        with runtime.store.read() as s:  # an OperationalError is the 503 of errors.py, naming the store
            s.execute(text("SELECT 1"))
        failures = list(runtime.reconciler.failures)
        now = time.monotonic()
        if (
            len(failures) == 2
            and now - failures[0][0] <= FAILING_NOT_READY
            and now - failures[-1][0] <= PASSING_AGAIN
        ):
            message = (
                f"the control loop's passes fail (two in the last {FAILING_NOT_READY:g}s; the last: "
                f"{failures[-1][1]}): work may not be scheduled, started or settled; see the server's log "
                "(event=reconcile_failed)"
            )
            body = {"error": {"code": "not_ready", "message": message}}
            return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
        return JSONResponse({"status": "ready", "version": __version__})

    api = APIRouter(
        prefix="/api/v1",
        dependencies=[Depends(require_token), Depends(refuse_nul), Depends(refuse_unknown_query)],
    )
    api.include_router(workloads.router)
    api.include_router(nodes.router)
    api.include_router(queues.router)
    api.include_router(foreign.router)
    api.include_router(agents.admin_router, dependencies=[Depends(admin_only)])
    api.include_router(tokens.router)
    api.include_router(health.router)
    api.include_router(bench.router)
    api.include_router(usage.router)
    api.include_router(scheduling.router)
    api.include_router(events.router)
    api.include_router(secrets.router)
    # The proxy checks its callers itself (`proxy.admit`): a public service takes requests with no token.
    # First of the routes: each request to a service is matched against the routes in order.
    app.include_router(proxy.router, prefix="/api/v1")
    app.include_router(api)
    app.include_router(proxy_websocket.router, prefix="/api/v1")
    app.include_router(agents.agent_router)
    app.include_router(metrics.router)
    return app
