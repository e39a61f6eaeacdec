"""The audit log on a real server: queues, tokens and join tokens made, changed and removed, and work
cancelled, each listed with who did it and what changed (never a token itself), filtered by kind, object
and actor; only admins read it; bad filters are refused naming the field."""

from __future__ import annotations

import json
from typing import Any

from tests.support.server import ServerProcess


def _audit(server: ServerProcess, *args: str) -> list[dict[str, Any]]:
    return list(json.loads(server.cli("audit", "--json", *args, check=True).stdout))


def test_who_changed_what_is_listed_with_what_changed(server: ServerProcess) -> None:
    server.cli("queue", "create", "nlp", "--gpu-quota", "8", check=True)
    server.cli("queue", "update", "nlp", "--gpu-quota", "16", "--gpu-weight", "2", check=True)
    made = json.loads(server.cli("token", "create", "alice", "--queue", "nlp", "--json", check=True).stdout)
    alice = str(made["token"])
    joined = json.loads(server.cli("node", "join-token", "create", "--json", check=True).stdout)
    server.cli("node", "join-token", "revoke", str(joined["id"]), check=True)
    made = json.loads(server.cli("token", "create", "ops", "--role", "admin", "--json", check=True).stdout)
    with server.http(str(made["token"])) as ops:  # another admin: the log names who, not the role
        assert ops.post("/api/v1/nodes/node-1/cordon").status_code == 200
        assert ops.post("/api/v1/nodes/node-1/uncordon").status_code == 200

    with server.http(alice) as client:
        job = client.post("/api/v1/workloads", json={"queue": "nlp", "commands": ["sleep 600"]}).json()
        server.wait_for(job["id"], states=("running",))  # cancelled while running, not while still pending
        assert client.post(f"/api/v1/workloads/{job['id']}/cancel").status_code == 202
        refused = client.get("/api/v1/events")
        assert refused.status_code == 403 and refused.json()["error"]["message"] == (
            "GET /api/v1/events is for admins only, which takes an admin token; "
            "the token 'alice' has role user"
        )  # a read: not "changes the pool itself"
    server.wait_for(job["id"])
    server.cli("token", "revoke", "alice", check=True)
    server.cli("queue", "delete", "nlp", check=True)

    queue = _audit(server, "--kind", "queue", "--object", "nlp")
    assert [e["change"] for e in queue] == [
        "deleted (it had: resources.gpu.over_quota_weight 2; resources.gpu.quota 16)",
        "updated: resources.gpu.over_quota_weight 1 -> 2; resources.gpu.quota 8 -> 16",
        "created: resources.gpu.quota 8",
    ]
    assert all(e["actor"] == "admin" for e in queue)

    tokens = _audit(server, "--kind", "token", "--object", "alice")
    assert [e["change"] for e in tokens] == ["revoked (role user)", "created: role user, queues nlp"]
    assert alice not in json.dumps(_audit(server))  # a token itself is never written down
    joins = _audit(server, "--kind", "join-token")
    assert joins[0]["change"].startswith("revoked: gpj_") and joins[1]["change"].startswith("created: gpj_")
    assert joined["token"] not in json.dumps(joins)

    by_alice = _audit(server, "--actor", "alice")  # she submitted and asked to stop it; the head stopped it
    assert [(e["kind"], e["object"], e["from"], e["to"]) for e in by_alice] == [
        ("workload", str(job["id"]), "running", "running"),
        ("workload", str(job["id"]), None, "pending"),
    ], by_alice
    assert by_alice[0]["change"] == "cancel asked by alice: stopping it"
    nodes = _audit(server, "--kind", "node", "--actor", "ops")
    assert [(e["from"], e["to"], e["change"]) for e in nodes] == [
        ("cordoned", "ready", "uncordoned by ops"),
        ("ready", "cordoned", "cordoned by ops"),
    ]
    newest = _audit(server, "-n", "1")
    assert len(newest) == 1 and newest[0]["kind"] == "queue" and newest[0]["object"] == "nlp"

    table = server.cli("audit", "--kind", "queue", check=True).stdout
    lines = [line for line in table.splitlines() if "nlp" in line]
    assert len(lines) == 3 and "created" in lines[0] and "deleted" in lines[2], table  # oldest first


def test_bad_filters_are_refused_naming_the_field(server: ServerProcess) -> None:
    with server.http() as client:
        for query, field, said in (
            ("kind=queues", "kind", "is not one of workload, attempt, node, queue"),
            ("object=nlp", "kind", "name its kind too"),
            ("since=yesterday", "since", "neither a time nor a duration"),
            ("since=2026-12-02&until=2026-12-01", "since", "is not before until"),
            ("since=10000d", "since", "at most 3650d"),
            ("limit=0", "limit", "is not 1..10000"),
        ):
            refused = client.get(f"/api/v1/events?{query}")
            assert refused.status_code == 422, (query, refused.text)
            error = refused.json()["error"]
            assert error["field"] == field and said in error["message"], (query, error)
    with server.http() as client:  # since counts back from until, as `usage` does; 4-digit durations too
        for query in ("since=1h&until=2h", "since=1440m", "since=3600s"):
            assert client.get(f"/api/v1/events?{query}").status_code == 200, query
    failed = server.cli("audit", "--kind", "queues")
    assert failed.returncode != 0 and "kind" in failed.stderr, failed.stderr
