"""One WebSocket passed through: messages between an ASGI connection (the side a client opened to us) and
a `websockets` client connection (the side we opened on), both ways, text and binary, until either side
closes. The head's proxy (`api/routes/proxy.py`) and `gpupool forward` (`client/forward.py`) both relay
with it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ABNORMAL = 1006  # no close frame came (RFC 6455, 7.1.5): never sent on; 1011 says the far side failed


async def relay(receive: Receive, send: Send, upstream: ClientConnection) -> None:
    """Relay an accepted ASGI WebSocket (`receive`, `send`) and `upstream` until one side closes; the other
    side is then closed too, with the code (and reason) the first one gave."""

    async def inward() -> None:
        try:
            async for message in upstream:
                key = "text" if isinstance(message, str) else "bytes"
                await send({"type": "websocket.send", key: message})
        except ConnectionClosed:
            pass
        code = upstream.close_code or 1000
        with contextlib.suppress(Exception):  # the ASGI side may be gone already
            await send({"type": "websocket.close", "code": 1011 if code == ABNORMAL else code,
                        "reason": upstream.close_reason or ""})  # fmt: skip

    async def outward() -> None:
        try:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    break  # websocket.disconnect
                await upstream.send(message["text"] if message.get("text") is not None else message["bytes"])
        except ConnectionClosed:
            pass
        await upstream.close()

    tasks = [asyncio.create_task(inward()), asyncio.create_task(outward())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
