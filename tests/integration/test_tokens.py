"""Users and roles on a real server: an admin makes tokens for people; a user submits to their queues and
changes only their own work; a viewer only reads; a revoked token stops working at once."""

from __future__ import annotations

import json
from typing import Any

from tests.support.server import ServerProcess


def _call(server: ServerProcess, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    with server.http(token) as client:
        response = client.request(method, path, json=body)
        return response.status_code, response.json()


def _token(server: ServerProcess, *args: str) -> str:
    made = json.loads(server.cli("token", "create", *args, "--json", check=True).stdout)
    return str(made["token"])


def test_users_submit_to_their_queues_and_change_only_their_own_work(server: ServerProcess) -> None:
    server.cli("queue", "create", "nlp", "--gpu-quota", "2", check=True)
    alice = _token(server, "alice", "--queue", "nlp")
    bob = _token(server, "bob", "--role", "viewer")
    made = server.cli("token", "create", "carol", check=True)
    carol = made.stdout.splitlines()[-1]  # the token alone on the last line, for scripts
    assert carol.startswith("gpp_") and carol not in made.stderr  # shown once
    assert made.stderr.strip() == (
        f"give it to carol: export GPUPOOL_TOKEN=<the token above> GPUPOOL_SERVER={server.url}"
    )
    assert _call(server, alice, "GET", "/api/v1/whoami") == (
        200,
        {"name": "alice", "role": "user", "queues": ["nlp"]},
    )

    status, mine = _call(
        server, alice, "POST", "/api/v1/workloads", {"queue": "nlp", "commands": ["sleep 60"]}
    )
    assert status == 201 and mine["user"] == "alice"
    status, refused = _call(
        server, alice, "POST", "/api/v1/workloads", {"queue": "default", "commands": ["true"]}
    )
    assert status == 403 and refused["error"]["field"] == "queue", refused
    assert "may submit only to nlp, not 'default'" in refused["error"]["message"]
    theirs = server.submit({"commands": ["sleep 60"]})  # the admin's

    status, denied = _call(server, alice, "POST", f"/api/v1/workloads/{theirs['id']}/cancel")
    assert status == 403 and "belongs to admin" in denied["error"]["message"], denied
    for path, body in (
        ("/api/v1/queues", {"name": "mine"}),
        ("/api/v1/tokens", {"name": "carol"}),
        ("/api/v1/nodes/node-1/cordon", None),
        ("/api/v1/join-tokens", None),
    ):
        status, denied = _call(server, alice, "POST", path, body)
        assert status == 403 and "takes an admin token" in denied["error"]["message"], (path, denied)
    status, held = _call(server, alice, "POST", f"/api/v1/workloads/{mine['id']}/hold")
    assert status == 200, held
    events = server.workload(mine["id"])["events"]
    assert any(e["actor"] == "alice" and e["reason"].startswith("held by alice") for e in events), events

    assert _call(server, bob, "GET", f"/api/v1/workloads/{mine['id']}")[0] == 200  # a viewer reads all
    assert _call(server, bob, "GET", "/api/v1/usage?by=user")[0] == 200
    status, denied = _call(server, bob, "POST", "/api/v1/workloads", {"queue": "nlp", "commands": ["true"]})
    assert status == 403 and "viewer's, which may only read" in denied["error"]["message"]
    assert _call(server, bob, "POST", f"/api/v1/workloads/{mine['id']}/release")[0] == 403

    server.extra_env["GPUPOOL_TOKEN"] = alice  # the CLI as alice
    try:
        listed = json.loads(server.cli("ps", "--me", "--json", check=True).stdout)
        assert [row["id"] for row in listed] == [mine["id"]] and listed[0]["user"] == "alice"
        assert "alice (role user; submits to nlp)" in server.cli("whoami", check=True).stdout
        server.extra_env["GPUPOOL_TOKEN"] = bob
        viewer = server.cli("whoami", check=True).stdout
        assert "bob (role viewer; reads everything, submits and changes nothing)" in viewer
    finally:
        del server.extra_env["GPUPOOL_TOKEN"]
    table = server.cli("ps", check=True).stdout  # the admin's view: two users' work, so a USER column
    assert "USER" in table and "alice" in table, table

    server.cli("cancel", str(mine["id"]), str(theirs["id"]), check=True)  # an admin changes anyone's work
    server.cli("token", "revoke", "alice", check=True)
    status, gone = _call(server, alice, "GET", "/api/v1/whoami")
    assert status == 401 and "invalid token" in gone["error"]["message"]


def test_bad_token_requests_name_the_field_and_change_nothing(server: ServerProcess) -> None:
    admin = server.token
    for body, code, field in (
        ({"name": "Alice Smith"}, 422, "name"),
        ({"name": "carol", "role": "root"}, 422, "role"),
        ({"name": "carol", "queues": ["nope"]}, 422, "queues[0]"),
        ({"name": "carol", "queues": "nlp"}, 422, "queues"),
        ({"name": "carol", "role": "viewer", "queues": ["default"]}, 422, "queues"),
        ({"name": "admin"}, 409, "name"),
        ({"name": "health"}, 422, "name"),  # the head's own: its check jobs run as health
        ({"name": "control"}, 422, "name"),
        ({"name": "carol", "email": "c@x"}, 422, "email"),
    ):
        status, answer = _call(server, admin, "POST", "/api/v1/tokens", body)
        assert status == code and answer["error"]["field"] == field, (body, answer)
    assert [t["name"] for t in _call(server, admin, "GET", "/api/v1/tokens")[1]] == ["admin"]
    status, answer = _call(server, admin, "DELETE", "/api/v1/tokens/admin")
    assert status == 409 and "--new-admin-token" in answer["error"]["message"]
    assert _call(server, admin, "DELETE", "/api/v1/tokens/nobody")[0] == 404


def test_work_that_names_no_queue_goes_to_the_queue_of_a_token_for_one(server: ServerProcess) -> None:
    """As Slurm's default account: a token for one queue needs no --queue; a token for several must name one;
    an admin's work without a queue goes to `default`."""
    import subprocess
    import sys

    for name in ("nlp", "cv"):
        server.cli("queue", "create", name, check=True)
    alice = _token(server, "alice", "--queue", "nlp")
    both = _token(server, "dana", "--queue", "nlp", "--queue", "cv")
    status, made = _call(
        server, alice, "POST", "/api/v1/workloads", {"commands": ["true"], "resources": {"gpu": 0}}
    )
    assert status == 201 and made["queue"] == "nlp", made
    as_alice = {**server.env, "GPUPOOL_TOKEN": alice}
    folder = server.home / "specs"
    folder.mkdir()
    (folder / "job.yaml").write_text("kind: job\ncommands: [echo hi]\nresources: {gpu: 0}\n")
    for command in (["run", "--gpus", "0", "--", "true"], ["submit", "job.yaml"]):
        out = subprocess.run(
            [sys.executable, "-m", "gpupool.main", *command], env=as_alice, cwd=folder, capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0 and "to queue nlp" in out.stdout, (command, out.stdout, out.stderr)
    status, refused = _call(server, both, "POST", "/api/v1/workloads", {"commands": ["true"]})
    assert status == 403 and "may submit only to cv, nlp, not 'default'" in refused["error"]["message"]
    assert server.submit({"commands": ["true"], "resources": {"gpu": 0}})["queue"] == "default"


def test_what_an_admin_did_to_a_users_work_only_an_admin_undoes(server: ServerProcess) -> None:
    """As Slurm: a user releases their own hold but not an admin's, lowers their work's priority and time
    limit but does not raise them (nor remove the limit); refused changes change nothing."""
    alice = _token(server, "alice")
    status, job = _call(
        server, alice, "POST", "/api/v1/workloads", {"commands": ["sleep 60"], "max_duration": "1h"}
    )
    assert status == 201, job
    path = f"/api/v1/workloads/{job['id']}"
    assert _call(server, alice, "POST", f"{path}/hold")[0] == 200
    assert _call(server, alice, "POST", f"{path}/release")[0] == 200, "her own hold is hers to release"

    server.cli("hold", str(job["id"]), check=True)  # the admin's
    status, denied = _call(server, alice, "POST", f"{path}/release")
    assert status == 403 and denied["error"]["field"] == "held", denied
    assert "held by an admin" in denied["error"]["message"] and "ask them" in denied["error"]["message"]
    assert server.workload(job["id"])["held"] is True
    server.cli("release", str(job["id"]), check=True)

    assert _call(server, alice, "PATCH", path, {"priority": 10, "max_duration": "30m"})[0] == 200
    for body, field in (({"priority": 1000}, "priority"), ({"max_duration": "2h"}, "max_duration"),
                        ({"max_duration": None}, "max_duration")):  # fmt: skip
        status, denied = _call(server, alice, "PATCH", path, body)
        assert status == 403 and denied["error"]["field"] == field, (body, denied)
        assert "takes an admin" in denied["error"]["message"], denied
    after = server.workload(job["id"])
    assert (after["priority"], after["spec"]["max_duration"]) == (10, 1800), after
    server.cli("update", str(job["id"]), "--priority", "100", "--max-duration", "none", check=True)
    after = server.workload(job["id"])
    assert (after["priority"], after["spec"].get("max_duration")) == (100, None), "an admin raises both"
    server.cli("cancel", str(job["id"]), check=True)


def test_a_queues_max_priority_holds_users_work_below_it_and_not_an_admins(server: ServerProcess) -> None:
    """As a Slurm QOS caps priority: with max_priority 50 a user cannot outrank teammates' train work at
    submit nor by moving high-priority work in; an admin can."""
    server.cli("queue", "create", "nlp", "--max-priority", "50", check=True)
    server.cli("queue", "create", "open", check=True)
    shown = server.cli("queue", "show", "nlp", check=True).stdout
    assert "users' work at priority 50 at most (max_priority)" in shown, shown
    alice = _token(server, "alice")
    status, denied = _call(
        server, alice, "POST", "/api/v1/workloads", {"queue": "nlp", "priority": 1000, "commands": ["true"]}
    )
    assert status == 403 and denied["error"]["field"] == "priority", denied
    assert "queue nlp takes work up to priority 50 from users" in denied["error"]["message"], denied
    status, high = _call(
        server, alice, "POST", "/api/v1/workloads?hold=true",
        {"queue": "open", "priority": 1000, "commands": ["sleep 60"]},
    )  # fmt: skip
    assert status == 201, high
    status, denied = _call(server, alice, "PATCH", f"/api/v1/workloads/{high['id']}", {"queue": "nlp"})
    assert status == 403 and denied["error"]["field"] == "priority", denied
    assert server.workload(high["id"])["queue"] == "open"
    admins = server.submit({"queue": "nlp", "priority": 1000, "commands": ["true"]})
    assert admins["priority"] == 1000
    server.cli("cancel", str(high["id"]), check=True)
