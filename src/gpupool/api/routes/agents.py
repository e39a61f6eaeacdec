"""Node agents: join tokens (admin), registration and the heartbeat long-poll (node credentials), drain.

Agents authenticate with their node credential, not an API token, so `agent_router` is mounted outside
the API-token dependency; `admin_router` is mounted inside it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from fastapi import APIRouter, Body, Depends, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.exc import OperationalError
from starlette.datastructures import State
from starlette.types import ASGIApp, Receive, Scope, Send

from gpupool.api.auth import admin_only
from gpupool.api.body import fields, text
from gpupool.api.errors import ApiError
from gpupool.backends.agent import AgentBackend
from gpupool.backends.agent_heartbeats import UnknownNode
from gpupool.backends.agent_records import BadRegistration, check_description, parse_devices, parse_ports
from gpupool.backends.base import InventoryNode
from gpupool.control import agents, nodes
from gpupool.control.tokens import Caller, hash_token
from gpupool.spec import parse_duration
from gpupool.store.db import Store, driver_error_line

agent_router = APIRouter(prefix="/api/v1/agents", tags=["agents"])
admin_router = APIRouter(tags=["agents"])

log = logging.getLogger(__name__)

CREDENTIAL_CACHE_SECONDS = 30.0
MISS_RELOAD_SECONDS = 1.0
# While the store cannot be read, the credentials last read keep answering heartbeats (an agent's liveness
# needs no store: a PostgreSQL restart must not make agents kill their work after their orphan grace),
# and the store is tried again this often.
STORE_RETRY_SECONDS = 5.0
MAX_WAIT = 5.0  # seconds a heartbeat may be held
HEARTBEAT_PATH = agent_router.prefix + "/heartbeat"


def _backend(request: Request) -> AgentBackend:
    return _agent_backend(request.app.state)


def _agent_backend(state: State) -> AgentBackend:
    backend = state.runtime.backend
    if not isinstance(backend, AgentBackend):
        raise ApiError(
            409,
            "no_agents",
            f"this head runs work with --backend {backend.name} and takes no agents; start it with "
            "--backend agent (or --gpus none)",
        )
    return backend


class NodeCredentials:
    """Which agent node each credential belongs to, for the heartbeat path: all of them read in one query,
    again every CREDENTIAL_CACHE_SECONDS and, at most once a second, when an unknown credential shows up
    (a node that just joined through another head process, or a bad credential). A node that registers
    through this head is updated at once, so its old credential stops working at once. One query per
    refresh instead of one per agent: the agents' entries no longer expire together in a burst."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._loaded = float("-inf")
        self._lock = threading.Lock()

    def name(self, store: Store, credential: str) -> str | None:
        digest = hash_token(credential)
        now = time.monotonic()
        if now - self._loaded > CREDENTIAL_CACHE_SECONDS:
            self._reload(store, now)
        found = self._names.get(digest)
        if found is None and now - self._loaded > MISS_RELOAD_SECONDS:
            self._reload(store, now)
            found = self._names.get(digest)
        return found

    def registered(self, name: str, credential: str | None) -> None:
        """`name` registered: a newly issued credential replaces its old one."""
        if credential is None:
            return
        with self._lock:
            names = {digest: node for digest, node in self._names.items() if node != name}
            names[hash_token(credential)] = name
            self._names = names

    def _reload(self, store: Store, now: float) -> None:
        with self._lock:
            if now - self._loaded <= MISS_RELOAD_SECONDS:
                return  # another request just did
            try:
                self._names = agents.credential_names(store)
            except OperationalError as exc:
                if self._loaded == float("-inf"):
                    raise  # nothing read yet: the API's 503 store_unavailable
                log.warning("event=node_credentials_stale error=%s", driver_error_line(exc))
                self._loaded = time.monotonic() - CREDENTIAL_CACHE_SECONDS + STORE_RETRY_SECONDS
                return
            self._loaded = time.monotonic()


def _node(state: State, authorization: str) -> str:
    """The agent node a bearer node credential belongs to (see NodeCredentials)."""
    scheme, _, credential = authorization.partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        raise ApiError(401, "unauthorized", "missing node credential: register with a join token first")
    credentials: NodeCredentials = state.node_credentials
    name = credentials.name(state.runtime.store, credential)
    if name is None:
        raise ApiError(
            401,
            "unauthorized",
            "invalid node credential: it matches no node of this head; "
            "start the agent again with a new --join-token",
        )
    return name


@agent_router.post("/register", summary="An agent joins (join token) or comes back (node credential)")
def register(request: Request, body: dict[str, Any] = Body(...)) -> dict[str, Any]:
    backend = _backend(request)
    info = {} if body.get("info") is None else body["info"]
    try:  # before the store admits the node: a refused description changes nothing
        for field in ("name", "join_token", "credential"):
            if not isinstance(body.get(field), str | None):
                raise BadRegistration(field, f"{body[field]!r} is not text")
        if not isinstance(info, dict):
            raise BadRegistration("info", "must be an object describing the node (cpus, gpus, devices, ...)")
        check_description(info)
        parse_devices(info.get("devices"))
        parse_ports(info.get("rendezvous_ports"))
    except BadRegistration as exc:
        raise ApiError(422, "invalid_request", str(exc), field=exc.field) from exc
    name = body.get("name") or ""
    runtime = request.app.state.runtime
    address = request.client.host if request.client else "127.0.0.1"
    answer: dict[str, Any] = {}

    def described() -> InventoryNode:  # once the store admitted the node: the backend takes it in
        answer.update(backend.register(name, dict(info), address))
        return backend.registered(name)

    with runtime.reconciler.inventory_lock:  # no inventory taken before this join is applied after it
        credential = agents.register(
            runtime.store,
            name,
            join_token=body.get("join_token") or None,
            credential=body.get("credential") or None,
            described=described,
            still_held=lambda: backend.still_held(name),
        )
        request.app.state.node_credentials.registered(name, credential)
    if credential is not None:
        answer["credential"] = credential
    return answer


@agent_router.post("/heartbeat", summary="Report what runs; held until the node's desired state changes")
async def heartbeat(request: Request) -> Response:
    """Documents the endpoint; HeartbeatEndpoint answers it before FastAPI's routing (the same code)."""
    answer = await answer_heartbeat(
        request.app.state, request.headers.get("authorization", ""), await request.body()
    )
    return Response(answer, media_type="application/json")


async def answer_heartbeat(state: State, authorization: str, raw: bytes) -> bytes:
    """The hot path (every agent, every second): the report is taken in on the event loop unless it
    carries logs or ends (file writes), and the answer is written as plain JSON. Raises ApiError."""
    backend = _agent_backend(state)
    name = _node(state, authorization)
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", f"heartbeat body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(422, "invalid_request", "heartbeat body must be a JSON object")
    writes = bool(body.get("logs")) or any(a.get("state") != "running" for a in body.get("attempts") or [])
    try:
        if writes:
            answer, version = await run_in_threadpool(backend.heartbeat, name, body)
        else:
            answer, version = backend.heartbeat(name, body)
    except UnknownNode as exc:
        message = f"node {name} must register again (the head restarted)"
        raise ApiError(409, "register_again", message) from exc
    wait = min(MAX_WAIT, max(0.0, float(body.get("wait") or 0.0)))
    if wait > 0:
        await backend.wait_for_change(name, version, wait)
        logs = answer["logs"]
        known = {(int(a["attempt_id"]), int(a["rank"])) for a in body.get("attempts") or []}
        answer, version = backend.desired(name, known)
        answer["logs"] = logs
    # The node's version when the answer was written (it grows with every change of the node's desired
    # state): an agent's long-poll and its exit report can be answered in one order and arrive in the
    # other, and the agent applies no answer older than one it has applied.
    answer["version"] = version
    return json.dumps(answer).encode()


class HeartbeatEndpoint:
    """ASGI middleware that answers `POST /api/v1/agents/heartbeat` itself, ahead of FastAPI's routing,
    dependency and exception layers: a thousand agents call it every second, and those layers cost the
    head about twice the work of the heartbeat itself (docs/benchmarks.md#agents). Every other request
    passes through untouched. Errors keep the API's JSON shape."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != HEARTBEAT_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        authorization, length = "", 0
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value.decode("latin-1")
            elif key == b"content-length" and value.isdigit():
                length = int(value)
        status, headers = 200, [(b"content-type", b"application/json")]
        try:
            if length > self.limit:
                raise ApiError(413, "too_large", f"heartbeat body over the {self.limit}-byte limit")
            raw = await self._body(receive)
            payload = await answer_heartbeat(scope["app"].state, authorization, raw)
        except ApiError as exc:
            status = exc.status
            error = {"code": exc.code, "message": exc.message, **exc.extra}  # the API's error shape
            payload = json.dumps({"error": error}).encode()
            if status == 401:
                headers.append((b"www-authenticate", b"Bearer"))
        except OperationalError as exc:  # as the API answers it (api/errors.py), without a traceback
            status = 503
            message = f"the server cannot reach its store ({driver_error_line(exc)}); try again shortly"
            payload = json.dumps({"error": {"code": "store_unavailable", "message": message}}).encode()
            headers.append((b"retry-after", b"5"))
        headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _body(self, receive: Receive) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ApiError(400, "invalid_request", "the agent closed the connection mid-request")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                raise ApiError(413, "too_large", f"heartbeat body over the {self.limit}-byte limit")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)


@admin_router.post("/join-tokens", status_code=201, summary="Create a join token (shown once)")
def create_join_token(
    request: Request, body: dict[str, Any] | None = Body(None), caller: Caller = Depends(admin_only)
) -> dict[str, Any]:
    body = fields(body, ("ttl", "description", "gpus"))
    ttl = body.get("ttl")
    if "ttl" not in body:  # one that never expires is asked for: "never" (or null)
        seconds: float | None = agents.DEFAULT_JOIN_TTL
    else:
        seconds = parse_duration(ttl, "ttl") if ttl not in (None, "", "never") else None
    description = text(body, "description", example="rack 12") or ""
    return agents.create_join_token(
        request.app.state.runtime.store, seconds, description, gpus=body.get("gpus"), actor=caller.name
    )


@admin_router.get("/join-tokens", summary="Join tokens (never the tokens themselves)")
def list_join_tokens(request: Request) -> list[dict[str, Any]]:
    return agents.list_join_tokens(request.app.state.runtime.store)


@admin_router.post("/join-tokens/{ident}/revoke", summary="Revoke a join token by id or prefix")
def revoke_join_token(request: Request, ident: str, caller: Caller = Depends(admin_only)) -> dict[str, Any]:
    return agents.revoke_join_token(request.app.state.runtime.store, ident, actor=caller.name)


@admin_router.post(
    "/nodes/{name}/drain", summary="Evict a node's work (grace period, requeued) and cordon it"
)
def drain(
    request: Request,
    name: str,
    body: dict[str, Any] | None = Body(None),
    caller: Caller = Depends(admin_only),
) -> dict[str, Any]:
    runtime = request.app.state.runtime
    reason = text(fields(body, ("reason",)), "reason", example="replace GPU 3") or f"drained by {caller.name}"
    result = nodes.drain_node(runtime.store, name, reason, actor=caller.name)
    runtime.wake()
    return result
