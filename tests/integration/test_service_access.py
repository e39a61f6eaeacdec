"""Who may reach a service through the head (spec `access`): its owner and admins by default, any token of
the head with `pool`, anyone with `public`; the same rules for HTTP, WebSocket and `gpupool forward`. A real
server, real services in real processes, real tokens."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.support.server import ServerProcess
from tests.support.services import (
    echo_as,
    forwarded_headers,
    headers_service,
    proxy_path,
    token_for,
)


def _as(server: ServerProcess, token: str | None) -> httpx.Client:
    return server.http(token)


def _refusal(client: httpx.Client, url: str, method: str = "GET") -> tuple[int, str]:
    response = client.request(method, url)
    return response.status_code, response.json()["error"]["message"]


def test_a_service_is_private_to_its_owner_unless_its_spec_opens_it(
    server: ServerProcess, tmp_path: Path
) -> None:
    alice = token_for(server, "alice")
    bob = token_for(server, "bob")
    viewer = token_for(server, "watcher", "--role", "viewer")

    private = echo_as(server, alice, tmp_path / "private")
    with _as(server, alice) as client:  # the owner reaches it
        assert client.get(proxy_path(private, "mine")).json()["path"] == "/mine"
    with _as(server, None) as client:
        status, said = _refusal(client, proxy_path(private, "x"))
        assert status == 401 and "missing bearer token" in said
    with _as(server, bob) as client:
        status, said = _refusal(client, proxy_path(private, "x"), "POST")
        assert status == 403, said
        assert f"workload {private} belongs to alice and is private" in said
        assert "access: pool" in said  # the fix
    with _as(server, viewer) as client:
        assert _refusal(client, proxy_path(private, "x"))[0] == 403
    with server.http() as client:  # an admin reaches anyone's; a private service is not sandboxed
        reached = client.get(proxy_path(private, "x"))
        assert reached.json()["path"] == "/x" and "content-security-policy" not in reached.headers
    shown = server.cli("show", str(private), check=True).stdout
    assert "(alice and admins)" in shown, shown

    pool = echo_as(server, alice, tmp_path / "pool", access="pool")
    with _as(server, bob) as client:
        posted = client.post(proxy_path(pool, "generate"), json={"prompt": "hi"})
        assert posted.status_code == 200 and posted.json()["method"] == "POST", posted.text
    with _as(server, viewer) as client:
        assert client.get(proxy_path(pool, "look")).json()["path"] == "/look"
        status, said = _refusal(client, proxy_path(pool, "x"), "POST")
        assert status == 403 and "viewer's, which may only read" in said
    with _as(server, None) as client:
        assert _refusal(client, proxy_path(pool, "x"))[0] == 401

    public = echo_as(server, alice, tmp_path / "public", access="public")
    with _as(server, None) as client:  # no token at all; the body is the service's, NUL and all
        posted = client.post(proxy_path(public, "v1"), content=b'{"text": "a\\u0000b"}')
        assert posted.status_code == 200, posted.text
        assert posted.json()["body"] == '{"text": "a\\u0000b"}'
        # anyone's browser may open it at the head's origin: sandboxed, away from the dashboard's token
        assert posted.headers["content-security-policy"].startswith("sandbox ")
        assert "allow-same-origin" not in posted.headers["content-security-policy"]
        # ids that name no workload, or a job, still need a token: nobody learns which exist
        assert _refusal(client, proxy_path(999_999, "x"))[0] == 401
    assert "(anyone, no token)" in server.cli("show", str(public), check=True).stdout

    # WebSocket handshakes follow the same rules; a viewer opens none (a WebSocket sends as well as reads)
    head = server.url.replace("http://", "ws://")
    for token, service in ((bob, private), (None, private), (viewer, pool)):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with pytest.raises(InvalidStatus) as refused:
            connect(head + proxy_path(service, "ws"), additional_headers=headers, open_timeout=10)
        assert refused.value.response.status_code == 403, token
    # admitted with no token: the head reaches the service, which (plain HTTP) refuses the upgrade itself
    with (
        connect(head + proxy_path(public, "ws"), open_timeout=10) as ws,
        pytest.raises(ConnectionClosed) as closed,
    ):
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
    assert "refused the WebSocket" in closed.value.rcvd.reason


def test_a_service_hears_who_called_from_the_head_and_never_from_the_client(
    server: ServerProcess, tmp_path: Path
) -> None:
    sid = headers_service(server, tmp_path)
    claimed = {
        "X-Forwarded-For": "203.0.113.9",
        "X-Forwarded-Host": "bank.example",
        "X-Forwarded-Proto": "https",
        "X-Forwarded-Prefix": "/elsewhere",
        "Forwarded": "for=203.0.113.9;host=bank.example",
    }
    head = {
        "x-forwarded-for": ["127.0.0.1"],
        "x-forwarded-host": [f"127.0.0.1:{server.port}"],
        "x-forwarded-proto": ["http"],
        "x-forwarded-prefix": [f"/api/v1/workloads/{sid}/proxy"],
    }
    with server.http() as client:
        deadline = time.time() + 30
        while (answer := client.get(proxy_path(sid, "who"), headers=claimed)).status_code != 200:
            assert answer.status_code in (502, 503) and time.time() < deadline, answer.text
            time.sleep(0.1)
    assert forwarded_headers(answer.text) == head
    with connect(
        server.url.replace("http://", "ws://") + proxy_path(sid, "who"),
        additional_headers={"Authorization": f"Bearer {server.token}", **claimed},
        open_timeout=10,
    ) as ws:
        assert forwarded_headers(str(ws.recv(timeout=10))) == head


def test_gpupool_forward_as_someone_else_is_refused_with_the_reason(
    server: ServerProcess, tmp_path: Path
) -> None:
    alice = token_for(server, "alice")
    bob = token_for(server, "bob")
    private = echo_as(server, alice, tmp_path / "svc")
    env = {**server.env, "GPUPOOL_TOKEN": bob}
    # refused at the start, not at each request it would pass on (it said "forwarding ... running")
    refused = subprocess.run(
        [sys.executable, "-m", "gpupool.main", "forward", str(private), "--port", "0"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 1 and refused.stdout == "", refused
    assert "belongs to alice and is private: only they or an admin may reach it (your token: bob)" in (
        refused.stderr
    ), refused.stderr


def test_access_on_a_job_or_unknown_is_refused_with_the_fix(server: ServerProcess) -> None:
    with server.http() as client:
        for body, said in (
            ({"commands": ["true"], "access": "pool"}, "applies to services only"),
            ({"kind": "service", "commands": ["true"], "access": "everyone"}, "is not one of"),
        ):
            refused = client.post("/api/v1/workloads", json=body)
            assert refused.status_code == 422, refused.text
            error = refused.json()["error"]
            assert error["field"] == "access" and said in error["message"], error
        assert client.get("/api/v1/workloads?all=true").json() == []  # nothing was made
    failed = server.cli("run", "--service", "--access", "world", "--", "true")
    assert failed.returncode != 0 and "access" in failed.stderr + failed.stdout
