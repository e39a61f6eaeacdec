"""Fair share by history on a real server: `--usage-weight` tilts the over-quota split toward the queue
that used less, from the attempts in the store."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.server import ServerProcess


def _queues(server: ServerProcess) -> dict[str, dict[str, object]]:
    with server.http() as client:
        return {q["name"]: q for q in client.get("/api/v1/queues").json()}


def _fair(server: ServerProcess) -> tuple[float, float, bool]:
    """Fair shares of heavy and light as the last scheduler cycle computed them, and whether that cycle
    saw all four competing jobs: under the default policy each queue's weight is then its two young jobs'
    (equal), while an earlier cycle, which missed a job of one queue, weighs them unequally. (The pending
    GPUs read from the store cannot tell: a job may be stored after the cycle whose shares are read.)"""
    queues = _queues(server)
    shares = [queues[name]["fair_share"] for name in ("heavy", "light")]
    weights = [queues[name]["gpu_weight_now"] for name in ("heavy", "light")]
    seen_all = weights[0] is not None and weights[0] > 0 and weights[0] == weights[1]
    return float(shares[0].get("gpu", 0.0)), float(shares[1].get("gpu", 0.0)), seen_all


def _run_history_then_compete(server: ServerProcess) -> tuple[float, float]:
    with server.http() as client:
        for name in ("heavy", "light"):
            response = client.post("/api/v1/queues", json={"name": name, "resources": {"gpu": {"quota": 0}}})
            assert response.status_code == 201, response.text
    # History: heavy runs 8 GPUs for a few seconds; light runs nothing.
    past = server.submit({"queue": "heavy", "resources": {"gpu": 8}, "commands": ["sleep 3"]})
    assert server.wait_for(past["id"], timeout=30)["state"] == "succeeded"
    # Now both want the whole pool.
    for name in ("heavy", "light"):
        for _ in range(2):
            server.submit({"queue": name, "resources": {"gpu": 8}, "commands": ["sleep 30"]})
    deadline = time.time() + 20
    while time.time() < deadline:
        heavy, light, seen_all = _fair(server)
        if seen_all and heavy > 0 and light > 0 and heavy + light > 7.9:
            return heavy, light
        time.sleep(0.2)
    raise AssertionError(f"no fair shares computed: {_queues(server)}")


def test_the_queue_that_used_less_gets_more_of_the_idle_capacity(tmp_path: Path) -> None:
    # A 2-minute half-life: usage is recomputed every 1.2 s (a hundredth of it), so the test is quick.
    server = ServerProcess(
        home=tmp_path / "home", extra_args=["--usage-weight", "1", "--usage-half-life", "2m"]
    )
    server.start()
    try:
        heavy, light = _run_history_then_compete(server)
        # Equal weights and no quota: without history each would get 4 of the 8 GPUs.
        assert light > heavy + 2, (heavy, light)
        assert heavy + light == pytest.approx(8.0, abs=0.01)
    finally:
        server.stop()


def test_without_usage_weight_history_changes_nothing(server: ServerProcess) -> None:
    heavy, light = _run_history_then_compete(server)
    assert heavy == pytest.approx(4.0, abs=0.01) and light == pytest.approx(4.0, abs=0.01)


def test_a_bad_usage_option_is_refused_with_the_fix(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home", extra_args=["--usage-half-life", "soon"])
    with pytest.raises(RuntimeError) as failed:
        server.start(timeout=20)
    assert "--usage-half-life" in str(failed.value)
