"""Bad input to the HTTP API, as a client sends it: a 4xx in the API's error shape that names the field and
the fix, never a 500, and nothing changed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import plain_http
from tests.support.agent import agent_head, join_token
from tests.support.server import ServerProcess


def refused(response: httpx.Response, status: int, field: str) -> str:
    """The error message of a refusal with `status` naming `field`."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["field"] == field, error
    assert error["message"].startswith(field), error
    return str(error["message"])


def test_a_nul_character_is_refused_naming_where_it_is_and_changes_nothing(server: ServerProcess) -> None:
    # Before, a NUL in a command was accepted and made the reconcile pass that started it fail.
    with server.http() as client:
        for spec, field in [
            ({"commands": ["\x00"]}, "commands[0]"),
            ({"commands": ["true"], "env": {"A": "x\x00"}}, "env.A"),
            ({"commands": ["true"], "workdir": "/tmp/\x00"}, "workdir"),
        ]:
            message = refused(client.post("/api/v1/workloads", json=spec), 422, field)
            assert "NUL character" in message and "remove it" in message
        refused(client.get("/api/v1/workloads", params={"queue": "a\x00"}), 422, "queue")
        refused(client.patch("/api/v1/queues/default", json={"description": "\x00"}), 422, "description")
        assert client.get("/api/v1/workloads", params={"all": True}).json() == []
        assert "\x00" not in client.get("/api/v1/queues/default").json()["description"]


def test_an_unknown_query_parameter_is_refused_naming_those_the_route_takes(server: ServerProcess) -> None:
    # before, a misspelled filter was dropped and the answer was every workload
    with server.http() as client:
        said = refused(client.get("/api/v1/workloads", params={"stat": "running"}), 422, "stat")
        assert said.startswith("stat: unknown query parameter; parameters: all, id, limit, name,"), said
        assert "state" in said
        refused(client.get("/api/v1/workloads", params={"all": "true", "qeue": "zzz"}), 422, "qeue")
        refused(client.get("/api/v1/queues", params={"x": "1"}), 422, "x")
        before = client.get("/api/v1/workloads", params={"all": "true"}).json()
        refused(client.post("/api/v1/workloads", params={"hodl": "true"}, json={"commands": ["true"]}), 422,
                "hodl")  # fmt: skip
        assert client.get("/api/v1/workloads", params={"all": "true"}).json() == before  # nothing stored
        assert client.get("/api/v1/workloads", params={"state": "running", "limit": 5}).status_code == 200
        # a user no token names and who never submitted: a typo, not "no work" (as `usage -u` says)
        said = refused(client.get("/api/v1/workloads", params={"user": "alcie"}), 422, "user")
        assert "no work was ever submitted by 'alcie' and no token has that name" in said
        assert client.get("/api/v1/workloads", params={"user": "admin"}).json() == []  # a token's name


@pytest.mark.parametrize("workload_id", [1 << 63, 10**30])
def test_a_workload_id_past_64_bits_is_404_not_a_500(server: ServerProcess, workload_id: int) -> None:
    with server.http() as client:
        for method, path in [
            ("GET", f"/api/v1/workloads/{workload_id}"),
            ("POST", f"/api/v1/workloads/{workload_id}/cancel"),
            ("GET", f"/api/v1/workloads/{workload_id}/logs"),
        ]:
            response = client.request(method, path)
            assert response.status_code == 404, response.text
            assert f"no workload with id {workload_id}" in response.json()["error"]["message"]


def test_a_log_offset_past_the_end_is_an_empty_chunk_not_a_500(server: ServerProcess) -> None:
    workload_id = server.submit({"commands": ["echo hi"]})["id"]
    server.wait_for(workload_id)
    with server.http() as client:
        for offset in (3, 1 << 63, 10**30):
            response = client.get(f"/api/v1/workloads/{workload_id}/logs", params={"offset": offset})
            assert response.status_code == 200, response.text
            chunk = response.json()
            assert chunk["data"] == "" and chunk["eof"] and chunk["offset"] == offset


def test_a_queue_cannot_be_put_under_a_queue_below_it(server: ServerProcess) -> None:
    with server.http() as client:
        for name, parent in [("research", None), ("nlp", "research"), ("llm", "nlp")]:
            assert client.post("/api/v1/queues", json={"name": name, "parent": parent}).status_code == 201
        message = refused(client.patch("/api/v1/queues/research", json={"parent": "llm"}), 422, "parent")
        assert "llm under nlp under research" in message and "loop" in message
        refused(client.patch("/api/v1/queues/nlp", json={"parent": "llm"}), 422, "parent")
        parents = {q["name"]: q["parent"] for q in client.get("/api/v1/queues").json()}
        assert parents == {"default": None, "research": None, "nlp": "research", "llm": "nlp"}


@pytest.mark.parametrize("body", [[], "nlp", 5])
def test_a_queue_update_that_is_not_an_object_says_so(server: ServerProcess, body: object) -> None:
    with server.http() as client:
        before = client.get("/api/v1/queues/default").json()
        message = refused(client.patch("/api/v1/queues/default", json=body), 422, "<spec>")
        assert "is not a queue spec: the top level must be a mapping" in message
        assert client.get("/api/v1/queues/default").json() == before


def test_what_the_server_cannot_parse_or_route_gets_the_api_error_shape(server: ServerProcess) -> None:
    json_body = {"content-type": "application/json"}
    with server.http() as client:
        bad = client.post("/api/v1/workloads", content=b"{not json", headers=json_body)
        message = refused(bad, 422, "body")
        assert "not valid JSON" in message and "at character 1" in message
        deep = b"[" * 100_000 + b"]" * 100_000
        message = refused(client.post("/api/v1/workloads", content=deep, headers=json_body), 400, "body")
        assert "nested too deeply" in message
        missing = client.get("/api/v1/nope")
        assert missing.status_code == 404
        assert missing.json()["error"]["message"].startswith("no such path: GET /api/v1/nope")
        wrong = client.delete("/api/v1/workloads")
        assert wrong.status_code == 405 and "/docs" in wrong.json()["error"]["message"]
        assert client.get("/api/v1/workloads", params={"all": True}).json() == []


def test_small_bodies_refuse_unknown_fields_and_wrong_types_and_change_nothing(server: ServerProcess) -> None:
    # Before, {"reason": 5} cordoned with the reason "5" and {"x": 1} cordoned, ignoring the typo.
    with server.http() as client:
        for path, body, field in [
            ("/api/v1/nodes/node-1/cordon", {"reason": 5}, "reason"),
            ("/api/v1/nodes/node-1/cordon", {"reson": "bad fan"}, "reson"),
            ("/api/v1/nodes/node-1/cordon", {"reason": "x" * 5000}, "reason"),
            ("/api/v1/nodes/node-1/drain", {"reason": ["bad fan"]}, "reason"),
            ("/api/v1/join-tokens", {"description": [1]}, "description"),
            ("/api/v1/join-tokens", {"tll": "1h"}, "tll"),
            ("/api/v1/health/run", {"node": ["node-1"]}, "node"),
            ("/api/v1/health/run", {"levle": "full"}, "levle"),
        ]:
            refused(client.post(path, json=body), 422, field)
        node = client.get("/api/v1/nodes").json()[0]
        assert node["state"] == "ready" and node["state_reason"] == ""
        assert client.get("/api/v1/join-tokens").json() == []
        assert client.get("/api/v1/workloads", params={"all": True}).json() == []  # no check job ran


def test_a_fault_value_of_the_wrong_type_is_refused_with_the_fix(server: ServerProcess) -> None:
    # Before: "invalid literal for int() with base 10: 'x'", and {"fall_off_bus": "no"} took the GPU off.
    with server.http() as client:
        for fault, value, fix in [
            ("xid", "x", "e.g. 79"),
            ("xid", 10**30, "e.g. 79"),
            ("xid", 0, "e.g. 79"),  # 0 == False: it was taken for no fault given at all
            ("slow", "half", "e.g. 0.5"),
            ("fall_off_bus", "no", "give true"),
        ]:
            response = client.post("/api/v1/nodes/node-1/faults", json={"gpu": 0, fault: value})
            assert fix in refused(response, 422, fault)
        refused(client.post("/api/v1/nodes/node-1/faults", json={"gpu": 0, "clear": True, "x": 1}), 422, "x")
        assert client.get("/api/v1/health/node-1").json()["findings"] == []
        assert client.get("/api/v1/nodes").json()[0]["state"] == "ready"


def test_telemetry_of_a_node_that_does_not_exist_is_404_naming_the_nodes(server: ServerProcess) -> None:
    with server.http() as client:
        response = client.get("/api/v1/telemetry/node-9")
        assert response.status_code == 404
        assert response.json()["error"]["message"] == "no node named 'node-9' (nodes: node-1)"
        refused(client.get("/api/v1/telemetry/node-1", params={"seconds": "nan"}), 422, "seconds")
        too_long = refused(
            client.get("/api/v1/telemetry/node-1", params={"seconds": "172800"}), 422, "seconds"
        )
        assert too_long == "seconds: 172800 is more than 86400, the most it takes", too_long


@pytest.fixture
def head(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = agent_head(tmp_path / "home").start()
    try:
        yield proc
    finally:
        proc.stop()


def test_an_agent_registration_of_the_wrong_types_is_refused_and_admits_nothing(head: ServerProcess) -> None:
    # Before, each of these was a 500, some after the node was admitted and the join token used.
    token = join_token(head)
    good: dict[str, Any] = {"name": "agent-0", "join_token": token}
    with plain_http.client(base_url=head.url, timeout=30) as agent, head.http() as client:
        for body, field in [
            ({**good, "join_token": 5}, "join_token"),
            ({**good, "credential": 5}, "credential"),
            ({**good, "name": 5}, "name"),
            ({**good, "info": []}, "info"),
            ({**good, "info": {"cpus": "many"}}, "info.cpus"),
            ({**good, "info": {"memory_bytes": -1}}, "info.memory_bytes"),
            ({**good, "info": {"gpus": "H100:8"}}, "info.gpus"),
            ({**good, "info": {"labels": "zone=a"}}, "info.labels"),
        ]:
            refused(agent.post("/api/v1/agents/register", json=body), 422, field)
        assert client.get("/api/v1/nodes").json() == []
        assert [t["uses"] for t in client.get("/api/v1/join-tokens").json()] == [0]


def test_gpupool_s_own_queue_takes_no_one_s_work(server: ServerProcess) -> None:
    """gpupool-system holds the head's node health checks, with no quota: work submitted or moved there
    would never be given GPUs, so it is refused (an admin's too), naming the field."""
    with server.http() as client:
        refused = client.post("/api/v1/workloads", json={"queue": "gpupool-system", "commands": ["true"]})
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["field"] == "queue" and "gpupool-system is gpupool's own" in error["message"]
        wid = server.submit({"resources": {"gpu": 100}, "commands": ["true"]})["id"]  # it stays pending
        moved = client.patch(f"/api/v1/workloads/{wid}", json={"queue": "gpupool-system"})
        assert moved.status_code == 403 and "gpupool-system is gpupool's own" in moved.text
        assert client.get("/api/v1/workloads?all=true").json()[0]["queue"] == "default"


def test_a_workdir_missing_on_the_heads_machine_is_warned_of_at_submit(
    server: ServerProcess, tmp_path: Path
) -> None:
    """The local backend runs all work here: a typo's starts failed as node failures, retried with backoff
    for minutes before the work failed; now the submit says so at once (the work is kept: earlier work may
    make the folder)."""
    with server.http() as client:
        missing = client.post("/api/v1/workloads", json={"commands": ["true"], "workdir": "/no/such/dir"})
        assert missing.status_code == 201, missing.text
        created = missing.json()
        assert created["warnings"] == [
            "workdir: /no/such/dir is not a folder on this machine, where the head runs its work; each start "
            f"fails until it is there: fix the path, or `gpupool cancel {created['id']}`"
        ]
        there = client.post("/api/v1/workloads", json={"commands": ["true"], "workdir": str(tmp_path)})
        assert there.json()["warnings"] == []
        client.post(f"/api/v1/workloads/{created['id']}/cancel").raise_for_status()
