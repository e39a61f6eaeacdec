"""GPU efficiency of work (control/efficiency.py, Slurm's seff) on a real server with simulated GPUs, whose
utilization follows the CPU use of the processes placed on them: a job that keeps its GPU busy shows a far
higher mean utilization than one that sleeps, in the API, `gpupool show` and `gpupool usage`, and the
figures are still there after the head restarts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.server import ServerProcess

# Six seconds of a busy CPU (its simulated GPU near 100%), then a clean exit.
BUSY = "python3 -c 'import time; end = time.time() + 6; exec(\"while time.time() < end: pass\")'"


def _measured(w: dict[str, Any]) -> bool:
    return w["state"] == "succeeded" and w["attempt_list"][-1]["gpu_utilization_pct"] is not None


def test_busy_work_shows_higher_gpu_utilization_than_sleeping_work_and_keeps_it(tmp_path: Path) -> None:
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        busy = server.submit({"name": "train", "resources": {"gpu": 1}, "commands": [BUSY]})
        resting = server.submit({"name": "notebook", "resources": {"gpu": 1}, "commands": ["sleep 6"]})
        # Written at the look after the attempt ended (every 5 s).
        busy_attempt = server.wait_until(busy["id"], _measured, timeout=45.0)["attempt_list"][-1]
        resting_attempt = server.wait_until(resting["id"], _measured, timeout=45.0)["attempt_list"][-1]
        assert busy_attempt["gpu_utilization_pct"] > 50.0, busy_attempt
        assert resting_attempt["gpu_utilization_pct"] < 20.0, resting_attempt
        assert busy_attempt["gpu_utilization_pct"] > resting_attempt["gpu_utilization_pct"] + 40.0
        assert 3.0 <= busy_attempt["gpu_seconds_sampled"] <= 12.0, busy_attempt  # ~6 s on one GPU
        assert busy_attempt["gpu_memory_total_bytes"] > 0 and busy_attempt["gpu_memory_peak_bytes"] >= 0

        shown = server.cli("show", str(busy["id"]), check=True).stdout
        assert "GPU efficiency (attempt 0): 1 GPU x " in shown and "mean utilization" in shown, shown
        assert "no GPU telemetry" not in shown

        report = json.loads(server.cli("usage", "--by", "workload", "--json", check=True).stdout)
        rows = {int(r["key"]): r for r in report["rows"]}
        assert rows[busy["id"]]["gpu_utilization_pct"] > rows[resting["id"]]["gpu_utilization_pct"] + 40.0
        assert 0 < rows[busy["id"]]["used_gpu_hours"] <= rows[busy["id"]]["gpu_hours"]
        assert "gpu_hours" in rows[busy["id"]] and "share" in rows[busy["id"]]  # the keys it had stay
        table = server.cli("usage", "--by", "workload", check=True).stdout
        assert "UTIL" in table and "USED" in table, table

        server.stop()
        server.start()
        again = server.workload(busy["id"])["attempt_list"][-1]
        keys = (
            "gpu_utilization_pct",
            "gpu_memory_peak_bytes",
            "gpu_memory_total_bytes",
            "gpu_seconds_sampled",
        )
        assert {k: again[k] for k in keys} == {k: busy_attempt[k] for k in keys}
    finally:
        server.stop()


def test_work_without_gpus_has_no_efficiency_line(server: ServerProcess) -> None:
    cpu_only = server.submit({"name": "prep", "resources": {"gpu": 0}, "commands": ["true"]})
    server.wait_for(cpu_only["id"])
    shown = server.cli("show", str(cpu_only["id"]), check=True).stdout
    assert "GPU efficiency" not in shown, shown
