"""A service listens on $GPUPOOL_PORT and is reached through the head at one address that follows it when
it starts again on another port: a real server, a real HTTP service in a real process, real requests."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.support import plain_http
from tests.support.agent import start_pool
from tests.support.process import kill_attempts_under
from tests.support.server import ServerProcess
from tests.support.services import answer_of, echo_service, forwarding, proxy_path, wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_a_service_is_reached_through_the_head_and_followed_across_a_restart(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=["--restart-backoff", "0"]).start()
    try:
        sid = echo_service(server, tmp_path)
        with server.http() as client:
            first = answer_of(client, proxy_path(sid, "hello/world?x=1&y=two%20words"), "0")
            assert first["method"] == "GET"
            assert first["path"] == "/hello/world?x=1&y=two%20words"
            assert first["x_test"] == "passed on"
            assert first["authorization"] is None, "the head's token must not reach the service"
            assert first["forwarded_prefix"] == f"/api/v1/workloads/{sid}/proxy"

            shown = server.workload(sid)
            assert shown["endpoint"] == f"127.0.0.1:{first['port']}"
            assert shown["attempt_list"][0]["endpoint"] == shown["endpoint"]

            posted = client.post(proxy_path(sid, "v1/generate"), json={"prompt": "hi"})
            assert posted.status_code == 200, posted.text
            assert posted.json()["method"] == "POST"
            assert posted.json()["body"] == '{"prompt":"hi"}'

            # the service's own answers pass as they are, errors included
            missing = client.get(proxy_path(sid, "missing"))
            assert missing.status_code == 404 and missing.json()["path"] == "/missing"
            root = client.get(f"/api/v1/workloads/{sid}/proxy", follow_redirects=True)
            assert root.status_code == 200 and root.json()["path"] == "/"

            # an answer is streamed as the service writes it: the first event arrives while the service
            # still holds back the second (a buffering proxy would time out here)
            with client.stream("GET", proxy_path(sid, "events"), timeout=10) as events:
                assert events.headers["content-type"] == "text/event-stream"
                parts = events.iter_text()
                assert next(parts) == "data: first\n\n"
                (tmp_path / "gate").touch()
                assert "".join(parts) == "data: second\n\n"

            # killed, it starts again on a port of its own; the address through the head stays
            pid = shown["attempt_list"][0]["pid"]
            os.killpg(pid, signal.SIGKILL)
            second = answer_of(client, proxy_path(sid, "again"), "1")
            assert second["path"] == "/again"
            assert server.workload(sid)["endpoint"] == f"127.0.0.1:{second['port']}"

            shown_text = server.cli("show", str(sid), check=True).stdout
            assert f"endpoint: http://127.0.0.1:{second['port']}" in shown_text
            assert f"/api/v1/workloads/{sid}/proxy/" in shown_text

        with server.http(token=None) as anonymous:
            refused = anonymous.get(proxy_path(sid, "hello"))
            assert refused.status_code == 401, refused.text

        with server.http() as client:
            assert client.post(f"/api/v1/workloads/{sid}/cancel").status_code == 202
            server.wait_for(sid, timeout=30)
            ended = client.get(proxy_path(sid, "hello"))
            assert ended.status_code == 409, ended.text
            assert "has ended (cancelled)" in ended.json()["error"]["message"]
    finally:
        server.stop()
        kill_attempts_under(tmp_path)


def test_the_proxy_refuses_jobs_unknown_ids_and_services_that_do_not_listen(server: ServerProcess) -> None:
    job = server.submit({"name": "batch", "commands": ["sleep 30"], "resources": {"gpu": 1}})
    deaf = server.submit(
        {"kind": "service", "name": "deaf", "commands": ["sleep 60"], "resources": {"gpu": 1}}
    )
    server.wait_for(deaf["id"], states=("running",))
    with server.http() as client:
        refused = client.get(proxy_path(job["id"], "x"))
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert "is a job; only a service has an endpoint" in error["message"]
        assert error["field"] == "kind"

        unknown = client.get(proxy_path(999_999, "x"))
        assert unknown.status_code == 404 and "no workload with id 999999" in unknown.text

        silent = client.get(proxy_path(deaf["id"], "x"))
        assert silent.status_code == 502, silent.text
        message = silent.json()["error"]["message"]
        assert "service deaf" in message and "must listen on $GPUPOOL_PORT" in message
        assert server.workload(job["id"])["endpoint"] is None
        assert server.workload(deaf["id"])["endpoint"].startswith("127.0.0.1:")


def test_a_pending_service_is_unavailable_with_the_reason(server: ServerProcess) -> None:
    big = server.submit(
        {"kind": "service", "name": "big", "commands": ["sleep 60"], "resources": {"gpu": 64}}
    )
    server.wait_for_reason(big["id"])
    with server.http() as client:
        waiting = client.get(proxy_path(big["id"], "x"))
        assert waiting.status_code == 503, waiting.text
        message = waiting.json()["error"]["message"]
        assert "service big" in message and "is pending" in message and "gpupool show" in message


def test_a_service_on_an_agent_listens_on_a_port_of_its_nodes_range_and_is_reached_through_the_head(
    tmp_path: Path,
) -> None:
    pool = start_pool(tmp_path, 1, gpus="sim:2xH100")
    server = pool.server
    try:
        sid = echo_service(server, tmp_path)
        with server.http() as client:
            answer = answer_of(client, proxy_path(sid, "on/agent"), "0")
        assert answer["path"] == "/on/agent"
        low, high = map(int, pool.agent("agent-0").rendezvous_ports.split("-"))
        assert low <= int(answer["port"]) <= high, "GPUPOOL_PORT comes from the node's --rendezvous-ports"
        assert server.workload(sid)["endpoint"] == f"127.0.0.1:{answer['port']}"
    finally:
        pool.stop()
        kill_attempts_under(tmp_path)


def test_a_service_with_a_readiness_probe_is_reached_only_once_the_probe_answers_2xx(
    server: ServerProcess, tmp_path: Path
) -> None:
    sid = echo_service(server, tmp_path, name="slow-start", readiness_probe="/health")
    # running, listening, and answering /health with 503: not ready, and the proxy says why
    w = wait_until(server, sid, lambda w: w["readiness"] == "GET /health answered 503")
    assert w["state"] == "running" and w["ready"] is False
    with server.http() as client:
        refused = client.get(proxy_path(sid, "hello"))
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "service slow-start" in message and "is not ready" in message
        assert "GET /health answered 503" in message and "answers 2xx or 3xx" in message
        assert "ready: no (GET /health answered 503)" in server.cli("show", str(sid), check=True).stdout

        (tmp_path / "ready").touch()
        w = wait_until(server, sid, lambda w: w["ready"] is True)
        assert w["readiness"] == "GET /health answered 200"
        passed = client.get(proxy_path(sid, "hello"))
        assert passed.status_code == 200 and passed.json()["path"] == "/hello"
        listed = {x["id"]: x for x in client.get("/api/v1/workloads").json()}
        assert listed[sid]["ready"] is True


def test_a_readiness_probe_on_a_job_or_not_a_path_is_refused_with_the_fix(server: ServerProcess) -> None:
    with server.http() as client:
        job = client.post("/api/v1/workloads", json={"commands": ["true"], "readiness_probe": "/health"})
        assert job.status_code == 422, job.text
        assert job.json()["error"]["field"] == "readiness_probe"
        assert "applies to services only" in job.json()["error"]["message"]
        bad = client.post(
            "/api/v1/workloads",
            json={"kind": "service", "commands": ["true"], "readiness_probe": "health"},
        )
        assert bad.status_code == 422 and "starts with /" in bad.json()["error"]["message"]
        assert client.get("/api/v1/workloads", params={"all": True}).json() == []
    refused = server.cli("run", "--readiness-probe", "/health", "--", "true")
    assert refused.returncode != 0 and "applies to services only" in refused.stderr


def test_the_example_service_loads_then_answers_through_the_head(server: ServerProcess) -> None:
    done = server.cli("submit", str(ROOT / "examples" / "services" / "serve.yaml"), "--json", check=True)
    sid = json.loads(done.stdout)["id"]
    loading = wait_until(server, sid, lambda w: w["readiness"] == "GET /health answered 503")
    assert loading["ready"] is False
    wait_until(server, sid, lambda w: w["ready"] is True)
    with server.http() as client:
        answer = client.post(proxy_path(sid, "v1/generate"), json={"prompt": "gpupool"})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"text": "loopupg", "gpus": "0", "attempt": "0", "replica": "0"}


def test_gpupool_forward_serves_the_service_at_the_root_of_a_local_address(
    server: ServerProcess, tmp_path: Path
) -> None:
    sid = echo_service(server, tmp_path)
    job = server.submit({"name": "batch", "commands": ["sleep 30"]})
    with server.http() as client:
        answer_of(client, proxy_path(sid, "up"), "0")
    refused = server.cli("forward", str(job["id"]))
    assert refused.returncode == 1 and "is a job; only a service has an endpoint" in refused.stderr

    with forwarding(server, str(sid)) as said:
        assert "to service echo (workload" in said and "running" in said, said
        local = said.split()[1]  # http://127.0.0.1:PORT/
        with plain_http.client(base_url=local, timeout=30) as plain:  # no token: the forwarder adds it
            got = plain.get("lab/tree?x=1", headers={"X-Test": "passed on"})
            assert got.status_code == 200, got.text
            assert got.json()["path"] == "/lab/tree?x=1" and got.json()["x_test"] == "passed on"
            assert got.json()["authorization"] is None
            posted = plain.post("v1/generate", json={"prompt": "hi"})
            assert posted.json()["body"] == '{"prompt":"hi"}'
            with plain.stream("GET", "events") as events:
                parts = events.iter_text()
                assert next(parts) == "data: first\n\n"
                (tmp_path / "gate").touch()
                assert "".join(parts) == "data: second\n\n"
    server.cli("cancel", str(sid), check=True)
    server.wait_for(sid)
    ended = server.cli("forward", str(sid), "--port", "0")  # by id: refused at once, as by name
    assert ended.returncode == 1 and "has ended (cancelled) and serves no more" in ended.stderr, ended.stderr


# A WebSocket service: it says which path it was opened at, then sends every message back.
WS_ECHO = """
import asyncio, os
from websockets.asyncio.server import serve

async def echo(ws):
    await ws.send("opened at " + ws.request.path)
    async for message in ws:
        await ws.send(message)

async def main():
    async with serve(echo, "0.0.0.0", int(os.environ["GPUPOOL_PORT"]), max_size=None) as server:
        await server.serve_forever()

asyncio.run(main())
"""


def _talk(url: str, headers: dict[str, str]) -> list[str | bytes]:
    """Open a WebSocket (retrying while the service starts), send a text and a binary message, and return
    the three messages heard."""
    deadline = time.time() + 30
    while True:
        try:
            with connect(url, additional_headers=headers, open_timeout=10) as ws:
                heard = [ws.recv(timeout=10)]
                ws.send("hello")
                heard.append(ws.recv(timeout=10))
                ws.send(b"\x00\x01binary")
                heard.append(ws.recv(timeout=10))
                return heard
        except (ConnectionClosed, OSError) as exc:
            assert time.time() < deadline, f"no WebSocket at {url}: {exc!r}"
            time.sleep(0.2)


def test_a_websocket_passes_through_the_head_and_gpupool_forward(
    server: ServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "ws.py").write_text(WS_ECHO)
    created = server.submit(
        {
            "kind": "service",
            "name": "ws",
            "workdir": str(tmp_path),
            "commands": [f"exec {sys.executable} ws.py"],
        }
    )
    sid = created["id"]
    server.wait_for(sid, states=("running",))
    head = server.url.replace("http://", "ws://") + proxy_path(sid, "socket?x=1")
    auth = {"Authorization": f"Bearer {server.token}"}
    assert _talk(head, auth) == ["opened at /socket?x=1", "hello", b"\x00\x01binary"]

    with pytest.raises(InvalidStatus) as refused:
        connect(head, open_timeout=10)  # no token: the handshake is refused
    assert refused.value.response.status_code == 403

    job = server.submit({"name": "batch", "commands": ["sleep 30"]})
    pending = server.submit(
        {"kind": "service", "name": "big", "resources": {"gpu": 64}, "commands": ["true"]}
    )
    deaf = server.submit({"kind": "service", "name": "deaf", "commands": ["sleep 60"]})
    server.wait_for_reason(pending["id"])
    server.wait_for(deaf["id"], states=("running",))
    for workload, code, said in ((job, 1008, "is a job"), (pending, 1013, "is pending"),
                                 (deaf, 1011, "refused the WebSocket")):  # fmt: skip
        url = server.url.replace("http://", "ws://") + proxy_path(workload["id"], "x")
        with (
            connect(url, additional_headers=auth, open_timeout=10) as ws,
            pytest.raises(ConnectionClosed) as closed,
        ):
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None, workload
        assert closed.value.rcvd.code == code and said in closed.value.rcvd.reason, closed.value.rcvd

    with forwarding(server, str(sid)) as said:
        local = said.split()[1].replace("http://", "ws://")
        assert _talk(local + "chat", {}) == ["opened at /chat", "hello", b"\x00\x01binary"]


HANGS_UP = """
import http.server, os

class HangsUp(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # reads the request and closes the connection without a word
        self.close_connection = True

http.server.HTTPServer(("0.0.0.0", int(os.environ["GPUPOOL_PORT"])), HangsUp).serve_forever()
"""


def test_a_service_that_closes_the_connection_before_answering_is_told_apart_from_one_not_listening(
    server: ServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "hangs_up.py").write_text(HANGS_UP)
    hangs_up = server.submit(
        {"kind": "service", "name": "hangs-up", "workdir": str(tmp_path),
         "commands": [f"exec {sys.executable} hangs_up.py"]}
    )  # fmt: skip
    server.wait_for(hangs_up["id"], states=("running",))
    with server.http() as client:
        deadline = time.time() + 30
        while True:
            answer = client.get(proxy_path(hangs_up["id"], "x"))
            message = answer.json()["error"]["message"]
            if ("must listen" not in message and "is starting" not in message) or time.time() > deadline:
                break
            time.sleep(0.1)  # not launched or not listening yet (a loaded machine takes a while)
        assert answer.status_code == 502, answer.text
        assert "closed the connection before answering" in message and "crashed or was stopped" in message
        assert "must listen on $GPUPOOL_PORT" not in message


HALF_HANGS_UP = """
import http.server, json, os

class HalfHangsUp(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self):  # replica 1 reads the request and closes the connection without a word
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if os.environ["GPUPOOL_REPLICA"] == "1":
            self.close_connection = True
            return
        out = json.dumps({"replica": os.environ["GPUPOOL_REPLICA"], "method": self.command}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_DELETE = answer

http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["GPUPOOL_PORT"])), HalfHangsUp).serve_forever()
"""


def test_a_request_a_replica_hung_up_on_is_not_sent_to_another(tmp_path: Path) -> None:
    """It may have acted on it, and a request that crashes the replica it reaches would crash them all."""
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        (tmp_path / "half.py").write_text(HALF_HANGS_UP)
        sid = server.submit(
            {"kind": "service", "name": "half", "replicas": 2, "workdir": str(tmp_path),
             "commands": [f"exec {sys.executable} half.py"]}
        )["id"]  # fmt: skip
        shown = wait_until(
            server, sid, lambda w: [r["state"] for r in w["replica_list"]].count("running") == 2
        )
        for replica in shown["replica_list"]:
            _listening(server.workload(replica["id"])["endpoint"])
        with server.http() as client:
            answers = [client.get(proxy_path(sid, "x")) for _ in range(4)]
        assert sorted(a.status_code for a in answers) == [200, 200, 502, 502], [a.text for a in answers]
        for answer in answers:
            if answer.status_code == 200:
                assert answer.json()["replica"] == "0"
            else:
                refused = answer.json()["error"]["message"]
                assert "replica 1" in refused and "closed the connection before answering" in refused
    finally:
        server.stop()
        kill_attempts_under(tmp_path)


def _listening(endpoint: str) -> None:
    """Once `endpoint` accepts a connection (a loaded machine starts a replica late)."""
    host, port = endpoint.split(":")
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listened on {endpoint}"
            time.sleep(0.1)


def test_a_pending_service_is_refused_with_its_live_reason_and_when_its_backoff_ends(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=["--restart-backoff", "3"]).start()
    try:
        crashes = server.submit({"kind": "service", "name": "crashes", "commands": ["exit 1"]})
        waiting = wait_until(
            server,
            crashes["id"],
            lambda w: w["reason_code"] == "restart-backoff" and "2 times in a row" in w["reason"],
        )
        with server.http() as client:
            refused = client.get(proxy_path(crashes["id"], "x"))
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert waiting["reason"] in message, (waiting["reason"], message)
        assert 1 <= int(refused.headers["retry-after"]) <= 7

        big = server.submit(
            {"kind": "service", "name": "big", "commands": ["sleep 60"], "resources": {"gpu": 64}}
        )
        wait_until(server, big["id"], lambda w: w["reason_code"] == "too-large")
        with server.http() as client:
            never = client.get(proxy_path(big["id"], "x"))
        assert never.status_code == 503 and "can never fit this pool" in never.json()["error"]["message"]
        assert "retry-after" not in never.headers
    finally:
        server.stop()


def test_a_hung_replica_is_passed_over_and_rested_after_its_connection_times_out(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        sid = echo_service(server, tmp_path, replicas=2)
        shown = wait_until(
            server, sid, lambda w: [r["state"] for r in w["replica_list"]].count("running") == 2
        )
        hung = server.workload(shown["replica_list"][1]["id"])
        host, port = hung["endpoint"].split(":")
        # listening first: else the connects below are refused, not left waiting, and say nothing of a
        # full queue
        _listening(hung["endpoint"])
        # the replica's process stopped, and its accept queue filled: a new connection is never accepted
        os.killpg(hung["attempt_list"][-1]["pid"], signal.SIGSTOP)
        held = []
        for _ in range(64):
            sock = socket.socket()
            sock.settimeout(0.3)
            try:
                sock.connect((host, int(port)))
            except OSError:
                sock.close()
                break
            held.append(sock)
        else:
            pytest.skip("this machine's TCP accept queue never filled")
        try:
            with server.http() as client:
                began = time.monotonic()
                answers = [client.get(proxy_path(sid, "x"), timeout=30) for _ in range(6)]
                took = time.monotonic() - began
            assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
            assert {a.json()["replica"] for a in answers} == {"0"}
            # at most one connect waited out (5 s); the replica rested after it
            assert took < 9, took
        finally:
            for sock in held:
                sock.close()
            os.killpg(hung["attempt_list"][-1]["pid"], signal.SIGCONT)
    finally:
        server.stop()
        kill_attempts_under(tmp_path)
