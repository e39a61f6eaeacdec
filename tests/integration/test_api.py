"""The HTTP API as a client sees it: auth, errors, queues, OpenAPI."""

from __future__ import annotations

import select
import socket
import stat
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support.server import ServerProcess


def test_healthz_needs_no_token(server: ServerProcess) -> None:
    with server.http(token=None) as client:
        assert client.get("/healthz").json()["status"] == "ok"
        # uptime checkers and load balancers probe with HEAD: answered as GET is, without the body
        for path in ("/healthz", "/readyz", "/ui"):
            probed = client.head(path)
            assert (probed.status_code, probed.content) == (200, b""), (path, probed.status_code)
        assert client.head("/metrics").status_code == 401  # a token, as GET needs
    with server.http() as client:
        assert client.head("/metrics").status_code == 200


@pytest.mark.parametrize(
    "path,method",
    [
        ("/api/v1/workloads", "GET"),
        ("/api/v1/workloads", "POST"),
        ("/api/v1/nodes", "GET"),
        ("/api/v1/queues", "GET"),
        ("/api/v1/workloads/1/cancel", "POST"),
    ],
)
def test_every_api_call_without_a_token_is_401(server: ServerProcess, path: str, method: str) -> None:
    with server.http(token=None) as client:
        response = client.request(method, path, json={"commands": ["true"]})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    said = response.json()["error"]["message"]
    assert "missing bearer token" in said and "$GPUPOOL_HOME/credentials" in said, said  # not ~/.gpupool


def test_a_wrong_token_is_401_and_changes_nothing(server: ServerProcess) -> None:
    with server.http(token="gpp_not-the-token") as client:
        response = client.post("/api/v1/workloads", json={"commands": ["true"]})
    assert response.status_code == 401
    assert "invalid token" in response.json()["error"]["message"]
    with server.http() as client:
        assert client.get("/api/v1/workloads", params={"all": True}).json() == []


def test_the_admin_token_is_saved_0600_and_never_stored_in_clear(server: ServerProcess) -> None:
    path = server.home / "credentials"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = server.token
    assert token.startswith("gpp_")
    assert token.encode() not in (server.home / "gpupool.db").read_bytes()
    assert server.log().count(token) == 1, "the token is printed once, at first start"


@pytest.mark.parametrize(
    "spec,field",
    [
        ({"commands": ["true"], "resources": {"gpu": "H100:x"}}, "resources.gpu"),
        ({"commands": []}, "commands"),
        ({"comands": ["true"]}, "comands"),
        ({"commands": ["true"], "max_duration": "soon"}, "max_duration"),
        ({"commands": ["true"], "queue": "nope"}, "queue"),
        ({"commands": ["true"], "workdir": "relative/dir"}, "workdir"),
        ("just a string", "<spec>"),
    ],
)
def test_a_bad_spec_is_422_naming_the_field_and_changes_nothing(
    server: ServerProcess, spec: object, field: str
) -> None:
    with server.http() as client:
        response = client.post("/api/v1/workloads", json=spec)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["field"] == field, error
        assert error["message"]
        assert client.get("/api/v1/workloads", params={"all": True}).json() == []


def test_malformed_json_is_a_clear_422(server: ServerProcess) -> None:
    with server.http() as client:
        response = client.post(
            "/api/v1/workloads", content=b"{not json", headers={"content-type": "application/json"}
        )
    assert response.status_code == 422
    assert "JSON" in response.json()["error"]["message"]


def test_an_oversized_body_is_refused_with_413(server: ServerProcess) -> None:
    with server.http() as client:
        response = client.post("/api/v1/workloads", json={"commands": ["x" * (2 << 20)]})
    assert response.status_code == 413
    assert "limit" in response.json()["error"]["message"]


def test_unknown_workload_is_404_with_a_hint(server: ServerProcess) -> None:
    with server.http() as client:
        response = client.get("/api/v1/workloads/999")
    assert response.status_code == 404
    assert "gpupool ps --all" in response.json()["error"]["message"]


def test_queues_can_be_created_listed_and_updated(server: ServerProcess) -> None:
    with server.http() as client:
        created = client.post(
            "/api/v1/queues", json={"name": "nlp", "resources": {"gpu": {"quota": 4, "limit": 8}}}
        )
        assert created.status_code == 201, created.text
        assert client.post("/api/v1/queues", json={"name": "nlp"}).status_code == 409
        bad = client.post(
            "/api/v1/queues", json={"name": "vision", "resources": {"gpu": {"quota": 8, "limit": 4}}}
        )
        assert bad.status_code == 422 and "limit" in bad.json()["error"]["field"]
        updated = client.patch("/api/v1/queues/nlp", json={"resources": {"gpu": {"limit": 16}}})
        assert updated.status_code == 200, updated.text
        gpu = updated.json()["resources"]["gpu"]
        assert gpu["quota"] == 4 and gpu["limit"] == 16
        assert client.patch("/api/v1/queues/missing", json={"priority": 1}).status_code == 404
        names = [q["name"] for q in client.get("/api/v1/queues").json()]
        assert names == ["default", "nlp"]


def test_a_queue_gpu_limit_is_never_exceeded(server: ServerProcess, tmp_path: Path) -> None:
    with server.http() as client:
        client.post("/api/v1/queues", json={"name": "capped", "resources": {"gpu": {"limit": 2}}})
    # Each job runs until the test opens the gate: a "sleep 1" could end before a loaded machine gave the
    # second its reason, and the second would run instead of waiting.
    gate = tmp_path / "gate"
    wait = f"while [ ! -e {gate} ]; do sleep 0.1; done"
    ids = [
        server.submit({"queue": "capped", "resources": {"gpu": 2}, "commands": [wait]})["id"]
        for _ in range(2)
    ]
    server.wait_for(ids[0], states=("running",))
    second = server.wait_for_reason(ids[1])
    assert second["state"] == "pending" and second["reason_code"] == "queue-limit"
    assert second["reason"] == "queue capped is at its limit (2/2 GPUs)"
    # its own queue's limit holds it: no other queue's GPUs would help, so the starved-queue alert
    # (pending less held back) stays quiet for it
    with server.http() as client:
        capped = client.get("/api/v1/queues/capped").json()
    assert (capped["gpus_pending"], capped["gpus_held_back"]) == (2, 2), capped
    gate.touch()
    assert server.wait_for(ids[0])["state"] == "succeeded"
    assert server.wait_for(ids[1])["state"] == "succeeded"


def test_openapi_is_served(server: ServerProcess) -> None:
    with server.http(token=None) as client:
        paths = client.get("/openapi.json").json()["paths"]
    assert "/api/v1/workloads" in paths and "/api/v1/queues/{name}" in paths


def test_nodes_show_simulated_gpus_and_telemetry(server: ServerProcess) -> None:
    # Until the first sample is in, however long a loaded machine takes (not a fixed 1.5 s).
    deadline = time.time() + 30
    with server.http() as client:
        while not (nodes := client.get("/api/v1/nodes").json()) or any(
            g["sample"] is None for g in nodes[0]["gpus"][:1]
        ):
            assert time.time() < deadline, "no GPU sample after 30 s"
            time.sleep(0.2)
    assert [n["name"] for n in nodes] == ["node-1"]
    gpus = nodes[0]["gpus"]
    assert len(gpus) == 8 and {g["model"] for g in gpus} == {"H100"}
    assert all(g["simulated"] for g in gpus)
    assert gpus[0]["sample"] is not None and gpus[0]["sample"]["memory_total_bytes"] > 80e9


def test_workloads_can_be_listed_from_a_time_on(server: ServerProcess) -> None:
    with server.http() as client:
        first = client.post("/api/v1/workloads", json={"commands": ["sleep 30"]}).json()["id"]
        time.sleep(0.05)
        since = datetime.now(UTC)
        time.sleep(0.05)
        second = client.post("/api/v1/workloads", json={"commands": ["sleep 30"]}).json()["id"]
        listed = client.get("/api/v1/workloads", params={"all": True, "since": since.isoformat()}).json()
        assert [w["id"] for w in listed] == [second]
        everything = [w["id"] for w in client.get("/api/v1/workloads", params={"all": True}).json()]
        assert everything.index(first) < everything.index(second)  # oldest first
        bad = client.get("/api/v1/workloads", params={"since": "last tuesday"})
        assert bad.status_code == 422 and "since" in bad.text
        for workload_id in (first, second):
            client.post(f"/api/v1/workloads/{workload_id}/cancel")


def test_workloads_can_be_listed_by_name(server: ServerProcess) -> None:
    with server.http() as client:
        a, b, c = (
            client.post("/api/v1/workloads", json={"name": name, "commands": ["sleep 30"]}).json()["id"]
            for name in ("train", "eval", "train")
        )
        named = client.get("/api/v1/workloads", params={"all": True, "name": "train"}).json()
        assert [w["id"] for w in named] == [a, c]
        assert client.get("/api/v1/workloads", params={"all": True, "name": "nobody"}).json() == []
        for workload_id in (a, b, c):
            client.post(f"/api/v1/workloads/{workload_id}/cancel")


def _streamed_post(server: ServerProcess, token: str | None, body: bytes) -> tuple[int, int]:
    """POST `body` to /api/v1/workloads chunked (no Content-Length), as a client that watches for an answer
    while it sends: the answer's status, and how many bytes of the body were sent before it came."""
    head = "POST /api/v1/workloads HTTP/1.1\r\nHost: gpupool\r\nTransfer-Encoding: chunked\r\n"
    head += "Content-Type: application/json\r\n" + (f"Authorization: Bearer {token}\r\n" if token else "")
    sent = 0
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall((head + "\r\n").encode())
        for at in range(0, len(body), 1 << 16):
            if select.select([sock], [], [], 0)[0]:
                break  # answered before the whole body
            chunk = body[at : at + (1 << 16)]
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:  # the server closed its end: its answer is already here
                break
            sent += len(chunk)
        else:
            sock.sendall(b"0\r\n\r\n")
        status_line = sock.recv(1 << 16).split(b"\r\n", 1)[0]
    return int(status_line.split()[1]), sent


@pytest.mark.parametrize("with_token", [False, True])
def test_a_streamed_body_over_the_limit_is_refused_as_it_arrives(
    server: ServerProcess, with_token: bool
) -> None:
    # without a token the head used to read all of it first (1.5 GB: 4.6 GB of memory) to answer 401; with
    # one, a 30 MB command was taken
    huge = b'{"name": "big", "commands": ["' + b"x" * (32 << 20) + b'"]}'
    status, sent = _streamed_post(server, server.token if with_token else None, huge)
    assert status == 413
    assert sent < len(huge) // 2, sent  # refused while the client still sent
    with server.http() as client:
        assert client.get("/api/v1/workloads", params={"all": True}).json() == []  # nothing was made
        # a small body sent the same way is taken as before
        assert _streamed_post(server, server.token, b'{"name": "small", "commands": ["true"]}')[0] == 201


def test_a_token_kept_to_some_queues_adds_no_work_to_another_through_work_it_has_there(
    server: ServerProcess,
) -> None:
    with server.http() as admin:
        for name in ("a", "b"):
            assert admin.post("/api/v1/queues", json={"name": name}).status_code == 201
        alice = admin.post("/api/v1/tokens", json={"name": "alice"}).json()["token"]
    with server.http(alice) as client:  # alice, while her token is for any queue, runs work in b
        svc = client.post(
            "/api/v1/workloads",
            json={"kind": "service", "name": "svc", "queue": "b", "commands": ["sleep 300"]},
        ).json()["id"]
        held = client.post(
            "/api/v1/workloads?hold=true", json={"name": "held", "queue": "b", "commands": ["true"]}
        ).json()["id"]
    server.wait_for(svc, states=("running",))
    with server.http() as admin:  # then an admin keeps her to queue a
        assert admin.delete("/api/v1/tokens/alice").status_code == 200
        alice = admin.post("/api/v1/tokens", json={"name": "alice", "queues": ["a"]}).json()["token"]
    with server.http(alice) as client:
        for path, body in (
            (f"{svc}/scale", {"replicas": 3}),
            (f"{svc}/scale", {"replicas": "1..4"}),
            (f"{svc}/requeue", None),
            (f"{held}/release", None),
        ):
            refused = client.post(f"/api/v1/workloads/{path}", json=body)
            assert refused.status_code == 403, (path, refused.text)
            said = refused.json()["error"]["message"]
            assert "may submit only to a, not 'b'" in said and "adds work there" in said, said
        # taking work away from b stays hers to do
        assert client.post(f"/api/v1/workloads/{held}/cancel").status_code == 202
    shown = server.workload(svc)
    assert (shown["replicas"], shown["state"], shown["attempts"]) == (1, "running", 1)  # nothing changed
    assert server.workload(held)["state"] == "cancelled"
