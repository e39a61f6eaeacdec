"""Services run until cancelled: a real server starts a service again whenever its program exits, after a
crash-loop backoff that doubles with each quick exit and survives a kill -9 of the head."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import ServerProcess


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _wait(server: ServerProcess, workload_id: int, done: Any, timeout: float = 60.0) -> dict[str, Any]:
    """The workload once `done(workload)` holds; every state seen on the way must be pending or running."""
    deadline = time.time() + timeout
    while True:
        w = server.workload(workload_id)
        assert w["state"] in ("pending", "running"), f"a service ended by itself: {w}"
        if done(w):
            return w
        assert time.time() < deadline, f"workload {workload_id}: still waiting after {timeout}s: {w}"
        time.sleep(0.05)


def test_a_service_that_keeps_exiting_starts_again_after_a_doubling_backoff_until_cancelled(
    tmp_path: Path,
) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=["--restart-backoff", "2s"]).start()
    try:
        created = server.submit(
            {
                "kind": "service",
                "name": "flaky",
                "resources": {"gpu": 1},
                # attempts 0 and 2 fail, attempt 1 exits 0: a service starts again either way
                "commands": ['echo "attempt $GPUPOOL_ATTEMPT"', "exit $(( GPUPOOL_ATTEMPT % 2 ? 0 : 3 ))"],
            }
        )
        seen: list[dict[str, Any]] = []

        def backing_off(w: dict[str, Any]) -> bool:
            if w["reason_code"] == "restart-backoff":
                seen.append(w)
            return bool(w["attempts"] >= 3)

        w = _wait(server, created["id"], backing_off)
        assert seen, "the service was never seen waiting out its backoff"
        assert "next attempt starts at" in seen[0]["reason"] and "exited once" in seen[0]["reason"]
        assert "exit code 3" in seen[0]["reason"]

        attempts = server.workload(created["id"])["attempt_list"]
        assert [a["exit_code"] for a in attempts[:2]] == [3, 0]
        assert [a["state"] for a in attempts[:2]] == ["failed", "succeeded"]
        first_wait = _at(attempts[1]["started_at"]) - _at(attempts[0]["finished_at"])
        second_wait = _at(attempts[2]["started_at"]) - _at(attempts[1]["finished_at"])
        assert 2.0 <= first_wait < 6.0, first_wait
        assert 4.0 <= second_wait < 8.0, second_wait  # two quick exits in a row: twice the base
        assert w["restarts"] >= 2

        with server.http() as client:
            assert client.post(f"/api/v1/workloads/{created['id']}/cancel").status_code == 202
        ended = server.wait_for(created["id"], timeout=30)
        assert ended["state"] == "cancelled", ended
    finally:
        server.stop()


def test_a_service_waiting_out_its_backoff_keeps_it_across_a_kill9_of_the_head(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=["--restart-backoff", "30s"]).start()
    try:
        created = server.submit({"kind": "service", "commands": ["exit 1"], "resources": {"gpu": 1}})
        before = _wait(server, created["id"], lambda w: w["reason_code"] == "restart-backoff", timeout=30)
        server.kill9()
        server.start()
        after = _wait(server, created["id"], lambda w: w["reason_code"] == "restart-backoff", timeout=30)
        assert after["reason"] == before["reason"]  # the same clock time to start again
        assert after["attempts"] == 1 and after["state"] == "pending"
        # a job beside it is not held back: the backoff leaves the service out of scheduling, GPUs free
        job = server.submit({"commands": ["echo ran"], "resources": {"gpu": 8}})
        assert server.wait_for(job["id"], timeout=30)["state"] == "succeeded"
        with server.http() as client:
            assert client.post(f"/api/v1/workloads/{created['id']}/cancel").status_code == 202
        assert server.wait_for(created["id"], timeout=30)["state"] == "cancelled"
    finally:
        server.stop()


def test_a_bad_restart_backoff_is_refused_with_the_fix(tmp_path: Path) -> None:
    assert "--restart-backoff 2h: must be 0 to 1h" in _refusal(tmp_path, "2h")
    assert "--restart-backoff" in _refusal(tmp_path, "soon")


def _refusal(tmp_path: Path, given: str) -> str:
    server = ServerProcess(home=tmp_path / f"again-{given}", extra_args=["--restart-backoff", given])
    with pytest.raises(RuntimeError) as failed:
        server.start(timeout=20)
    return str(failed.value)


def test_a_service_spec_with_a_retry_policy_is_refused_and_nothing_is_stored(server: ServerProcess) -> None:
    with server.http() as client:
        response = client.post(
            "/api/v1/workloads",
            json={"kind": "service", "commands": ["serve"], "retry": {"max_restarts": 2}},
        )
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["field"] == "retry" and "applies to jobs only" in error["message"]
        assert client.get("/api/v1/workloads", params={"all": True}).json() == []


def test_gpupool_run_service_runs_a_command_as_a_service(server: ServerProcess, tmp_path: Path) -> None:
    created = server.cli("run", "--service", "--gpus", "1", "--json", "--", "sleep", "60", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    w = server.wait_for(int(json.loads(created.stdout)["id"]), ("running",))
    assert w["kind"] == "service"
    assert "kind=service" in server.cli("show", str(w["id"]), check=True).stdout
    server.cli("cancel", str(w["id"]), check=True)
    assert server.wait_for(w["id"])["state"] == "cancelled"
