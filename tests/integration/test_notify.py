"""Notifications on a real server: a real HTTP receiver gets a JSON message when work starts and ends, a
receiver that is down gets it once it is back (also after the head was killed meanwhile), and a host the
operator did not allow is refused at submit."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import ServerProcess


class Receiver:
    """A webhook receiver on 127.0.0.1: what it was sent, in order (start() again after stop())."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.got: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.raw: list[bytes] = []  # each body as it came
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        got, raw = self.got, self.raw

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                content = self.rfile.read(int(self.headers["Content-Length"]))
                raw.append(content)
                got.append((dict(self.headers), json.loads(content)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def wait_for(self, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.time() + timeout
        while len(self.got) < count:
            assert time.time() < deadline, f"{len(self.got)} of {count} messages after {timeout}s: {self.got}"
            time.sleep(0.1)
        return [body for _, body in self.got]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def _server(tmp_path: Path, *hosts: str) -> ServerProcess:
    args = ["--notify-hosts", ",".join(hosts)] if hosts else []
    return ServerProcess(home=tmp_path / "home", extra_args=args).start()


def test_a_receiver_hears_when_work_starts_and_how_it_ends(tmp_path: Path, receiver: Receiver) -> None:
    receiver.start()
    server = _server(tmp_path, "127.0.0.1")
    try:
        ran = server.cli(
            "run", "--wait", "--notify", receiver.url, "--name", "train", "--", "sh", "-c", "exit 3"
        )
        assert ran.returncode == 3, ran.stderr
        secret = "k3y-" + "x" * 28
        spec = {
            "notify": {"url": receiver.url, "on": ["started", "succeeded"], "secret": secret},
            "commands": ["true"],
        }
        done = server.submit({**spec, "name": "eval"})
        server.wait_for(done["id"])
        failed, started, succeeded = receiver.wait_for(3)
        headers = receiver.got[0][0]
        assert headers["User-Agent"].startswith("gpupool/") and headers["X-Gpupool-Event"] == str(
            failed["event_id"]
        )
        assert failed["kind"] == "failed" and failed["exit_code"] == 3
        assert failed["workload"] == {
            "id": 1,
            "name": "train",
            "kind": "job",
            "queue": "default",
            "user": "admin",
        }
        assert failed["text"].startswith("gpupool: workload 1 (train) failed (exit code 3)")
        assert (started["kind"], started["from"], started["state"]) == ("started", "pending", "running")
        assert succeeded["kind"] == "succeeded" and succeeded["workload"]["id"] == done["id"]
        assert "X-Gpupool-Signature-256" not in headers  # job 1 gave no secret: its messages are unsigned
        signed, content = receiver.got[2][0], receiver.raw[2]  # what a receiver checks, with its own code
        stamp = signed["X-Gpupool-Timestamp"]
        expected = hmac.new(secret.encode(), f"{stamp}.".encode() + content, hashlib.sha256).hexdigest()
        assert signed["X-Gpupool-Signature-256"] == f"sha256={expected}"
        assert abs(time.time() - int(stamp)) < 120
        with server.http() as client:  # the secret is never shown back, not even to an admin
            shown_spec = client.get(f"/api/v1/workloads/{done['id']}").json()["spec"]
            assert shown_spec["notify"]["secret"] == "(hidden)" and secret not in json.dumps(shown_spec)
        time.sleep(2)
        assert len(receiver.got) == 3  # job 1 asked for no started message; nothing is sent twice
        shown = server.cli("show", str(done["id"]), check=True).stdout
        assert f"notifies: {receiver.url} when started, succeeded" in shown, shown
    finally:
        server.stop()


def test_a_receiver_that_was_down_gets_its_message_even_across_a_killed_head(
    tmp_path: Path, receiver: Receiver
) -> None:
    server = _server(tmp_path, "127.0.0.1")
    try:
        job = server.submit({"notify": receiver.url, "commands": ["true"]})
        server.wait_for(job["id"])
        time.sleep(2)  # the head tried and failed: the receiver is not listening
        server.kill9()  # kill -9: the message is not settled, so the cursor stays before it
        server.start()
        receiver.start()
        (message,) = receiver.wait_for(1)
        assert message["kind"] == "succeeded" and message["workload"]["id"] == job["id"]
    finally:
        server.stop()


def test_notifications_go_only_to_allowed_hosts(tmp_path: Path) -> None:
    server = _server(tmp_path, "hooks.example.com")
    try:
        with server.http() as client:
            refused = client.post(
                "/api/v1/workloads", json={"notify": "http://10.0.0.1/admin", "commands": ["true"]}
            )
            assert refused.status_code == 422, refused.text
            error = refused.json()["error"]
            assert error["field"] == "notify.url"
            assert "'10.0.0.1' is not a host it may notify" in error["message"]
            assert "only to hooks.example.com" in error["message"]
            assert "--notify-hosts 10.0.0.1" in error["message"]
            bad = client.post("/api/v1/workloads", json={"notify": "ftp://x", "commands": ["true"]})
            assert bad.status_code == 422 and bad.json()["error"]["field"] == "notify.url"
            short = {"notify": {"url": "https://hooks.example.com/x", "secret": "abc"}, "commands": ["true"]}
            bad = client.post("/api/v1/workloads", json=short)
            assert bad.status_code == 422 and bad.json()["error"]["field"] == "notify.secret", bad.text
            assert "16 to 256 printable characters" in bad.text and "abc" not in bad.text
            assert client.get("/api/v1/workloads?all=true").json() == []
        _others_see_no_secret(server)
    finally:
        server.stop()
    closed = _server(tmp_path / "off")
    try:
        refused = closed.cli("run", "--notify", "https://hooks.example.com/x", "--", "true")
        assert refused.returncode == 1
        assert "this head sends no notifications" in refused.stderr, refused.stderr
    finally:
        closed.stop()


def _others_see_no_secret(server: ServerProcess) -> None:
    """A webhook's path and the environment's values are secrets: shown to the owner and admins only."""
    tokens = {
        name: str(json.loads(server.cli("token", "create", name, "--json", check=True).stdout)["token"])
        for name in ("alice", "bob")
    }
    hook = "https://hooks.example.com/services/T0/B0/s3cret"
    spec = {"notify": hook, "env": {"WANDB_API_KEY": "k-123"}, "commands": ["true"]}
    with server.http(tokens["alice"]) as alice:
        made = alice.post("/api/v1/workloads?hold=true", json=spec)
        assert made.status_code == 201, made.text
        path = f"/api/v1/workloads/{made.json()['id']}"
        mine = alice.get(path).json()["spec"]
        assert mine["notify"]["url"] == hook and mine["env"] == {"WANDB_API_KEY": "k-123"}
    with server.http(tokens["bob"]) as bob:
        theirs = bob.get(path).json()["spec"]
        assert theirs["notify"]["url"] == "https://hooks.example.com/..." and theirs["notify"]["on"]
        assert theirs["env"] == {"WANDB_API_KEY": "(hidden)"}
    server.extra_env["GPUPOOL_TOKEN"] = tokens["bob"]
    try:
        shown = server.cli("show", path.rsplit("/", 1)[1], check=True).stdout
        assert "notifies: https://hooks.example.com/... when" in shown and "s3cret" not in shown, shown
    finally:
        del server.extra_env["GPUPOOL_TOKEN"]
    with server.http() as admin:
        assert admin.get(path).json()["spec"]["notify"]["url"] == hook
