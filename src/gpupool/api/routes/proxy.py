"""/api/v1/workloads/{id}/proxy/...: a service reached through the head, at an address that stays the same
while the service starts again on another port or node; /api/v1/services/{name}/proxy/...: the one pending or
running service of that name (control/service_names.py says which), at an address that stays the same while
the service is cancelled and submitted again.

The request goes, with its method, path below `proxy/`, query, headers and body, to the address the
service's running attempt listens on (`GPUPOOL_PORT` on rank 0's node); the answer comes back streamed, so
server-sent events and long downloads pass as they come. Who may reach a service is its spec's `access`
(`admit`): its owner and admins (private, the default), any token of this head (pool), or anyone
(public). The head's own bearer token is checked like any API call's and is not passed on; the body is the
service's business (no NUL check, unlike the API's own routes, and no size limit: it is streamed on as it
arrives, never held by the head). The client's own X-Forwarded-* and Forwarded headers are dropped: the
head writes its own, so a service can believe them. By name, the name is read to an id (`by_name`),
and from there all is as by id. WebSockets to a service: api/routes/proxy_websocket.py. See
docs/user-guide.md#reaching-a-service.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeVar

import httpx
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import HTTPConnection

from gpupool.api.auth import caller_from, refuse_viewer_change
from gpupool.api.errors import ApiError
from gpupool.api.ratelimit import RateLimiter, retry_after
from gpupool.control import service_names
from gpupool.control.access import PRIVATE, PUBLIC, Access, access_of
from gpupool.control.autoscale import Load
from gpupool.control.errors import NotFound, ServiceError
from gpupool.control.readiness import word_on
from gpupool.control.service_targets import NotServing, ServiceTarget, service_targets

router = APIRouter(tags=["services"])

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
# Not passed on: hop-by-hop headers (RFC 9110, 7.6.1), the head's own credentials, and the host (the
# client library names the service's). Content-Length is kept: a body is streamed on with its length.
DROPPED_REQUEST = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "host", "authorization"}
)  # fmt: skip
# The head's server writes its own Date and Server headers: the service's would come twice.
DROPPED_RESPONSE = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "date", "server"}
)  # fmt: skip
# What a client says about where a request came from is not passed on: the head writes its own (`forwarded`).
FORWARDED_PREFIX = "x-forwarded-"
FORWARDED = "forwarded"  # RFC 7239
TIMEOUT = httpx.Timeout(connect=5.0, read=600.0, write=60.0, pool=10.0)
# Where a service runs is read from the store at most once a TARGET_TTL seconds per service (and again at
# once after its endpoint failed to answer, or its probe said not ready): a read in a worker thread costs
# the event loop more than the request it serves (docs/benchmarks.md#service-proxy). So are the services a
# name stands for (read again at once when the one it stood for has ended).
TARGET_TTL = 1.0
MAX_TARGETS = 10_000
# Passive health: an endpoint that refused or did not accept a connection gets no request for REST seconds
# while another replica takes them (a hung process's accept queue fills, and each connect would wait).
REST = 5.0
# For a caller without a token, an id that named no workload (a name that named no pending or running
# service) is not looked up again for MISSING_TTL seconds, and a request that needs a store read (an id not
# known here, a name not read in the last TARGET_TTL seconds) is counted by the API's rate limiter under the
# caller's address: nobody without a token can make the head read the store at will. (A caller with a token
# is always looked up: access once seen is kept, and a miss must not let a new private service by.)
MISSING_TTL = 2.0
PUBLIC_SANDBOX = b"sandbox allow-scripts allow-forms allow-popups allow-downloads"
BY_ID = "/api/v1/workloads/"
BY_NAME = "/api/v1/services/"
# What the proxy tries again once, reading the name afresh, when the service a remembered name stood for
# answers it: ended (409), or gone from the store (404).
GONE = frozenset({404, 409})
K = TypeVar("K")
V = TypeVar("V")
_PROXIED = re.compile(r"/api/v1/(workloads|services)/[^/]+/proxy(/|$)")


def is_proxied(path: str) -> bool:
    """Whether a request's path goes to a service through the proxy (its body is the service's)."""
    return _PROXIED.match(path) is not None


def passed_on(name: str, dropped: frozenset[str]) -> bool:
    """Whether a request header of this (lowercase) name goes on to the service."""
    return name not in dropped and name != FORWARDED and not name.startswith(FORWARDED_PREFIX)


@dataclass(frozen=True, slots=True)
class Address:
    """Where a request reached the proxy: below `start` (BY_ID or BY_NAME), at the service's id or name."""

    start: str
    key: str

    @property
    def prefix(self) -> str:
        """The path prefix the service is reached under (its X-Forwarded-Prefix)."""
        return f"{self.start}{self.key}/proxy"


def forwarded(connection: HTTPConnection, address: Address) -> list[tuple[str, str]]:
    """The head's own X-Forwarded-* headers: the client's address (the peer's, or what a proxy trusted
    by `gpupool server --forwarded-allow-ips` said), the host and scheme it asked for, and the path prefix
    the service is reached under."""
    host = connection.headers.get("host", "")
    forwarded = [
        ("x-forwarded-for", connection.client.host if connection.client is not None else ""),
        ("x-forwarded-proto", "https" if connection.url.scheme in ("https", "wss") else "http"),
        ("x-forwarded-prefix", address.prefix),
    ]
    return forwarded + ([("x-forwarded-host", host)] if host else [])


class ProxyState:
    """The app's one client for proxied requests (its connections kept and reused; closed with the app),
    where each service's replicas were last read to run and the services each name stood for (see
    TARGET_TTL), and each service's turn: its requests go round the replicas that take them."""

    def __init__(self) -> None:
        self.client = httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False, trust_env=False)
        self.targets: dict[int, tuple[float, tuple[ServiceTarget, ...]]] = {}
        self.turns: dict[int, int] = {}
        # who may reach each workload: its owner and spec never change, so an answer is kept (bounded)
        self.access: dict[int, Access] = {}
        self.missing: dict[int, float] = {}  # ids that named no workload -> until when that is believed
        # the pending or running services each name stood for when read (see TARGET_TTL) -> until when
        self.names: dict[str, tuple[float, tuple[service_names.Named, ...]]] = {}
        self.unnamed: dict[str, float] = {}  # names that named no service -> until when (MISSING_TTL)
        self.missing_said: dict[str, tuple[float, str]] = {}  # what a token's 404 for each said, until when
        self.resting: dict[str, float] = {}  # endpoints that failed to connect -> until when (REST)

    def rest(self, endpoint: str) -> None:
        if len(self.resting) >= MAX_TARGETS:
            self.resting.clear()
        self.resting[endpoint] = time.monotonic() + REST

    def is_resting(self, endpoint: str, now: float) -> bool:
        until = self.resting.get(endpoint)
        if until is not None and until <= now:
            del self.resting[endpoint]
            return False
        return until is not None

    def take_turn(self, workload_id: int, choices: list[ServiceTarget]) -> ServiceTarget:
        turn = self.turns.get(workload_id, 0)
        self.turns[workload_id] = turn + 1
        return choices[turn % len(choices)]


def proxy_state(request: HTTPConnection) -> ProxyState:
    state: ProxyState = request.app.state.proxy
    return state


def rest_of_path(request: HTTPConnection, address: Address) -> str:
    """The path below `proxy/` as the client wrote it (still percent-encoded), with its query."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    path = raw.decode("latin-1")
    at = path.find("/proxy/", len(address.start))
    rest = path[at + len("/proxy") :] if at >= 0 else "/"
    query = request.url.query
    return f"{rest}?{query}" if query else rest


async def admit(connection: HTTPConnection, workload_id: int, method: str) -> bool:
    """Refuse (ApiError 401 or 403) a caller the service's `access` does not let through; whether the
    service is public. An id that names no workload needs a token too: without one nobody learns which
    ids exist."""
    runtime = connection.app.state.runtime
    state = proxy_state(connection)
    access = state.access.get(workload_id)
    anonymous = "authorization" not in connection.headers
    if access is None and not (anonymous and state.missing.get(workload_id, 0.0) > time.monotonic()):
        if anonymous:
            _count_anonymous(connection)
        access = await run_in_threadpool(access_of, runtime.store, workload_id)
        if access is not None:
            _remember(state.access, workload_id, access)
        elif anonymous:
            _remember(state.missing, workload_id, time.monotonic() + MISSING_TTL)
    if access is not None and access.access == PUBLIC:
        return True
    caller = await caller_from(connection)
    refuse_viewer_change(caller, method, connection.url.path)
    private = access is not None and access.access == PRIVATE
    if private and access is not None and not caller.admin and caller.name != access.owner:
        raise ApiError(
            403,
            "forbidden",
            f"workload {workload_id} belongs to {access.owner} and is private: only they or an admin may "
            f"reach it (your token: {caller.name}); its owner can open it with access: pool (any token "
            "of this head) or access: public in its spec",
        )
    return False


def _count_anonymous(connection: HTTPConnection) -> None:
    """Refuse (429) a caller without a token that asks too often for services not known here."""
    limiter: RateLimiter = connection.app.state.limiter
    address = connection.client.host if connection.client is not None else "unknown"
    wait = limiter.wait(f"anonymous@{address}")
    if wait > 0:
        raise ApiError(
            429,
            "rate_limited",
            f"too many requests without a token from {address} for services this head had not seen "
            f"lately: wait {wait:.2f} s (Retry-After) and send it again",
            headers={"Retry-After": retry_after(wait)},
        )


async def by_name(connection: HTTPConnection, name: str) -> tuple[int, bool]:
    """The id of the service `name` stands for (`service_names.choose`), and whether the name's services
    were remembered (read in the last TARGET_TTL seconds) rather than read now. Refused: 404 for a name
    no pending or running service has, 409 for one several have (neither the caller's alone); and 401
    without a token unless the name stands for public services alone, as for an id: nobody without a
    token learns which names exist."""
    state = proxy_state(connection)
    now = time.monotonic()
    anonymous = "authorization" not in connection.headers
    hit = state.names.get(name)
    remembered = hit is not None and hit[0] > now
    if hit is not None and remembered:
        named = hit[1]
    elif not service_names.could_be_a_name(name) or (anonymous and state.unnamed.get(name, 0.0) > now):
        named = ()
    else:
        if anonymous:
            _count_anonymous(connection)
        store = connection.app.state.runtime.store
        named = await run_in_threadpool(service_names.services_named, store, name)
        if named:
            _remember(state.names, name, (now + TARGET_TTL, named))
        else:
            state.names.pop(name, None)
            if anonymous:
                _remember(state.unnamed, name, now + MISSING_TTL)
    caller = None
    public = all(n.access.access == PUBLIC for n in named)
    if len(named) != 1 and not (anonymous and named and public):
        caller = (await caller_from(connection)).name  # 401 without a token; with one, its own may win
    chosen = service_names.choose(named, name, caller)
    if chosen is None:
        assert caller is not None  # no service of the name: only a caller with a good token gets here
        raise NotFound(await _missing(connection, name, caller), field="name")
    if chosen.service_id not in state.access:  # what `admit` would read: its owner and spec never change
        _remember(state.access, chosen.service_id, chosen.access)
    return chosen.service_id, remembered


async def _missing(connection: HTTPConnection, name: str, caller: str) -> str:
    """What a caller with a token is told of a name no pending or running service has. Whether one of it
    ended lately is a scan of the name's past work: made at most once a MISSING_TTL per name, and counted
    under the caller's token as an API call is; past the token's rate limit, it is not looked up."""
    state = proxy_state(connection)
    now = time.monotonic()
    said = state.missing_said.get(name)
    if said is not None and said[0] > now:
        return said[1]
    limiter: RateLimiter = connection.app.state.limiter
    if limiter.wait(caller) > 0:
        return service_names.missing(None, name)
    message = await run_in_threadpool(service_names.missing, connection.app.state.runtime.store, name)
    _remember(state.missing_said, name, (now + MISSING_TTL, message))
    return message


def _remember(cache: dict[K, V], key: K, value: V) -> None:
    """`cache[key] = value`, the cache emptied first when it holds MAX_TARGETS entries."""
    if len(cache) >= MAX_TARGETS:
        cache.clear()
    cache[key] = value


async def next_target(
    request: HTTPConnection, workload_id: int, avoid: str = ""
) -> tuple[ServiceTarget, bool]:
    """The next of the service's replicas to send to (round robin over those that take requests; the
    endpoint `avoid`, and those resting after a failed connection (REST), only when no other does), and
    whether it is remembered: from the last second's read while one of those is still ready, else read
    from the store (which refuses, as `service_targets` says: 503 with the live reason, and
    Retry-After when a crash-loop backoff says when)."""
    runtime = request.app.state.runtime
    state = proxy_state(request)
    hit = state.targets.get(workload_id)
    now = time.monotonic()
    if hit is not None and hit[0] > now:
        ready = [
            t
            for t in hit[1]
            if t.endpoint != avoid
            and not state.is_resting(t.endpoint, now)
            and (not t.probed or word_on(runtime.readiness.state, t.workload_id, t.attempt).ready)
        ]
        if ready:
            return state.take_turn(workload_id, ready), True
    try:
        group: tuple[ServiceTarget, ...] = await run_in_threadpool(
            service_targets,
            runtime.store,
            workload_id,
            runtime.readiness.state,
            runtime.reconciler.explanations,
            runtime.settings.restart_backoff,
        )
    except NotServing as exc:
        if exc.retry_at is None:
            raise
        wait = max(1.0, exc.retry_at - time.time())
        raise ApiError(503, exc.code, exc.message, headers={"Retry-After": retry_after(wait)}) from exc
    if len(state.targets) >= MAX_TARGETS:
        state.targets.clear()
        state.turns.clear()
    state.targets[workload_id] = (now + TARGET_TTL, group)
    others = [t for t in group if t.endpoint != avoid]
    healthy = [t for t in others if not state.is_resting(t.endpoint, now)]
    return state.take_turn(workload_id, healthy or others or list(group)), False


async def _send(
    request: Request, workload_id: int, target: ServiceTarget, address: Address
) -> httpx.Response:
    """The request passed on to `target`, its answer's head read (the body follows as it is streamed);
    the service's failures to answer as the API's errors, a connection refused or not accepted in time
    (nothing was sent) as httpx raises it."""
    headers = [
        (name, value)
        for name, value in request.headers.raw
        if passed_on(name.decode("latin-1").lower(), DROPPED_REQUEST)
    ]
    headers += [(name.encode(), value.encode("latin-1")) for name, value in forwarded(request, address)]
    has_body = "transfer-encoding" in request.headers or request.headers.get("content-length", "0") != "0"
    client = proxy_state(request).client
    outgoing = client.build_request(
        request.method,
        f"http://{target.endpoint}{rest_of_path(request, address)}",
        headers=headers,
        content=request.stream() if has_body else None,
    )
    try:
        return await client.send(outgoing, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout):
        raise
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        # It had the request, and may have acted on it: never sent again, to this replica or another (a
        # request that crashes the replica it reaches would crash them all, one after another).
        forget(request, workload_id)
        raise ApiError(
            502,
            "bad_gateway",
            f"{target.described} closed the connection before answering ({exc or type(exc).__name__}): it "
            "crashed or was stopped while it had the request",
        ) from exc
    except httpx.TimeoutException as exc:
        forget(request, workload_id)
        raise ApiError(
            504, "gateway_timeout", f"{target.described} did not answer in time ({type(exc).__name__})"
        ) from exc
    except httpx.HTTPError as exc:
        forget(request, workload_id)
        raise _unreachable(target, exc) from exc


def _unreachable(target: ServiceTarget, exc: Exception) -> ApiError:
    if isinstance(exc, httpx.ConnectTimeout):
        return ApiError(
            504,
            "gateway_timeout",
            f"{target.described} did not accept a connection within {TIMEOUT.connect:g} s (ConnectTimeout): "
            "its process may be hung or its node overloaded",
        )
    return ApiError(
        502,
        "bad_gateway",
        f"{target.described} could not be reached ({exc or type(exc).__name__}); the service must "
        "listen on $GPUPOOL_PORT on all of its node's addresses (0.0.0.0), or on 127.0.0.1 when the "
        "head runs it on its own machine",
    )


def forget(request: HTTPConnection, workload_id: int) -> None:
    proxy_state(request).targets.pop(workload_id, None)


@router.api_route(
    "/workloads/{workload_id}/proxy",
    methods=METHODS,
    include_in_schema=False,
)
def proxy_root(request: Request, workload_id: int) -> RedirectResponse:
    return _to_root(request, Address(BY_ID, str(workload_id)))


@router.api_route(
    "/services/{name}/proxy",
    methods=METHODS,
    include_in_schema=False,
)
def proxy_by_name_root(request: Request, name: str) -> RedirectResponse:
    return _to_root(request, Address(BY_NAME, name))


def _to_root(request: Request, address: Address) -> RedirectResponse:
    query = request.url.query
    return RedirectResponse(f"{address.prefix}/" + (f"?{query}" if query else ""), status_code=307)


@router.api_route(
    "/workloads/{workload_id}/proxy/{path:path}",
    methods=METHODS,
    summary="Reach a running service: the request is passed to it, its answer streamed back",
    response_class=Response,
)
async def proxy(request: Request, workload_id: int, path: str) -> Response:
    return await _reached(request, workload_id, Address(BY_ID, str(workload_id)))


@router.api_route(
    "/services/{name}/proxy/{path:path}",
    methods=METHODS,
    summary="Reach the pending or running service of a name: as by its id, at an address that outlives it",
    response_class=Response,
)
async def proxy_by_name(request: Request, name: str, path: str) -> Response:
    address = Address(BY_NAME, name)
    workload_id, remembered = await by_name(request, name)
    try:
        return await _reached(request, workload_id, address)
    except (ServiceError, ApiError) as exc:
        if not remembered or exc.status not in GONE:
            raise
    # The service the name stood for a moment ago has ended (nothing was sent to it): the name is read
    # again, for the service submitted again under it, or for the reason there is none.
    proxy_state(request).names.pop(name, None)
    workload_id, _ = await by_name(request, name)
    return await _reached(request, workload_id, address)


async def _reached(request: Request, workload_id: int, address: Address) -> Response:
    """The service `workload_id`'s answer to `request`, once its `access` admits the caller."""
    public = await admit(request, workload_id, request.method)
    flight = InFlight(request.app.state.runtime.load, workload_id)  # the autoscaler's measure
    try:
        response = await _proxied(request, workload_id, address, flight)
        if public:
            # Anyone's browser may open a public service's pages, at the head's own origin: sandboxed,
            # they run as an origin of their own and cannot read the dashboard's token from its storage.
            response.raw_headers.append((b"content-security-policy", PUBLIC_SANDBOX))
        return response
    except BaseException:
        flight.done()
        raise


class InFlight:
    """One request counted by the autoscaler's `Load`: begun once it is passed on to a replica (`to`; a
    request refused before, no replica taking requests, is no load), ended once (`done`), when its answer
    has been sent whole, or the client went away, or it failed. Also counted per replica, which is stopped,
    when removed, once it has answered what it was given (`Load.draining`)."""

    __slots__ = ("began", "load", "open", "replica", "workload_id")

    def __init__(self, load: Load, workload_id: int) -> None:
        self.load = load
        self.workload_id = workload_id
        self.open = False
        self.began = 0.0
        self.replica: int | None = None

    def to(self, replica: int) -> None:
        """The request is passed on to the replica `replica` (again, to another, after a failed connect)."""
        if not self.open:
            self.open = True
            self.began = self.load.began(self.workload_id)
        if self.replica is not None:
            self.load.answered(self.replica)
        self.replica = replica
        self.load.sent(replica)

    def unreached(self) -> None:
        """Ended without reaching any replica: no load (`Load.withdraw`)."""
        if self.open:
            self.open = False
            self.load.withdraw(self.workload_id, self.began)
        self.done()

    def done(self) -> None:
        if self.open:
            self.open = False
            self.load.ended(self.workload_id)
        if self.replica is not None:
            self.load.answered(self.replica)
            self.replica = None


async def _streamed(answer: httpx.Response, flight: InFlight) -> AsyncIterator[bytes]:
    try:
        async for chunk in answer.aiter_raw():
            yield chunk
    finally:
        flight.done()


async def _close(answer: httpx.Response, flight: InFlight) -> None:
    flight.done()
    await answer.aclose()


async def _proxied(request: Request, workload_id: int, address: Address, flight: InFlight) -> Response:
    target, remembered = await next_target(request, workload_id)
    flight.to(target.workload_id)
    state = proxy_state(request)
    try:
        answer = await _send(request, workload_id, target, address)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        hit = state.targets.get(workload_id)
        others = hit is not None and any(t.endpoint != target.endpoint for t in hit[1])
        forget(request, workload_id)
        state.rest(target.endpoint)
        if not remembered and not others:
            flight.unreached()
            raise _unreachable(target, exc) from exc
        # Nothing reached the service (refused, or not accepted in time: a hung process): where its
        # replicas run is read afresh (this one may have ended, or started again on another port), and
        # the request is sent once more, to another replica when one takes requests, or refused as the
        # store's state says.
        try:
            target, _ = await next_target(request, workload_id, avoid=target.endpoint)
        except (ServiceError, ApiError):
            flight.unreached()
            raise
        flight.to(target.workload_id)
        try:
            answer = await _send(request, workload_id, target, address)
        except (httpx.ConnectError, httpx.ConnectTimeout) as again:
            forget(request, workload_id)
            state.rest(target.endpoint)
            flight.unreached()
            raise _unreachable(target, again) from again
    kept = [
        (name, value)
        for name, value in answer.headers.raw
        if name.decode("latin-1").lower() not in DROPPED_RESPONSE
    ]
    response = StreamingResponse(
        _streamed(answer, flight),
        status_code=answer.status_code,
        background=BackgroundTask(_close, answer, flight),
    )
    # Which replica answered: the workload that served it (a service's replicas each have their own id).
    response.raw_headers = [(n.lower(), v) for n, v in kept] + [
        (b"x-gpupool-workload", str(target.workload_id).encode())
    ]
    return response
