"""Bench results stored per node on a real head: from a real CPU bench run here and from a submitted bench
job, shown by `node show`, exported on /metrics, judged by the health checks, and kept across a restart."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.bench import tiny_gemm_submit
from tests.support.server import ServerProcess

pytest.importorskip("torch")

SMALL = ["--backend", "gloo", "--nproc", "2", "-b", "1K", "-e", "64K", "-f", "8", "-n", "3", "-w", "1"]
# Impossible on any machine, so the verdict shows; allreduce_gpus 2 and min_bytes 0 make a 2-rank run at
# 64 KiB comparable with it (the defaults judge 8-GPU runs of 1 GiB and more only).
HEALTH_YAML = """\
thresholds:
  '*': {bench_allreduce_min_busbw_gbps: 1000000, allreduce_gpus: 2, bench_allreduce_min_bytes: 0}
"""


@pytest.fixture
def head(tmp_path: Path) -> Iterator[ServerProcess]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "health.yaml").write_text(HEALTH_YAML)
    proc = ServerProcess(home=home, gpus="sim:2xH100").start()
    try:
        yield proc
    finally:
        proc.stop()


def poll(read: Any, ok: Any, timeout: float = 30.0) -> Any:
    deadline = time.time() + timeout
    while True:
        value = read()
        if ok(value):
            return value
        if time.time() > deadline:
            raise AssertionError(f"still {value!r} after {timeout}s")
        time.sleep(0.2)


def test_a_recorded_cpu_bench_shows_in_node_show_metrics_and_the_health_verdict(
    head: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "allreduce.json"
    run = head.cli("bench", "collective", *SMALL, "--json", str(out), "--node", "node-1", check=True)
    report = json.loads(out.read_text())
    busbw = report["rows"][-1]["in_place"]["busbw"]
    assert f"recorded for node node-1: collective all_reduce: busbw {busbw:.4g} GB/s at 64 KiB" in run.stderr

    def health() -> dict[str, Any]:
        with head.http() as h:
            return dict(h.get("/api/v1/health/node-1").json())

    verdict = poll(health, lambda v: v["health"] == "warning")
    assert verdict["evidence"].startswith(
        f"bench all_reduce over 2 ranks: busbw {busbw:.3g} GB/s at 64 KiB "
        "< 1e+06 GB/s expected for H100 (cli, "
    )
    assert [f["check"] for f in verdict["findings"]] == ["bench_collective"]
    # its event is written just after the verdict is kept: the API may read the verdict in between
    said = "health warning: bench all_reduce"
    poll(health, lambda v: any(e["reason"].startswith(said) for e in v["events"]))

    shown = head.cli("node", "show", "node-1", check=True).stdout
    assert "health warning" in shown
    assert f"cli      collective all_reduce: busbw {busbw:.4g} GB/s at 64 KiB" in shown
    as_json = json.loads(head.cli("node", "show", "node-1", "--json", check=True).stdout)
    [stored] = as_json["bench"]
    assert stored["figures"]["busbw"] == pytest.approx(busbw) and stored["parameters"]["backend"] == "gloo"

    with head.http() as h:
        metrics = h.get("/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith("gpupool_bench_busbw_gbps{"))
    assert 'node="node-1"' in line and 'op="all_reduce"' in line and 'gpu_model="H100"' in line
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(busbw)
    assert 'gpupool_node_health{health="warning",node="node-1"} 1.0' in metrics

    # Nothing recorded is lost when the head restarts; the verdict comes back from the stored result.
    head.kill9()
    head.start()
    assert poll(health, lambda v: v["health"] == "warning")["findings"][0]["check"] == "bench_collective"
    again = json.loads(head.cli("bench", "results", "node-1", "--json", check=True).stdout)
    assert [r["id"] for r in again] == [stored["id"]]


def test_a_submitted_bench_job_is_recorded_by_the_head_for_the_node_it_ran_on(
    head: ServerProcess, job_dir: Path
) -> None:
    args = tiny_gemm_submit("--node", "node-1")
    submitted = " ".join(head.cli(*args, cwd=job_dir, check=True).stdout.split())
    assert submitted.startswith("submitted 1 (bench-gemm)")
    assert submitted.endswith(f"results: {job_dir}/gpupool-bench-gemm-job1-node0.json"), submitted
    assert head.workload(1)["spec"]["placement"]["nodes"] == ["node-1"]
    assert head.wait_for(1, timeout=60)["state"] == "succeeded", head.cli("logs", "1").stdout

    def recorded() -> list[dict[str, Any]]:
        return list(json.loads(head.cli("bench", "results", "--kind", "gemm", "--json", check=True).stdout))

    [result] = poll(recorded, bool)
    assert result["node"] == "node-1" and result["source"] == "job 1" and result["workload_id"] == 1
    written = json.loads((job_dir / "gpupool-bench-gemm-job1-node0.json").read_text())
    assert result["figures"]["best_tflops"] == pytest.approx(written["best_tflops"])
    listed = head.cli("bench", "results", check=True).stdout
    assert "node-1" in listed and "job 1    gemm float: best" in listed
    with head.http() as h:
        metrics = h.get("/metrics").text
    labels = 'device="cpu",dtype="float",gpu_model="H100",node="node-1",size="32x32x32"'
    line = next(x for x in metrics.splitlines() if x.startswith(f"gpupool_bench_gemm_tflops{{{labels}}} "))
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(written["rows"][0]["tflops"])


def test_bad_results_and_unpinnable_jobs_are_refused_with_one_line(
    head: ServerProcess, tmp_path: Path
) -> None:
    not_bench = tmp_path / "other.json"
    not_bench.write_text('{"hello": 1}')
    bad = head.cli("bench", "record", str(not_bench), "--node", "node-1")
    assert bad.returncode == 1
    assert bad.stderr.strip() == (
        f"error: {not_bench}: report: not a bench result (no 'op', 'ops' or 'benchmark' field); give the "
        "file that `gpupool bench collective|gemm|train --json FILE` wrote"
    )
    gemm = tmp_path / "gemm.json"
    head.cli("bench", "gemm", "--device", "cpu", "--sizes", "32", "-n", "1", "-w", "0", "--json", str(gemm),
             check=True)  # fmt: skip
    assert "measured_at" in json.loads(gemm.read_text())
    unknown = head.cli("bench", "record", str(gemm), "--node", "node-9")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "error: no node named 'node-9' (nodes: node-1); name one with --node"
    with head.http() as h:
        response = h.post("/api/v1/bench-results", json={"node": "node-1", "report": {"op": "all_reduce"}})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "report.nranks"
    assert head.cli("bench", "results", "--json", check=True).stdout.strip() == "[]"  # nothing half-stored
    undated = tmp_path / "undated.json"  # as gpupool wrote them before reports said when they were measured
    dated = json.loads(gemm.read_text())
    undated.write_text(json.dumps({k: v for k, v in dated.items() if k != "measured_at"}))
    taken = head.cli("bench", "record", str(undated), "--node", "node-1", check=True)
    assert " ".join(taken.stderr.split()) == (
        f"warning: {undated} has no measured_at (a bench of an older gpupool wrote it): recorded as measured "
        "now, so it is the node's newest result of its series"
    )

    assert head.cli("ps", "--all", "--json", check=True).stdout.strip() == "[]"
    empty = head.cli("bench", "gemm", "--sizes", "128,,", "--device", "cpu")
    assert empty.returncode == 1
    assert empty.stderr.strip() == (
        "error: --sizes '128,,': an empty size between commas; give e.g. 1024,2048,4096"
    )
    for pinned in ([], ["--node", "node-1"]):  # simulated GPUs: torch sees none, so a GPU gemm cannot run
        simulated = head.cli("bench", "gemm", "--submit", "--gpus", "1", *pinned)
        assert simulated.returncode == 1
        assert "simulated (gpupool server --gpus sim:...), which torch cannot see" in simulated.stderr
        assert simulated.stderr.strip().endswith("measure the CPU instead with --device cpu")
    assert head.cli("ps", "--all", "--json", check=True).stdout.strip() == "[]"
    gang = head.cli("bench", "collective", "--submit", "--gpus", "1", "--nodes", "2", "--node", "node-1")
    assert gang.returncode == 1
    assert "placement.nodes: ['node-1'] lists 1 node(s) but the gang needs 2" in gang.stderr
    assert head.cli("ps", "--all", "--json", check=True).stdout.strip() == "[]"
    elsewhere = head.cli("bench", "gemm", "--submit", "--gpus", "1", "--node", "node-9", check=True)
    assert "submitted 1 (bench-gemm)" in elsewhere.stdout
    assert elsewhere.stderr.strip() == (
        "warning: placement.nodes: no node 'node-9' in this pool (nodes: node-1); it waits pending until "
        "such a node joins: check the name (`gpupool nodes`), or `gpupool cancel 1`"
    )
    why = poll(lambda: json.loads(head.cli("why", "1", "--json").stdout), lambda w: w["reason"])
    assert why["state"] == "pending" and why["reason_code"] == "no-capacity"
    assert (
        why["reason"]
        == "needs 1 schedulable node among its placement.nodes (node-9): node-9 is not in the pool"
    )


def test_with_action_unhealthy_a_slow_result_drains_the_node_until_a_newer_one_passes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "health.yaml").write_text(
        "thresholds:\n  '*': {bench_gemm_min_tflops: 5}\n"
        "bench: {action: unhealthy}\nschedule: {recheck_interval: 1}\n"
    )
    head = ServerProcess(home=home, gpus="sim:2xH100").start()
    try:
        slow = tmp_path / "slow.json"
        gemm = ["bench", "gemm", "--device", "cpu", "--sizes", "32", "-n", "1", "-w", "0"]
        head.cli(*gemm, "--json", str(slow), "--node", "node-1", check=True)

        def node() -> dict[str, Any]:
            with head.http() as h:
                return next(n for n in h.get("/api/v1/nodes").json() if n["name"] == "node-1")

        down = poll(node, lambda n: n["state"] == "unhealthy")
        assert down["state_reason"].startswith("health: bench gemm float: cpu ")
        assert "TFLOPS < 5 TFLOPS expected for H100" in down["state_reason"]
        time.sleep(3)  # rechecks pass the active checks, but the bench result still keeps it out
        now = node()  # unhealthy also while each recheck's job runs (docs/telemetry.md)
        assert now["health"] == "unhealthy" and now["state"] == "unhealthy"

        # An older result that passed, sent again (a file kept from before): refused, the node stays out.
        fast = json.loads(slow.read_text())
        for row in fast["rows"]:
            row["tflops"] = 50.0
        measured = datetime.fromisoformat(fast["measured_at"])
        fast["measured_at"] = (measured - timedelta(days=1)).isoformat()
        (tmp_path / "old.json").write_text(json.dumps(fast))
        old = head.cli("bench", "record", str(tmp_path / "old.json"), "--node", "node-1")
        assert old.returncode == 1
        refusal = f"error: report.measured_at: {fast['measured_at']} is before the newest gemm float result"
        newest = f"of node node-1 (measured {measured.isoformat()})"
        assert old.stderr.startswith(f"{refusal} {newest}"), old.stderr
        assert node()["state"] == "unhealthy"

        # A newer result of the same series that meets the threshold (as a faster machine would give).
        fast["measured_at"] = (measured + timedelta(seconds=1)).isoformat()
        (tmp_path / "fast.json").write_text(json.dumps(fast))
        taken = head.cli("bench", "record", str(tmp_path / "fast.json"), "--node", "node-1", check=True)
        when = (measured + timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S")
        assert f"recorded for node node-1 (measured {when} UTC): gemm float: best 50 TFLOPS" in taken.stdout
        back = poll(node, lambda n: n["state"] == "ready")
        assert back["state_reason"].startswith("health: passed the quick active checks")
    finally:
        head.stop()


def test_results_are_stored_bounded_and_read_back_on_postgresql(postgres: Any, tmp_path: Path) -> None:
    import uuid

    from gpupool.bench.results import summarize
    from gpupool.control import bench
    from gpupool.store.db import Store
    from gpupool.store.models import Gpu, Node

    store = Store(postgres.new_database(f"bench_{uuid.uuid4().hex[:12]}"))
    try:
        with store.session() as s:
            node = Node(name="node-1")
            node.gpus = [Gpu(index=0, uuid="GPU-1", model="H100")]
            s.add(node)
        out = tmp_path / "gemm.json"
        gemm = ["gemm", "--device", "cpu", "--sizes", "32", "-n", "1", "-w", "0", "--json", str(out)]
        bench_cmd = [sys.executable, "-m", "gpupool.main", "bench", *gemm]
        subprocess.run(bench_cmd, check=True, capture_output=True, timeout=120)
        report = json.loads(out.read_text())
        book = bench.BenchBook(store)
        for _ in range(bench.HISTORY_PER_SERIES + 2):
            bench.record(store, summarize(report), ["node-1"], source="cli", actor="admin")
        book.refresh()
        assert len(bench.history(store, node="node-1", limit=1000)) == bench.HISTORY_PER_SERIES
        [latest] = book.latest("node-1")
        assert latest["figures"]["best_tflops"] == pytest.approx(report["best_tflops"])
        assert latest["id"] == bench.history(store, latest=True)[0]["id"]
    finally:
        store.close()
