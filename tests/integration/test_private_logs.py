"""`gpupool server --private-logs` on a real server with a real job: its output is read by its owner and
admins; anyone else gets 403 saying why, through the API and `gpupool logs`."""

from __future__ import annotations

import json
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
