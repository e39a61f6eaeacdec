"""`gpupool server --private-logs` on a real server with a real job: its output is read by its owner and
admins; anyone else gets 403 saying why, through the API and `gpupool logs`."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from tests.support.server import ServerProcess


def test_with_private_logs_only_the_owner_and_admins_read_the_output(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=["--private-logs"]).start()
    try:
        tokens = {
            name: str(json.loads(server.cli("token", "create", name, "--json", check=True).stdout)["token"])
            for name in ("alice", "bob")
        }
        with server.http(tokens["alice"]) as alice:
            job = alice.post("/api/v1/workloads", json={"commands": ["echo hello-from-alice"]}).json()
            server.wait_for(job["id"])
            path = f"/api/v1/workloads/{job['id']}/logs"
            assert "hello-from-alice" in alice.get(path).json()["data"]
        with server.http(tokens["bob"]) as bob:
            refused = bob.get(path)
            assert refused.status_code == 403, refused.text
            said = refused.json()["error"]["message"]
            assert f"workload {job['id']}'s output is private to its owner (alice)" in said, said
            assert bob.get("/api/v1/workloads/999/logs").status_code == 404
        with server.http() as admin:
            assert "hello-from-alice" in admin.get(path).json()["data"]
        server.extra_env["GPUPOOL_TOKEN"] = tokens["bob"]
        try:
            failed = server.cli("logs", str(job["id"]))
            assert failed.returncode == 1 and "private to its owner (alice)" in failed.stderr, failed.stderr
        finally:
            del server.extra_env["GPUPOOL_TOKEN"]
    finally:
        server.stop()


def test_a_home_open_to_other_users_is_made_private_at_start_and_new_output_is_0600(tmp_path: Path) -> None:
    """--private-logs guards the API; a home of 0755 with 0644 logs and store (as a head before 2026-12-07
    left it, or an operator's mkdir) let every Unix user of the head read the output and the store."""
    home = tmp_path / "home"
    server = ServerProcess(home=home, extra_args=["--private-logs"]).start()
    try:
        first = server.submit({"commands": ["echo one"]})
        server.wait_for(first["id"])
    finally:
        server.stop()
    for path in (home, home / "logs", home / "runs", home / "logs" / str(first["id"])):
        path.chmod(0o755)
    (home / "gpupool.db").chmod(0o644)

    server.start()
    try:
        assert _mode(home) == 0o700  # inside it no other user reaches the store or the logs
        said = server.log()
        assert "event=home_made_private" in said and "mode=755->700" in said, said
        second = server.submit({"commands": ["echo two"]})
        server.wait_for(second["id"])
        log = home / "logs" / str(second["id"]) / "attempt-0.log"
        assert "two" in log.read_text() and _mode(log) == 0o600
        # (its folders keep the operator's umask: inside the 0700 home no other user reaches them)
    finally:
        server.stop()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)
