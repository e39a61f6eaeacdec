"""A real HTTP service for the tests of services and the head's proxy: it answers every request with what
it received and which workload, attempt and replica received it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.support.server import ServerProcess

ECHO = """
import http.server, json, os, time

class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def stream(self):  # one event now, the next once the file "gate" exists in the workdir
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in (b"data: first\\n\\n", b"data: second\\n\\n"):
            self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(event), event))
            self.wfile.flush()
            while not os.path.exists("gate"):
                time.sleep(0.05)
        self.wfile.write(b"0\\r\\n\\r\\n")

    def health(self):  # ready once the file "ready" (or "ready-R" for replica R) exists in the workdir
        ready = os.path.exists("ready") or os.path.exists("ready-" + os.environ.get("GPUPOOL_REPLICA", ""))
        self.send_response(200 if ready else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def answer(self):
        if self.path == "/events":
            return self.stream()
        if self.path == "/health":
            return self.health()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        out = json.dumps({
            "method": self.command, "path": self.path, "body": body,
            "attempt": os.environ["GPUPOOL_ATTEMPT"], "port": os.environ["GPUPOOL_PORT"],
            "authorization": self.headers.get("Authorization"), "x_test": self.headers.get("X-Test"),
            "forwarded_prefix": self.headers.get("X-Forwarded-Prefix"),
            "job_id": os.environ["GPUPOOL_JOB_ID"], "replica": os.environ.get("GPUPOOL_REPLICA"),
            "service_id": os.environ.get("GPUPOOL_SERVICE_ID"),
        }).encode()
        self.send_response(404 if self.path.startswith("/missing") else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("X-Service", "echo")
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_DELETE = answer

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["GPUPOOL_PORT"])), Echo).serve_forever()
"""


def echo_service(server: ServerProcess, workdir: Path, **spec: Any) -> int:
    """Submit the echo service (its program written into `workdir`); its id."""
    (workdir / "echo.py").write_text(ECHO)
    created = server.submit(
        {
            "kind": "service",
            "name": "echo",
            "resources": {"gpu": 1},
            "workdir": str(workdir),
            "commands": [f"exec {sys.executable} echo.py"],
            **spec,
        }
    )
    return int(created["id"])


def proxy_path(workload_id: int, rest: str = "") -> str:
    return f"/api/v1/workloads/{workload_id}/proxy/{rest}"


def answer_of(client: httpx.Client, url: str, attempt: str, timeout: float = 30.0) -> dict[str, Any]:
    """The service's echo of GET `url` once attempt `attempt` answers it (it needs a moment to listen)."""
    deadline = time.time() + timeout
    while True:
        response = client.get(url, headers={"X-Test": "passed on"})
        if response.status_code == 200 and response.json()["attempt"] == attempt:
            assert response.headers["x-service"] == "echo"
            return dict(response.json())
        assert response.status_code in (200, 502, 503), response.text
        assert time.time() < deadline, (
            f"attempt {attempt} never answered: {response.status_code} {response.text}"
        )
        time.sleep(0.1)


def wait_until(server: ServerProcess, workload_id: int, done: Any, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.time() + timeout
    while True:
        w = server.workload(workload_id)
        if done(w):
            return w
        assert time.time() < deadline, f"workload {workload_id}: still waiting after {timeout}s: {w}"
        time.sleep(0.1)


def token_for(server: ServerProcess, *args: str) -> str:
    """A new token of this name (and role, `--role viewer`), made by the admin."""
    made = json.loads(server.cli("token", "create", *args, "--json", check=True).stdout)
    return str(made["token"])


def echo_as(server: ServerProcess, token: str, workdir: Path, **spec: object) -> int:
    """The echo service submitted with `token` (its owner is that token's name); its id once it answers."""
    workdir.mkdir(exist_ok=True)
    (workdir / "echo.py").write_text(ECHO)
    body = {
        "kind": "service",
        "name": "echo",
        "workdir": str(workdir),
        "commands": [f"exec {sys.executable} echo.py"],
        **spec,
    }
    with server.http(token) as client:
        created = client.post("/api/v1/workloads", json=body)
        assert created.status_code == 201, created.text
    sid = int(created.json()["id"])
    wait_until(server, sid, lambda w: w["state"] == "running")
    with server.http() as admin:
        answer_of(admin, proxy_path(sid, "up"), "0")
    return sid


# A service that answers a plain GET, and a WebSocket's first message, with the request headers it received.
HEADERS = """
import asyncio, json, os
from http import HTTPStatus
from websockets.asyncio.server import serve

def said(headers):
    return json.dumps([[name.lower(), value] for name, value in headers.raw_items()])

def plain(connection, request):
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return connection.respond(HTTPStatus.OK, said(request.headers))

async def opened(ws):
    await ws.send(said(ws.request.headers))

async def main():
    async with serve(opened, "0.0.0.0", int(os.environ["GPUPOOL_PORT"]), process_request=plain) as server:
        await server.serve_forever()

asyncio.run(main())
"""


def forwarded_headers(said: str) -> dict[str, list[str]]:
    """The X-Forwarded-* and Forwarded headers among those a HEADERS service received."""
    seen: dict[str, list[str]] = {}
    for name, value in json.loads(said):
        if name.startswith("x-forwarded-") or name == "forwarded":
            seen.setdefault(name, []).append(value)
    return seen


def headers_service(server: ServerProcess, workdir: Path) -> int:
    """The HEADERS service submitted (its program written into `workdir`); its id once it runs."""
    (workdir / "headers.py").write_text(HEADERS)
    sid = int(
        server.submit(
            {
                "kind": "service",
                "name": "headers",
                "workdir": str(workdir),
                "commands": [f"exec {sys.executable} headers.py"],
            }
        )["id"]
    )
    wait_until(server, sid, lambda w: w["state"] == "running")
    return sid


@contextlib.contextmanager
def forwarding(server: ServerProcess, ref: str) -> Iterator[str]:
    """`gpupool forward REF --port 0` running; the first line it printed (it names the local address)."""
    forwarder = subprocess.Popen(
        [sys.executable, "-m", "gpupool.main", "forward", ref, "--port", "0"],
        env=server.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert forwarder.stdout is not None
        yield forwarder.stdout.readline()
    finally:
        forwarder.terminate()
        forwarder.wait(timeout=10)
