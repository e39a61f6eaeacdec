"""Secrets on a real server with real processes: a user's work gets their secret in its environment, read
when each attempt starts (a replaced value reaches the next one, a deleted one fails it with the reason);
no listing, spec or audit entry shows a value; nobody else can use or list them; bad input is refused
naming the field."""

from __future__ import annotations

import hashlib
import json

from tests.support.server import ServerProcess


def _token(server: ServerProcess, name: str) -> str:
    return str(json.loads(server.cli("token", "create", name, "--json", check=True).stdout)["token"])


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def test_work_gets_its_owners_secret_and_nobody_sees_it(server: ServerProcess) -> None:
    alice, bob = _token(server, "alice"), _token(server, "bob")
    server.extra_env["GPUPOOL_TOKEN"] = alice
    try:
        said = server.cli("secret", "set", "HF_TOKEN", input="hf_abc123\n", check=True).stdout
        assert "set the secret HF_TOKEN of alice" in said
        listed = server.cli("secret", "list", "--json", check=True).stdout
        assert [r["name"] for r in json.loads(listed)] == ["HF_TOKEN"] and "hf_abc123" not in listed
        empty = server.cli("secret", "set", "EMPTY", input="\n")
        assert empty.returncode == 1 and "would be empty" in empty.stderr
    finally:
        del server.extra_env["GPUPOOL_TOKEN"]

    # the job compares a hash of what it got with the one expected: the spec holds no value
    check = {
        "secrets": ["HF_TOKEN"],
        "commands": ['test "$(printf %s "$HF_TOKEN" | sha256sum | cut -d" " -f1)" = "$EXPECTED"'],
    }
    with server.http(alice) as client:
        first = client.post(
            "/api/v1/workloads", json={**check, "env": {"EXPECTED": _sha("hf_abc123")}}
        ).json()
        assert server.wait_for(first["id"])["state"] == "succeeded"
        shown = client.get(f"/api/v1/workloads/{first['id']}").json()["spec"]
        assert shown["secrets"] == ["HF_TOKEN"] and "hf_abc123" not in json.dumps(shown)
    assert "secrets: HF_TOKEN (of alice)" in server.cli("show", str(first["id"]), check=True).stdout
    with server.http(alice) as client:
        assert client.put("/api/v1/secrets/HF_TOKEN", json={"value": "hf_new"}).status_code == 200
        second = client.post("/api/v1/workloads", json={**check, "env": {"EXPECTED": _sha("hf_new")}}).json()
        assert server.wait_for(second["id"])["state"] == "succeeded"  # the value as it is at the start

        held = client.post("/api/v1/workloads?hold=true", json={**check, "env": {"EXPECTED": "x"}}).json()
        assert client.delete("/api/v1/secrets/HF_TOKEN").status_code == 200
        assert client.post(f"/api/v1/workloads/{held['id']}/release").status_code == 200
        failed = server.wait_for(held["id"])
        assert failed["state"] == "failed", failed
        assert "the secret HF_TOKEN of alice no longer exists" in failed["reason"], failed["reason"]

        bad = client.put("/api/v1/secrets/HF-TOKEN", json={"value": "x"})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "name", bad.text
        blank = client.put("/api/v1/secrets/OK", json={"value": ""})
        assert blank.status_code == 422 and blank.json()["error"]["field"] == "value", blank.text

    with server.http(bob) as client:
        assert client.put("/api/v1/secrets/HF_TOKEN", json={"value": "bobs"}).status_code == 200
        assert [r["owner"] for r in client.get("/api/v1/secrets").json()] == ["bob"]
        refused = client.get("/api/v1/secrets?owner=alice")
        assert refused.status_code == 403, refused.text
        missing = client.post("/api/v1/workloads", json={"secrets": ["WANDB_API_KEY"], "commands": ["true"]})
        assert missing.status_code == 422, missing.text
        error = missing.json()["error"]
        assert (
            error["field"] == "secrets[0]" and "bob has no secret named 'WANDB_API_KEY'" in error["message"]
        )
        assert "gpupool secret set WANDB_API_KEY" in error["message"]
    with server.http() as admin:
        assert [r["name"] for r in admin.get("/api/v1/secrets?owner=bob").json()] == ["HF_TOKEN"]
        log = admin.get("/api/v1/events?kind=secret").json()
        assert [(e["object"], e["change"], e["actor"]) for e in log] == [
            ("bob/HF_TOKEN", "set", "bob"),
            ("alice/HF_TOKEN", "deleted", "alice"),
            ("alice/HF_TOKEN", "replaced", "alice"),
            ("alice/HF_TOKEN", "set", "alice"),
        ]
        everything = json.dumps(admin.get("/api/v1/events?limit=10000").json())
        assert "hf_abc123" not in everything and "hf_new" not in everything and "bobs" not in everything
