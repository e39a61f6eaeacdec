"""Secrets on a real server with real processes: a user's work gets their secret in its environment, read
when each attempt starts (a replaced value reaches the next one, a deleted one fails it with the reason);
no listing, spec or audit entry shows a value; nobody else can use or list them; bad input is refused
naming the field. The store holds every value encrypted with the head's key (the database file shows none),
a value from before is encrypted at the next start, and a head without the key still starts, marks the
secret and fails the work that needs it naming the key."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
import stat
from contextlib import closing
from pathlib import Path

import pytest

from gpupool.control.secret_keys import load_keys
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


def _database(server: ServerProcess) -> bytes:
    """Every byte SQLite keeps of the store, the write-ahead log included."""
    return b"".join(p.read_bytes() for p in server.home.glob("gpupool.db*"))


def _sql(server: ServerProcess, statement: str, *parameters: str) -> list[tuple[str, ...]]:
    """`statement` on the store's SQLite file, straight, committed; the connection closed at once (one
    left open would keep the write-ahead log the head deletes when it stops)."""
    with closing(sqlite3.connect(server.home / "gpupool.db")) as db, db:
        return db.execute(statement, parameters).fetchall()


def _rows(server: ServerProcess) -> dict[str, tuple[str, str]]:
    return {n: (v, u) for n, v, u in _sql(server, "select name, value, updated_at from secrets")}


def test_the_store_holds_no_value_and_a_restarted_head_still_gives_them(server: ServerProcess) -> None:
    alice = _token(server, "alice")
    check = {
        "secrets": ["HF_TOKEN"],
        "commands": ['test "$(printf %s "$HF_TOKEN" | sha256sum | cut -d" " -f1)" = "$EXPECTED"'],
        "env": {"EXPECTED": _sha("hf_abc123")},
    }
    with server.http(alice) as client:
        assert client.put("/api/v1/secrets/HF_TOKEN", json={"value": "hf_abc123"}).status_code == 200
        assert server.wait_for(client.post("/api/v1/workloads", json=check).json()["id"])["state"] == (
            "succeeded"
        )
    key_file = server.home / "secrets.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600  # made at the first start
    keys = load_keys(key_file)
    stored, _ = _rows(server)["HF_TOKEN"]
    assert stored.startswith(f"enc1:{keys.current}:") and b"hf_abc123" not in _database(server)

    # a row from before encryption, written while the head is down, is encrypted at the next start
    server.stop()
    set_at = _rows(server)["HF_TOKEN"][1]
    _sql(
        server,
        "insert into secrets (owner, name, value, updated_at) values (?, ?, ?, ?)",
        *("alice", "LEGACY", "legacy_plain", set_at),
    )
    server.start()
    assert "event=secrets_encrypted" in server.log() and "plain_encrypted=1" in server.log()
    rows = _rows(server)
    assert rows["LEGACY"][0].startswith(f"enc1:{keys.current}:") and rows["LEGACY"][1] == set_at
    assert rows["HF_TOKEN"][0] == stored  # already under the key: left as it was
    both = {
        "secrets": ["HF_TOKEN", "LEGACY"],
        "commands": ['test "$(printf %s "$HF_TOKEN:$LEGACY" | sha256sum | cut -d" " -f1)" = "$EXPECTED"'],
        "env": {"EXPECTED": _sha("hf_abc123:legacy_plain")},
    }
    with server.http(alice) as client:
        assert (
            server.wait_for(client.post("/api/v1/workloads", json=both).json()["id"])["state"] == "succeeded"
        )
    # what the plain text left in free space (if any) goes with a VACUUM, as docs/operations.md advises
    server.stop()
    _sql(server, "vacuum")
    assert b"legacy_plain" not in _database(server) and b"hf_abc123" not in _database(server)


def test_a_head_without_the_key_starts_marks_the_secret_and_fails_the_work_naming_the_key(
    server: ServerProcess, tmp_path: Path
) -> None:
    alice = _token(server, "alice")
    with server.http(alice) as client:
        assert client.put("/api/v1/secrets/HF_TOKEN", json={"value": "hf_abc123"}).status_code == 200
    lost = load_keys(server.home / "secrets.key").current
    server.stop()

    other = tmp_path / "other.key"
    other.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    other.chmod(0o644)
    server.extra_env["GPUPOOL_SECRETS_KEY_FILE"] = str(other)  # the option's variable
    with pytest.raises(RuntimeError) as refused:
        server.start()
    assert f"{other}: the secrets key file is open to every user of this machine" in str(refused.value)
    assert f"chmod 600 {other}" in str(refused.value)

    other.chmod(0o600)
    server.start()  # a secret it cannot open does not stop the head: the rest of the pool works
    assert f"event=secrets_unreadable count=1 need={lost}" in server.log()
    server.extra_env["GPUPOOL_TOKEN"] = alice
    try:
        listed = server.cli("secret", "list", check=True).stdout
    finally:
        del server.extra_env["GPUPOOL_TOKEN"]
    assert "unreadable" in listed and f"encrypted with the key {lost}" in listed, listed
    with server.http(alice) as client:
        job = client.post("/api/v1/workloads", json={"secrets": ["HF_TOKEN"], "commands": ["true"]}).json()
    failed = server.wait_for(job["id"])
    reason = failed["reason"]
    assert failed["state"] == "failed", failed
    assert f"the secret HF_TOKEN of alice cannot be decrypted: it was encrypted with the key {lost}" in reason
    assert str(other) in reason and "put that key back" in reason


def test_the_heads_own_credentials_never_reach_a_job(tmp_path: Path) -> None:
    """A job gets the head's environment (PATH, locale, SLURM_CONF) but not the head's credentials in it:
    its database password, cloud keys, tokens. Its owner's own values come through `env` and `secrets`."""
    head = {"PGPASSWORD": "head-db-pw", "AWS_SECRET_ACCESS_KEY": "head-aws-key", "VAULT_TOKEN": "head-vt"}
    server = ServerProcess(home=tmp_path / "home", extra_env=dict(head)).start()
    try:
        with server.http() as admin:
            assert admin.put("/api/v1/secrets/VAULT_TOKEN", json={"value": "users-own"}).status_code == 200
        job = server.submit({"secrets": ["VAULT_TOKEN"], "env": {"LR": "0.1"}, "commands": ["env | sort"]})
        assert server.wait_for(job["id"])["state"] == "succeeded"
        with server.http() as admin:
            output = admin.get(f"/api/v1/workloads/{job['id']}/logs").json()["data"]
        assert "VAULT_TOKEN=users-own" in output and "LR=0.1" in output and "PATH=" in output
        assert not [value for value in head.values() if value in output], output
        assert "PGPASSWORD" not in output and "AWS_SECRET_ACCESS_KEY" not in output
    finally:
        server.stop()
