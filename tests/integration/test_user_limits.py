"""Per-user limits in a queue on a real server: a user's second job waits with the reason `user-limit`
while a teammate's runs, and starts once the first ends; the caps are set and removed from the CLI."""

from __future__ import annotations

import json

from tests.support.server import ServerProcess


def _token(server: ServerProcess, name: str) -> str:
    made = json.loads(server.cli("token", "create", name, "--json", check=True).stdout)
    return str(made["token"])


def _submit(server: ServerProcess, token: str, spec: dict[str, object]) -> int:
    with server.http(token) as client:
        created = client.post("/api/v1/workloads", json=spec)
        assert created.status_code == 201, created.text
        return int(created.json()["id"])


def test_a_users_work_beyond_the_cap_waits_while_a_teammates_runs(server: ServerProcess) -> None:
    server.cli("queue", "create", "nlp", "--user-gpus", "2", "--user-workloads", "1", check=True)
    alice, bob = _token(server, "alice"), _token(server, "bob")
    first = _submit(server, alice, {"queue": "nlp", "commands": ["sleep 4"], "resources": {"gpu": 2}})
    server.wait_for(first, states=("running",))
    second = _submit(server, alice, {"queue": "nlp", "commands": ["true"], "resources": {"gpu": 1}})
    theirs = _submit(server, bob, {"queue": "nlp", "commands": ["sleep 30"], "resources": {"gpu": 2}})

    waiting = server.wait_for_reason(second)
    assert waiting["state"] == "pending" and waiting["reason_code"] == "user-limit", waiting
    assert (
        "alice holds or is next in line for 2 of the 2 GPUs one user may hold in queue nlp"
        in waiting["reason"]
    )
    assert server.wait_for(theirs, states=("running",))["state"] == "running"  # bob is not held by alice
    assert server.wait_for(second, timeout=60)["state"] == "succeeded"  # after alice's first ended

    queue = json.loads(server.cli("queues", "--json", check=True).stdout)[1]
    assert queue["user_limits"] == {"gpus": 2.0, "workloads": 1}
    server.cli("queue", "update", "nlp", "--user-gpus", "none", check=True)
    queue = json.loads(server.cli("queues", "--json", check=True).stdout)[1]
    assert queue["user_limits"] == {"gpus": None, "workloads": 1}
    server.cli("cancel", str(theirs), check=True)


def test_bad_user_limits_are_refused_with_the_fix(server: ServerProcess) -> None:
    for args, said in (
        (["--user-gpus", "lots"], "--user-gpus lots: a number, e.g. 8, or none to remove the cap"),
        (["--user-workloads", "0"], "user_limits.workloads: 0 must be at least 1"),
    ):
        refused = server.cli("queue", "create", "nlp", *args)
        assert refused.returncode == 1 and said in refused.stderr, refused.stderr
    assert [q["name"] for q in json.loads(server.cli("queues", "--json", check=True).stdout)] == ["default"]
