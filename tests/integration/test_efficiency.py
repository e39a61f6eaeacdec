"""GPU efficiency of work (control/efficiency.py, Slurm's seff) on a real server with simulated GPUs, whose
utilization follows the CPU use of the processes placed on them: a job that keeps its GPU busy shows the
mean utilization its processes really had (their CPU share: less than 100% when the machine is busy with
other work), far above one that sleeps, in the API, `gpupool show` and `gpupool usage`, and the figures are
still there after the head restarts."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from gpupool.control.efficiency import CHECK_INTERVAL
from tests.support.server import ServerProcess

# Six seconds of a busy CPU, then it writes the CPU seconds it got to the file named by its argument and
# exits cleanly. Its simulated GPU is as busy as it: near 100% on an idle machine, less when other work
# shares the CPUs.
BUSY = """\
import sys, time
end = time.time() + 6
while time.time() < end:
    pass
open(sys.argv[1], "w").write(str(time.process_time()))
"""
# Like Slurm's seff, the mean is what was used over what was held. It reads a little low: the last moments
# of work (after the last look at its processes, up to a 1 s sample) cannot be seen once it has ended.
READS_LOW_BY_AT_MOST = 30.0  # points, for 6 s of work


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _measured(w: dict[str, Any]) -> bool:
    """Ended, with its figures as written at the look after its end: an attempt's first figures are written
    at the first look that has any (a few seconds in), the last at the look (every 5 s) after it ended."""
    if w["state"] != "succeeded":
        return False
    last = w["attempt_list"][-1]
    return (
        last["gpu_utilization_pct"] is not None
        and time.time() - _seconds(last["finished_at"]) > 2 * CHECK_INTERVAL
    )


def test_busy_work_shows_higher_gpu_utilization_than_sleeping_work_and_keeps_it(tmp_path: Path) -> None:
    script, cpu_file = tmp_path / "busy.py", tmp_path / "cpu-seconds"
    script.write_text(BUSY)
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        busy = server.submit(
            {"name": "train", "resources": {"gpu": 1}, "commands": [f"python3 {script} {cpu_file}"]}
        )
        resting = server.submit({"name": "notebook", "resources": {"gpu": 1}, "commands": ["sleep 6"]})
        busy_attempt = server.wait_until(busy["id"], _measured, timeout=45.0)["attempt_list"][-1]
        resting_attempt = server.wait_until(resting["id"], _measured, timeout=45.0)["attempt_list"][-1]
        held = _seconds(busy_attempt["finished_at"]) - _seconds(busy_attempt["started_at"])
        used = 100.0 * float(cpu_file.read_text()) / held
        read = busy_attempt["gpu_utilization_pct"]
        assert used - READS_LOW_BY_AT_MOST < read < used + 10.0, (used, busy_attempt)
        assert resting_attempt["gpu_utilization_pct"] < 5.0, resting_attempt
        # Far above the sleeping job: by half of what the busy one really got at least (its CPU share, about
        # 95% on an idle box, 30% under the suite's -n 4), not by a fixed margin a busy box could eat.
        apart = used / 2
        assert busy_attempt["gpu_utilization_pct"] > resting_attempt["gpu_utilization_pct"] + apart
        assert 3.0 <= busy_attempt["gpu_seconds_sampled"] <= 12.0, busy_attempt  # ~6 s on one GPU
        assert busy_attempt["gpu_memory_total_bytes"] > 0 and busy_attempt["gpu_memory_peak_bytes"] >= 0

        shown = server.cli("show", str(busy["id"]), check=True).stdout
        assert "GPU efficiency (attempt 0): 1 GPU x " in shown and "mean utilization" in shown, shown
        assert "no GPU telemetry" not in shown

        report = json.loads(server.cli("usage", "--by", "workload", "--json", check=True).stdout)
        rows = {int(r["key"]): r for r in report["rows"]}
        assert rows[busy["id"]]["gpu_utilization_pct"] > rows[resting["id"]]["gpu_utilization_pct"] + apart
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
