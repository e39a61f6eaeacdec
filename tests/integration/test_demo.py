"""`make demo` is the first command a new user runs: the demo script must run end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_demo_runs_end_to_end_and_resumes_the_fine_tune_from_its_checkpoint() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    fine_tune = re.search(r"submitted (\d+) \(llama-finetune\)", out)
    assert fine_tune, out[-3000:]
    first = (ROOT / ".demo" / "home" / "logs" / fine_tune[1] / "attempt-0.log").read_text()
    assert "starting from step 0" in first, (
        "the first fine-tune must start fresh, not from a stale checkpoint"
    )
    assert re.search(r"resuming from checkpoint .* at step [1-9]", out), out[-3000:]
    assert "training finished" in out
    usage = out[out.index("GPU-hours each team used") :]  # the last table: usage, priced
    # research: its GPU-hours, USED and UTIL (a figure, or none without telemetry), SHARE %, then USD.
    # GPU-hours below 0.001 print as "<0.001": a short demo's USED is often that small.
    hours = r"(?:<0\.001|[0-9.]+)"
    row = rf"research\s+{hours}\s+(?:{hours}|-)\s+.*?\s[0-9.]+%\s+[0-9.]+\s"
    assert re.search(row, usage) and "USD" in usage, usage
