"""WebSockets to a service through the head, at the proxy's addresses (api/routes/proxy.py passes on its
HTTP requests): /api/v1/workloads/{id}/proxy/... and /api/v1/services/{name}/proxy/...

The caller is admitted as an HTTP request is (`proxy.admit`), the service's replica is chosen the same way
(`proxy.next_target`), and the WebSocket is opened to it with the client's headers (less those the client
library writes itself for the new handshake) and the head's own X-Forwarded-* headers; then messages pass
both ways until either side closes (websocket_relay.py). Each open WebSocket counts as a request in flight
for the autoscaler, until it closes.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidHandshake

from gpupool.api.errors import ApiError
from gpupool.api.routes.proxy import (
    BY_ID,
    BY_NAME,
    DROPPED_REQUEST,
    GONE,
    Address,
    InFlight,
    admit,
    by_name,
    forget,
    forwarded,
    next_target,
    passed_on,
    proxy_state,
    rest_of_path,
)
from gpupool.control.errors import ServiceError
from gpupool.control.service_targets import ServiceTarget
from gpupool.websocket_relay import relay

router = APIRouter()

# Not passed on to a WebSocket upgrade: what the client library writes itself for the new handshake.
DROPPED_UPGRADE = DROPPED_REQUEST | {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                                     "sec-websocket-protocol"}  # fmt: skip
# What `admit` is told a WebSocket does: not a read (a WebSocket carries data both ways), so no viewer
# opens one, as no viewer may POST to a service.
WEBSOCKET = "WEBSOCKET"


@router.websocket("/workloads/{workload_id}/proxy/{path:path}")
async def proxy_websocket(websocket: WebSocket, workload_id: int, path: str) -> None:
    """A WebSocket to a running service, passed through message by message both ways (text and binary),
    until either side closes. This module's router is registered on the app itself, outside the API
    router (`app.py`): the API router's dependencies read an HTTP request. A caller its `access` refuses
    (a missing or bad token, someone else's private service, a viewer: a WebSocket sends as well as reads)
    is refused at the handshake (HTTP 403); a service that cannot be reached closes it at once with the
    reason (1008: not a service or ended; 1013: not running or not ready yet, try again; 1011: nothing
    answers on its port)."""
    if not await _admitted(websocket, workload_id):
        return
    try:
        target, _ = await next_target(websocket, workload_id)
    except (ServiceError, ApiError) as exc:
        await _refuse(websocket, exc)
        return
    await _relayed(websocket, workload_id, target, Address(BY_ID, str(workload_id)))


@router.websocket("/services/{name}/proxy/{path:path}")
async def proxy_websocket_by_name(websocket: WebSocket, name: str, path: str) -> None:
    """As `proxy_websocket`, to the service `name` stands for (`by_name`); a name that stands for none or
    for several closes it at once with the reason (1008), as an ended service does."""
    found = await _named_target(websocket, name)
    if found is not None:
        await _relayed(websocket, *found, Address(BY_NAME, name))


async def _named_target(websocket: WebSocket, name: str) -> tuple[int, ServiceTarget] | None:
    """The service `name` stands for, admitted, and its replica to relay to; None once refused (and the
    socket closed). A remembered name whose service has ended is read again once, as `proxy_by_name` does."""
    for again in (False, True):
        try:
            workload_id, remembered = await by_name(websocket, name)
        except ServiceError as exc:
            await _refuse(websocket, exc)
            return None
        except ApiError:
            await websocket.close(code=1008)  # before the handshake: the client sees HTTP 403
            return None
        if not await _admitted(websocket, workload_id):
            return None
        try:
            target, _ = await next_target(websocket, workload_id)
            return workload_id, target
        except (ServiceError, ApiError) as exc:
            if again or not remembered or exc.status not in GONE:
                await _refuse(websocket, exc)
                return None
            proxy_state(websocket).names.pop(name, None)
    return None


async def _admitted(websocket: WebSocket, workload_id: int) -> bool:
    """Whether the service's `access` admits the caller; else the handshake is refused (HTTP 403)."""
    try:
        await admit(websocket, workload_id, WEBSOCKET)
    except ApiError:
        await websocket.close(code=1008)  # before the handshake: the client sees HTTP 403
        return False
    return True


async def _refuse(websocket: WebSocket, exc: ServiceError | ApiError) -> None:
    """Accepted and closed at once with why the service takes no WebSocket now."""
    await websocket.accept()
    await websocket.close(code=1013 if exc.status == 503 else 1008, reason=_short(exc.message))


async def _relayed(websocket: WebSocket, workload_id: int, target: ServiceTarget, address: Address) -> None:
    flight = InFlight(websocket.app.state.runtime.load, workload_id)  # the autoscaler's measure
    flight.to(target.workload_id)
    try:
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in websocket.headers.raw
            if passed_on(name.decode("latin-1").lower(), DROPPED_UPGRADE)
        ]
        headers += forwarded(websocket, address)
        url = f"ws://{target.endpoint}{rest_of_path(websocket, address)}"
        subprotocols = websocket.scope.get("subprotocols") or None
        try:
            upstream = await connect(
                url, additional_headers=headers, subprotocols=subprotocols, max_size=None, open_timeout=10
            )
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            forget(websocket, workload_id)
            await websocket.accept()
            reason = f"{target.described} refused the WebSocket: {exc}"
            await websocket.close(code=1011, reason=_short(reason))
            return
        await websocket.accept(subprotocol=upstream.subprotocol)
        await relay(websocket.receive, websocket.send, upstream)
    finally:
        flight.done()


def _short(reason: str) -> str:
    """A close reason fits in 123 bytes (RFC 6455, 5.5)."""
    data = reason.encode()
    return reason if len(data) <= 123 else data[:120].decode(errors="ignore") + "..."
