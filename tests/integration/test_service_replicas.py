"""A service with several replicas: each a workload of its own on its own GPUs, reached through the head at
the service's one address, round robin over those that take requests; scaled up and down, cancelled whole.
A real server, real HTTP services in real processes, real requests."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.agent import start_pool
from tests.support.process import kill_attempts_under
from tests.support.server import ServerProcess
from tests.support.services import echo_service, proxy_path, wait_until


def _replicas_answering(
    client: httpx.Client, url: str, wanted: set[str], timeout: float = 30.0
) -> dict[str, Any]:
    """GET `url` until each replica in `wanted` has answered (and no other): the answers by replica."""
    seen: dict[str, Any] = {}
    deadline = time.time() + timeout
    while set(seen) != wanted:
        response = client.get(url)
        if response.status_code == 200:
            answer = response.json()
            assert answer["replica"] in wanted, f"replica {answer['replica']} answered; only {wanted} should"
            assert response.headers["x-gpupool-workload"] == answer["job_id"]
            seen[answer["replica"]] = answer
        else:
            assert response.status_code in (502, 503), response.text
        assert time.time() < deadline, f"only replicas {sorted(seen)} of {sorted(wanted)} answered"
        time.sleep(0.05)
    return seen


def _running(server: ServerProcess, sid: int, count: int) -> dict[str, Any]:
    return wait_until(
        server, sid, lambda w: [r["state"] for r in w["replica_list"]].count("running") == count
    )


def test_requests_go_round_the_replicas_and_follow_a_scale_up_a_scale_down_and_a_cancel(
    tmp_path: Path,
) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=["--restart-backoff", "0"]).start()
    try:
        sid = echo_service(server, tmp_path, replicas=2)
        shown = _running(server, sid, 2)
        ids = [r["id"] for r in shown["replica_list"]]
        assert ids[0] == sid and shown["replicas"] == 2 and shown["service_id"] == sid
        assert [r["replica"] for r in shown["replica_list"]] == [0, 1]
        # each on GPUs of its own
        gpus = [tuple(server.workload(i)["gpu_indices"]) for i in ids]
        assert len(set(gpus)) == 2 and all(len(g) == 1 for g in gpus)

        with server.http() as client:
            answers = _replicas_answering(client, proxy_path(sid, "hello"), {"0", "1"})
            assert [answers[r]["job_id"] for r in ("0", "1")] == [str(i) for i in ids]
            assert {a["service_id"] for a in answers.values()} == {str(sid)}
            # round robin: of 10 requests in a row, each replica answers 5
            counts = [client.get(proxy_path(sid, "x")).json()["replica"] for _ in range(10)]
            assert counts.count("0") == counts.count("1") == 5, counts
            # a replica's own id reaches the same service
            _replicas_answering(client, proxy_path(ids[1], "via-replica"), {"0", "1"})

            listed = server.cli("ps", check=True).stdout
            assert "echo#1" in listed

            refused = server.cli("scale", str(sid), "three")
            assert refused.returncode != 0 and refused.stderr.startswith(
                "error: replicas: 'three' is not a whole"
            )
            assert f"e.g. gpupool scale {sid} 2" in refused.stderr, refused.stderr
            negative = server.cli("scale", str(sid), "-1")  # a count, not taken for an option
            assert negative.stderr.startswith("error: replicas: '-1' is not a whole number"), negative.stderr
            scaled = server.cli("scale", str(sid), "3", check=True).stdout
            assert "3 replicas" in scaled
            shown = _running(server, sid, 3)
            assert shown["spec"]["replicas"] == 3
            _replicas_answering(client, proxy_path(sid, "three"), {"0", "1", "2"})

            # down to one: the highest-numbered replicas stop; requests reach the one left
            down = client.post(f"/api/v1/workloads/{sid}/scale", json={"replicas": 1})
            assert down.status_code == 200, down.text
            wait_until(
                server,
                sid,
                lambda w: [r["state"] for r in w["replica_list"]] == ["running", *["cancelled"] * 2],
            )
            assert all(client.get(proxy_path(sid, "one")).json()["replica"] == "0" for _ in range(5))

            # back to two: the free number 1 is used again, on a new workload
            client.post(f"/api/v1/workloads/{sid}/scale", json={"replicas": 2}).raise_for_status()
            shown = _running(server, sid, 2)
            again = [r for r in shown["replica_list"] if r["state"] == "running"]
            assert [r["replica"] for r in again] == [0, 1] and again[1]["id"] not in ids
            _replicas_answering(client, proxy_path(sid, "again"), {"0", "1"})

            # one replica killed: requests keep being answered (the proxy tries another replica when
            # nothing listens where it sent one), and the killed one starts again on its own
            killed = server.workload(again[1]["id"])
            os.killpg(killed["attempt_list"][-1]["pid"], signal.SIGKILL)
            # until nothing listens there: SIGKILL lands a moment later, and a request the dying process
            # accepted in between gets 502 (it had it, and a request is never sent twice)
            host, port = killed["endpoint"].split(":")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    socket.create_connection((host, int(port)), timeout=1).close()
                except OSError:
                    break
                time.sleep(0.05)
            for _ in range(20):
                response = client.get(proxy_path(sid, "during"))
                assert response.status_code == 200, response.text
            wait_until(server, again[1]["id"], lambda w: w["attempts"] == 2 and w["state"] == "running")
            assert server.workload(sid)["attempts"] == 1, "the other replica ran on untouched"

            # cancelled by the id of any replica: all of them end
            cancelled = client.post(f"/api/v1/workloads/{again[1]['id']}/cancel")
            assert cancelled.status_code == 202, cancelled.text
            assert sorted(cancelled.json()["cancelled_replicas"]) == sorted([sid, again[1]["id"]])
            for replica in (sid, again[1]["id"]):
                assert server.wait_for(replica)["state"] == "cancelled"
            ended = client.get(proxy_path(sid, "gone"))
            assert ended.status_code == 409 and "has ended (cancelled)" in ended.json()["error"]["message"]
            refused = client.post(f"/api/v1/workloads/{sid}/scale", json={"replicas": 2})
            assert refused.status_code == 409 and "has ended" in refused.json()["error"]["message"]
    finally:
        server.stop()
        kill_attempts_under(tmp_path)


def test_a_replica_not_ready_by_its_probe_gets_no_requests(server: ServerProcess, tmp_path: Path) -> None:
    sid = echo_service(server, tmp_path, name="probed", replicas=2, readiness_probe="/health")
    shown = wait_until(
        server, sid, lambda w: all(r["state"] == "running" and r["ready"] is False for r in w["replica_list"])
    )
    with server.http() as client:
        refused = client.get(proxy_path(sid, "x"))
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "none of the 2 replicas of service probed" in message
        for r in shown["replica_list"]:
            assert f"replica {r['replica']} (workload {r['id']}) is not ready" in message

        (tmp_path / "ready-1").touch()  # replica 1 ready, replica 0 still not
        wait_until(server, sid, lambda w: [r["ready"] for r in w["replica_list"]] == [False, True])
        assert {client.get(proxy_path(sid, "x")).json()["replica"] for _ in range(8)} == {"1"}
        shown_text = server.cli("show", str(sid), check=True).stdout
        assert "replicas: 2" in shown_text and "ready=no" in shown_text and "ready=yes" in shown_text

        (tmp_path / "ready-0").touch()
        wait_until(server, sid, lambda w: [r["ready"] for r in w["replica_list"]] == [True, True])
        _replicas_answering(client, proxy_path(sid, "x"), {"0", "1"})


def test_replicas_wait_for_gpus_each_alone_and_bad_replica_counts_are_refused(
    server: ServerProcess,
) -> None:
    # 8 simulated GPUs: three replicas of 3 GPUs each, two fit
    created = server.submit(
        {"kind": "service", "name": "wide", "replicas": 3, "resources": {"gpu": 3}, "commands": ["sleep 60"]}
    )
    ids = created["replica_ids"]
    assert len(ids) == 3 and ids[0] == created["id"]
    shown = wait_until(
        server,
        created["id"],
        lambda w: sorted(r["state"] for r in w["replica_list"]) == ["pending", "running", "running"],
    )
    waiting = next(r for r in shown["replica_list"] if r["state"] == "pending")
    assert server.wait_for_reason(waiting["id"])["reason_code"], "a waiting replica says why, as any workload"

    with server.http() as client:
        # scaled down, the one still waiting goes first
        client.post(f"/api/v1/workloads/{ids[0]}/scale", json={"replicas": 2}).raise_for_status()
        after = {r["id"]: r["state"] for r in server.workload(ids[0])["replica_list"]}
        assert after[waiting["id"]] == "cancelled"
        assert sorted(after.values()) == ["cancelled", "running", "running"]

        for body, field, words in (
            ({"replicas": 0}, "replicas", "must be 1..64, got 0; to stop a service, cancel it"),
            ({"replicas": 65}, "replicas", "must be 1..64, got 65"),  # (no advice to cancel: that is for 0)
            ({"replicas": "two"}, "replicas", "'two' is not a whole number"),
            ({"replicas": True}, "replicas", "True is not a whole number"),
            ({}, "replicas", "replicas: required"),
            ({"count": 2}, "count", "unknown field; fields: replicas"),
        ):
            bad = client.post(f"/api/v1/workloads/{ids[0]}/scale", json=body)
            assert bad.status_code == 422, bad.text
            assert bad.json()["error"]["field"] == field and words in bad.json()["error"]["message"]
            assert body != {"replicas": 65} or "cancel" not in bad.json()["error"]["message"]
        assert len([r for r in server.workload(ids[0])["replica_list"] if r["state"] == "running"]) == 2

        job = server.submit({"name": "batch", "commands": ["sleep 30"]})
        refused = client.post(f"/api/v1/workloads/{job['id']}/scale", json={"replicas": 2})
        assert refused.status_code == 409 and "is a job; only a service has replicas" in refused.text

        on_a_job = client.post("/api/v1/workloads", json={"commands": ["true"], "replicas": 2})
        assert on_a_job.status_code == 422 and on_a_job.json()["error"]["field"] == "replicas"
        assert "applies to services only" in on_a_job.json()["error"]["message"]
        too_many = client.post(
            "/api/v1/workloads", json={"kind": "service", "commands": ["true"], "replicas": 100}
        )
        assert too_many.status_code == 422 and "at most 64" in too_many.json()["error"]["message"]
        unknown = client.post("/api/v1/workloads/999999/scale", json={"replicas": 2})
        assert unknown.status_code == 404

    cli = server.cli("run", "--replicas", "2", "--", "true")
    assert cli.returncode != 0 and "applies to services only" in cli.stderr
    cancelled = server.cli("cancel", str(ids[1]), check=True).stdout
    assert "service cancelled, all 2 replicas" in cancelled


def test_replicas_spread_over_nodes_and_are_reached_on_each(tmp_path: Path) -> None:
    """Two agents of 2 GPUs each: binpacking would put two 1-GPU replicas on one node; as replicas of one
    service, each goes to a node of its own (and a job after them still packs)."""
    pool = start_pool(tmp_path, 2, gpus="sim:2xH100")
    server = pool.server
    try:
        sid = echo_service(server, tmp_path, replicas=2)
        shown = _running(server, sid, 2)
        assert sorted(r["node"] for r in shown["replica_list"]) == ["agent-0", "agent-1"]
        with server.http() as client:
            answers = _replicas_answering(client, proxy_path(sid, "spread"), {"0", "1"})
        assert len({a["port"] for a in answers.values()}) == 2
    finally:
        pool.stop()
        kill_attempts_under(tmp_path)


def test_a_scale_down_removes_a_replica_that_is_not_ready_before_a_ready_one_and_says_so_on_replica_0(
    tmp_path: Path,
) -> None:
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        (tmp_path / "ready-0").touch()
        (tmp_path / "ready-2").touch()  # replica 1 never answers its probe 2xx
        sid = echo_service(server, tmp_path, replicas=3, readiness_probe="/health")
        shown = wait_until(
            server, sid, lambda w: [r["ready"] for r in w["replica_list"]] == [True, False, True], timeout=60
        )
        one, two = shown["replica_list"][1]["id"], shown["replica_list"][2]["id"]
        server.cli("scale", str(sid), "2", check=True)
        assert server.wait_for(one)["state"] == "cancelled"
        assert server.workload(two)["state"] == "running" and not server.workload(two)["cancel_requested"]
        server.cli("scale", str(sid), "1", check=True)
        assert server.wait_for(two)["state"] == "cancelled"
        said = [e["reason"] for e in server.workload(sid)["events"]]
        assert "scaled to 2 replicas by admin" in said and "scaled to 1 replica by admin" in said, said
    finally:
        server.stop()
        kill_attempts_under(tmp_path)


SLOW = """
import http.server, json, os, time

class Slow(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # 2 s a request; on SIGTERM the process dies at once, as http.server does
        time.sleep(2)
        out = json.dumps({"replica": os.environ.get("GPUPOOL_REPLICA")}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["GPUPOOL_PORT"])), Slow).serve_forever()
"""


def test_a_scale_down_stops_a_replica_once_it_has_answered_what_the_proxy_gave_it(
    server: ServerProcess, tmp_path: Path
) -> None:
    """A server that exits on SIGTERM lost every request in flight to the replica a scale-down removed
    (502 'Server disconnected'): its SIGTERM now waits for them, and it gets no new ones."""
    (tmp_path / "slow.py").write_text(SLOW)
    sid = server.submit({"kind": "service", "name": "slow", "resources": {"gpu": 1}, "replicas": 2,
                         "workdir": str(tmp_path), "commands": [f"exec {sys.executable} slow.py"],
                         "grace_period": "20s"})["id"]  # fmt: skip
    _running(server, sid, 2)
    url = f"{server.url}{proxy_path(sid, 'x')}"
    with httpx.Client(headers={"Authorization": f"Bearer {server.token}"}, timeout=30) as client:
        deadline = time.time() + 30  # both replicas listening (each answers in 2 s)
        while {client.get(url).json().get("replica") for _ in range(2)} != {"0", "1"}:
            assert time.time() < deadline, "both replicas never answered"
    answers: list[int] = []

    def ask() -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {server.token}"}, timeout=30) as client:
            answers.append(client.get(url).status_code)

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # all six in flight, three on each replica
    server.cli("scale", str(sid), "1", check=True)
    for t in threads:
        t.join()
    assert answers == [200] * 6, answers
    # and then it is stopped, well before its 20 s grace period
    wait_until(server, sid, lambda w: [r["state"] for r in w["replica_list"]] == ["running", "cancelled"], 10)
    server.cli("cancel", str(sid), check=True)
