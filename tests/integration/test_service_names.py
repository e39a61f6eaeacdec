"""A service reached by its name, `/api/v1/services/NAME/proxy/...`: the one pending or running service of
that name, at an address that stays when the service is cancelled and submitted again. A real server, real
services in real processes, real tokens."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.support import plain_http
from tests.support.process import kill_attempts_under
from tests.support.server import ServerProcess
from tests.support.services import (
    answer_of,
    echo_as,
    echo_service,
    forwarded_headers,
    forwarding,
    headers_service,
    token_for,
    wait_until,
)


def by_name(name: str, rest: str = "") -> str:
    return f"/api/v1/services/{name}/proxy/{rest}"


def _error(response: httpx.Response) -> str:
    return str(response.json()["error"]["message"])


def test_a_service_is_reached_by_its_name_and_the_name_follows_it_when_submitted_again(
    server: ServerProcess, tmp_path: Path
) -> None:
    first = echo_service(server, tmp_path, replicas=2)  # its replicas are one service: one name
    wait_until(server, first, lambda w: w["state"] == "running")
    with server.http() as client:
        echoed = answer_of(client, by_name("echo", "hello/world?x=1&y=two%20words"), "0")
        assert echoed["path"] == "/hello/world?x=1&y=two%20words"
        assert echoed["service_id"] == str(first) and echoed["x_test"] == "passed on"
        assert echoed["authorization"] is None, "the head's token must not reach the service"
        assert echoed["forwarded_prefix"] == "/api/v1/services/echo/proxy"

        posted = client.post(by_name("echo", "v1/generate"), json={"prompt": "hi"})
        assert posted.status_code == 200 and posted.json()["body"] == '{"prompt":"hi"}', posted.text
        root = client.get("/api/v1/services/echo/proxy", follow_redirects=True)
        assert root.status_code == 200 and root.json()["path"] == "/"
        with client.stream("GET", by_name("echo", "events"), timeout=10) as events:  # streamed as written
            parts = events.iter_text()
            assert next(parts) == "data: first\n\n"
            (tmp_path / "gate").touch()
            assert "".join(parts) == "data: second\n\n"

        shown = server.cli("show", str(first), check=True).stdout  # where to reach it, by id and by name
        assert f"  by name: {server.url}/api/v1/services/echo/proxy/\n" in shown, shown
        replicas = [r["id"] for r in server.workload(first)["replica_list"]]
        assert client.post(f"/api/v1/workloads/{first}/cancel").status_code == 202
        for replica in replicas:  # every replica ended: the name stands for no pending or running service
            server.wait_for(replica)
        ended = client.get(by_name("echo", "hello"))
        assert ended.status_code == 404, ended.text
        said = _error(ended)
        assert "no pending or running service is named 'echo'" in said
        assert f"(workload {first}, admin's) ended" in said and "(cancelled)" in said, said

        # submitted again, with a new id: the same address reaches it
        second = echo_service(server, tmp_path)
        again = answer_of(client, by_name("echo", "hello"), "0")
        assert again["job_id"] == str(second) != str(first)

        missing = client.get(by_name("nothing-here", "x"))
        assert missing.status_code == 404 and "no pending or running service is named" in _error(missing)
        assert client.get(by_name("Not_A_Name", "x")).status_code == 404


def test_a_websocket_by_name_passes_and_the_service_hears_the_by_name_prefix(
    server: ServerProcess, tmp_path: Path
) -> None:
    headers_service(server, tmp_path)
    prefix = ["/api/v1/services/headers/proxy"]
    with server.http() as client:
        deadline = time.time() + 30
        claimed = {"X-Forwarded-Prefix": "/elsewhere"}
        while (answer := client.get(by_name("headers", "who"), headers=claimed)).status_code != 200:
            assert answer.status_code in (502, 503) and time.time() < deadline, answer.text
            time.sleep(0.1)
    assert forwarded_headers(answer.text)["x-forwarded-prefix"] == prefix
    head = server.url.replace("http://", "ws://")
    auth = {"Authorization": f"Bearer {server.token}"}
    with connect(head + by_name("headers", "who"), additional_headers=auth, open_timeout=10) as ws:
        assert forwarded_headers(str(ws.recv(timeout=10)))["x-forwarded-prefix"] == prefix

    with pytest.raises(InvalidStatus) as refused:  # no token, a private service: refused at the handshake
        connect(head + by_name("headers", "who"), open_timeout=10)
    assert refused.value.response.status_code == 403
    with (
        connect(head + by_name("nothing-here", "x"), additional_headers=auth, open_timeout=10) as ws,
        pytest.raises(ConnectionClosed) as closed,
    ):
        ws.recv(timeout=10)  # a name no service has: closed at once with the reason
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert "no pending or running service is named" in closed.value.rcvd.reason


def test_a_name_several_users_share_reaches_the_callers_own_else_is_refused_with_the_ids(
    server: ServerProcess, tmp_path: Path
) -> None:
    alice, bob, carol = (token_for(server, who) for who in ("alice", "bob", "carol"))
    viewer = token_for(server, "watcher", "--role", "viewer")
    alices = echo_as(server, alice, tmp_path / "a", name="llm", access="pool")
    bobs = echo_as(server, bob, tmp_path / "b", name="llm", access="pool")
    for token, own in ((alice, alices), (bob, bobs)):
        with server.http(token) as client:
            assert client.get(by_name("llm", "x")).json()["job_id"] == str(own)
    for token in (carol, server.token):  # neither is theirs (an admin owns none either): 409 with the ids
        with server.http(token) as client:
            refused = client.get(by_name("llm", "x"))
            assert refused.status_code == 409, refused.text
            said = _error(refused)
            assert "2 pending or running services are named 'llm'" in said
            assert f"{alices} (alice), {bobs} (bob)" in said and "/api/v1/workloads/ID/proxy/" in said
            assert refused.json()["error"]["field"] == "name"
            assert client.get(f"/api/v1/workloads/{bobs}/proxy/x").status_code == 200  # by id: as ever
    with server.http(None) as anonymous:  # no token, no public service of the name: as for an unknown id
        assert anonymous.get(by_name("llm", "x")).status_code == 401
        assert anonymous.get(by_name("nothing-here", "x")).status_code == 401

    # one of the name: admitted by its `access`, exactly as by its id
    private = echo_as(server, alice, tmp_path / "p", name="notebook")
    with server.http(bob) as client:
        refused = client.get(by_name("notebook", "x"))
        assert refused.status_code == 403 and f"workload {private} belongs to alice" in _error(refused)
    with server.http(alice) as client:
        assert client.get(by_name("notebook", "x")).json()["job_id"] == str(private)
    pool = echo_as(server, alice, tmp_path / "q", name="shared", access="pool")
    with server.http(viewer) as client:
        assert client.get(by_name("shared", "x")).json()["job_id"] == str(pool)
        assert client.post(by_name("shared", "x")).status_code == 403  # a viewer only reads
    public = echo_as(server, alice, tmp_path / "o", name="open", access="public")
    with server.http(None) as anonymous:
        reached = anonymous.get(by_name("open", "x"))
        assert reached.json()["job_id"] == str(public)
        assert reached.headers["content-security-policy"].startswith("sandbox ")


def test_without_a_token_unknown_names_are_counted_and_a_public_name_is_read_once_a_second(
    tmp_path: Path,
) -> None:
    server = ServerProcess(
        home=tmp_path / "home", extra_args=["--rate-limit", "1", "--rate-burst", "3"]
    ).start()
    try:
        alice = token_for(server, "alice")
        echo_as(server, alice, tmp_path / "o", name="open", access="public")
        with server.http(None) as anonymous:
            time.sleep(3.5)  # a full bucket
            codes = [anonymous.get(by_name(f"nope-{i}", "")).status_code for i in range(4)]
            assert codes == [401, 401, 401, 429], codes  # each a store read: counted by address
            # a name just found missing is not read again (401 from memory, not counted)
            assert [anonymous.get(by_name("nope-0", "")).status_code for _ in range(5)] == [401] * 5
            time.sleep(3.5)
            # a public service by name: its name read once a TARGET_TTL, far within the bucket
            codes = [anonymous.get(by_name("open", "x")).status_code for _ in range(40)]
            assert codes == [200] * 40, codes
    finally:
        server.stop()
        kill_attempts_under(tmp_path)


def test_gpupool_forward_by_name_follows_the_service_when_it_is_submitted_again(
    server: ServerProcess, tmp_path: Path
) -> None:
    first = echo_service(server, tmp_path)
    with server.http() as client:
        answer_of(client, by_name("echo", "up"), "0")
    with forwarding(server, "echo") as said:
        assert "by its name, so a resubmitted one too" in said, said
        local = said.split()[1]  # http://127.0.0.1:PORT/
        with plain_http.client(base_url=local, timeout=30) as plain:
            assert plain.get("hello").json()["service_id"] == str(first)
            server.cli("cancel", str(first), check=True)
            server.wait_for(first)
            again = echo_service(server, tmp_path)
            deadline = time.time() + 30
            while True:  # the forwarder goes on, to the new service
                got = plain.get("hello")
                if got.status_code == 200 and got.json()["service_id"] == str(again):
                    break
                assert got.status_code in (404, 502, 503) and time.time() < deadline, got.text
                time.sleep(0.2)
