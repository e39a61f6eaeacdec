"""A real Prometheus scrapes a running head's /metrics; values are read back through its query API."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import plain_http
from tests.support.agent import start_pool
from tests.support.prometheus import CI_MESSAGE, PrometheusProcess, find_prometheus
from tests.support.server import ServerProcess

DOCS = Path(__file__).resolve().parents[2] / "docs"


def until(what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.time() + timeout
    while not (value := probe()):
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)
    return value


@pytest.fixture
def prometheus(server: ServerProcess, tmp_path: Path) -> Iterator[PrometheusProcess]:
    binary = find_prometheus()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(CI_MESSAGE)
        pytest.skip("Prometheus binary not installed here (apt-get install prometheus)")
    proc = PrometheusProcess(
        tmp_path / "prometheus", f"127.0.0.1:{server.port}", server.token, binary
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


def test_metrics_need_the_api_token(server: ServerProcess) -> None:
    assert plain_http.get(f"{server.url}/metrics").status_code == 401
    with server.http() as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION gauge" in response.text
    assert "# TYPE gpupool_scheduler_cycle_seconds histogram" in response.text


def test_prometheus_reads_gpu_series_under_dcgm_names_and_who_holds_each_gpu(
    server: ServerProcess, prometheus: PrometheusProcess, job_dir: Path
) -> None:
    with server.http() as client:
        assert (
            client.post(
                "/api/v1/queues", json={"name": "nlp", "resources": {"gpu": {"quota": 4}}}
            ).status_code
            == 201
        )
    job = server.submit(
        {
            "name": "busy",
            "queue": "nlp",
            "resources": {"gpu": 2},
            "commands": ["sleep 60"],
            "workdir": str(job_dir),
        }
    )
    server.wait_for(job["id"], ("running",))
    # two services with a readiness probe: one answers it, one never listens
    web = server.submit(
        {"kind": "service", "name": "web", "readiness_probe": "/", "workdir": str(job_dir),
         "commands": ["exec python3 -m http.server $GPUPOOL_PORT"]}
    )  # fmt: skip
    deaf = server.submit(
        {"kind": "service", "name": "deaf", "readiness_probe": "/health", "commands": ["sleep 60"]}
    )
    # work that can never fit this pool (8 simulated GPUs) waits, and says why, in aggregate too
    too_big = server.submit({"queue": "nlp", "resources": {"gpu": 16}, "commands": ["true"]})
    assert server.wait_for_reason(too_big["id"])["reason_code"] == "too-large"

    half = server.submit({"name": "half", "resources": {"gpu": 0.5}, "commands": ["sleep 60"]})
    server.wait_for(half["id"], ("running",))

    # who holds a GPU is a series of its own, one per holder; the GPU's own series carry only its labels
    held = prometheus.wait_for(f'gpupool_gpu_allocation_info{{workload="{job["id"]}"}}', count=2)
    assert {s["metric"]["queue"] for s in held} == {"nlp"}
    assert {s["metric"]["user"] for s in held} == {"admin"}
    assert {s["metric"]["Hostname"] for s in held} == {"node-1"}
    (part,) = prometheus.wait_for(f'gpupool_gpu_allocation_fraction{{workload="{half["id"]}"}}')
    assert float(part["value"][1]) == 0.5
    gpus = prometheus.wait_for("DCGM_FI_DEV_GPU_TEMP", count=8)
    assert sorted(int(s["metric"]["gpu"]) for s in gpus) == list(range(8))
    assert all(s["metric"]["UUID"].startswith("GPU-") for s in gpus)
    assert {s["metric"]["modelName"] for s in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {frozenset(s["metric"]) for s in gpus} == {
        frozenset({"__name__", "gpu", "UUID", "device", "modelName", "Hostname", "instance", "job"})
    }
    # joined on (Hostname, gpu), the holder's series on the many side: its GPUs' memory, with its UUIDs
    memory = prometheus.wait_for(
        f'gpupool_gpu_allocation_info{{workload="{job["id"]}"}} * on(Hostname, gpu) group_left '
        "DCGM_FI_DEV_FB_USED",
        count=2,
    )
    assert {s["metric"]["UUID"] for s in memory} == {s["metric"]["UUID"] for s in held}
    assert {s["metric"]["UUID"] for s in held} <= {s["metric"]["UUID"] for s in gpus}
    dashboard = json.loads((DOCS / "grafana" / "gpupool.json").read_text())
    (by_queue,) = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]
                   if panel["title"].startswith("GPU utilization by queue and user")]  # fmt: skip
    by_queue = by_queue.replace("$node", ".*").replace("$queue", ".*")
    assert {(s["metric"]["queue"], s["metric"]["user"]) for s in prometheus.wait_for(by_queue, count=2)} == {
        ("nlp", "admin"),
        ("default", "admin"),
    }
    for name in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                 "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_SM_CLOCK"):  # fmt: skip
        assert len(prometheus.wait_for(name, count=8)) == 8

    def value(promql: str) -> float:
        return float(prometheus.wait_for(promql)[0]["value"][1])

    assert value('gpupool_queue_quota_gpus{queue="nlp"}') == 4.0
    assert value('gpupool_queue_allocated_gpus{queue="nlp"}') == 2.0
    assert value('gpupool_workloads{state="running",queue="nlp"}') == 1.0
    assert value('gpupool_workloads{state="failed",queue="nlp"}') == 0.0  # a series at 0, not none
    assert value('gpupool_pending_workloads{queue="nlp",reason="too-large"}') == 1.0
    assert value(f'gpupool_service_ready{{workload="{web["id"]}",name="web",queue="default"}} == 1') == 1.0
    assert value(f'gpupool_service_ready{{workload="{deaf["id"]}",name="deaf",queue="default"}}') == 0.0
    assert value('gpupool_nodes{state="ready"}') == 1.0
    assert value('gpupool_node_health{node="node-1",health="healthy"}') == 1.0
    assert value("gpupool_scheduler_cycle_seconds_count") > 0
    assert value('gpupool_gpu_hours_total{queue="nlp"}') >= 0.0
    server.cli(
        "cancel",
        str(job["id"]),
        str(half["id"]),
        str(too_big["id"]),
        str(web["id"]),
        str(deaf["id"]),
        check=True,
    )

    # Every query of the shipped Grafana dashboard is valid PromQL here (tests/unit/control/
    # test_metrics_dashboard.py checks that each asks only for series and labels the head exports).
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$node", ".*").replace("$queue", ".*")
            prometheus.query(expr)  # raises on a PromQL error


def test_a_gpu_gone_from_its_node_stops_being_exported(tmp_path: Path) -> None:
    """A GPU falls off the bus; the node reboots and its agent registers without it: /metrics stops
    exporting its DCGM series and the node's telemetry no longer lists it."""
    pool = start_pool(tmp_path, 1, gpus="sim:2xH100")
    server, agent = pool.server, pool.agents[0]

    def exported() -> set[str]:
        with server.http() as client:
            text = client.get("/metrics").text
        return {
            line.split('gpu="')[1].split('"')[0]
            for line in text.splitlines()
            if line.startswith("DCGM_FI_DEV_GPU_TEMP{") and 'Hostname="agent-0"' in line
        }

    def listed() -> list[int]:
        with server.http() as client:
            return [g["index"] for g in client.get("/api/v1/telemetry/agent-0").json()["gpus"]]

    try:
        until("both GPUs exported", lambda: exported() == {"0", "1"})
        server.cli("node", "inject-fault", "agent-0", "--gpu", "1", "--fall-off-bus", check=True)

        def lost_says() -> bool:
            with server.http() as client:
                text = client.get("/metrics").text
            return any(
                line.startswith("gpupool_gpu_lost{") and 'gpu="1"' in line and line.endswith(" 1.0")
                for line in text.splitlines()
            )

        # off the bus: no readings (no made-up 0 C, 0 W, all memory free), only that it is lost
        until("GPU 1 exported as lost, with no readings", lambda: exported() == {"0"} and lost_says())
        agent.stop()
        agent.gpus = "sim:1xH100"  # rebooted: the driver lists one GPU
        agent.start()
        until("agent-0 registered with 1 GPU", lambda: pool.nodes()["agent-0"]["gpus_total"] == 1)
        until("GPU 1 no longer exported", lambda: exported() == {"0"})
        assert listed() == [0]
    finally:
        pool.stop()
