"""`gpupool forward`: a service at the root of a local address, through the head's proxy.

A small HTTP server on this machine (127.0.0.1 by default) passes each request to the head's
`/api/v1/workloads/ID/proxy/PATH` with the user's token, and streams the answer back. A browser, a web
app or an OpenAI-style client then reaches the service at `http://127.0.0.1:PORT/`, with no token to
handle and with the absolute links a web app writes (`/static/...`) working, as they do not under the
head's path prefix. WebSockets pass too, message by message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidHandshake

from gpupool.websocket_relay import relay

# Not passed on: hop-by-hop headers (RFC 9110, 7.6.1), the host (the head's is set), and any credentials
# for the head other than the user's token, which replaces them.
DROPPED_REQUEST = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
     b"transfer-encoding", b"upgrade", b"host", b"authorization"}
)  # fmt: skip
DROPPED_UPGRADE = DROPPED_REQUEST | {b"sec-websocket-key", b"sec-websocket-version",
                                     b"sec-websocket-extensions", b"sec-websocket-protocol"}  # fmt: skip
DROPPED_RESPONSE = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
     b"transfer-encoding", b"upgrade", b"date", b"server"}
)  # fmt: skip
TIMEOUT = httpx.Timeout(connect=10.0, read=600.0, write=60.0, pool=10.0)

Scope = dict[str, Any]


class Forwarder:
    """An ASGI application: every HTTP request it gets goes to a service through the head at `server`,
    with `token`: the service `workload_id`, or, given `name`, the pending or running service of that
    name (its by-name address, which follows the service when it is submitted again)."""

    def __init__(self, server: str, token: str | None, workload_id: int, name: str | None = None) -> None:
        self.server, self.token, self.workload_id = server.rstrip("/"), token, workload_id
        self.prefix = f"/api/v1/services/{name}/proxy" if name else f"/api/v1/workloads/{workload_id}/proxy"
        self._client: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._client = httpx.AsyncClient(
                base_url=self.server,
                headers=headers,
                timeout=TIMEOUT,
                follow_redirects=False,
                trust_env=False,
            )
        return self._client

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._client is not None:
                    await self._client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Any, send: Any) -> None:
        raw = scope.get("raw_path") or scope["path"].encode()
        path = raw.decode("latin-1")
        query = scope.get("query_string", b"").decode("latin-1")
        url = f"{self.prefix}{path}" + (f"?{query}" if query else "")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in DROPPED_REQUEST]
        names = {k.lower() for k, _ in scope["headers"]}
        lengths = [v for k, v in scope["headers"] if k.lower() == b"content-length"]
        has_body = b"transfer-encoding" in names or (lengths and lengths[0] != b"0")

        async def body() -> AsyncIterator[bytes]:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return
                yield message.get("body", b"")
                if not message.get("more_body"):
                    return

        client = self.client()
        request = client.build_request(
            scope["method"], url, headers=headers, content=body() if has_body else None
        )
        try:
            answer = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            why = exc or type(exc).__name__
            text = f"gpupool forward: the head at {self.server} could not be reached ({why})\n"
            await send(
                {"type": "http.response.start", "status": 502, "headers": [(b"content-type", b"text/plain")]}
            )
            await send({"type": "http.response.body", "body": text.encode()})
            return
        try:
            kept = [(k.lower(), v) for k, v in answer.headers.raw if k.lower() not in DROPPED_RESPONSE]
            await send({"type": "http.response.start", "status": answer.status_code, "headers": kept})
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await answer.aclose()

    async def _websocket(self, scope: Scope, receive: Any, send: Any) -> None:
        """A WebSocket passed on to the head's proxy with the token, message by message both ways."""
        if (await receive())["type"] != "websocket.connect":
            return
        raw = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"").decode("latin-1")
        base = "ws" + self.server[len("http") :] if self.server.startswith("http") else self.server
        url = f"{base}{self.prefix}{raw.decode('latin-1')}" + (f"?{query}" if query else "")
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k.lower() not in DROPPED_UPGRADE
        ]
        if self.token:
            headers.append(("Authorization", f"Bearer {self.token}"))
        try:
            upstream = await connect(
                url, additional_headers=headers, subprotocols=scope.get("subprotocols") or None, max_size=None
            )
        except (OSError, InvalidHandshake, TimeoutError):
            await send({"type": "websocket.close", "code": 1011})
            return
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        await relay(receive, send, upstream)
