"""The compiled scheduler (tools/build_native.py, run by make) decides exactly as its source does, and a
source changed since the build is what runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpupool.scheduler as scheduler

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = Path(scheduler.__file__).parent
needs_build = pytest.mark.skipif(
    not scheduler.NATIVE, reason="the compiled scheduler is not built or is out of date (make builds it)"
)


def _run(code: str, env: dict[str, str], cwd: Path = ROOT) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@needs_build
def test_the_compiled_scheduler_decides_as_its_source_does(tmp_path: Path) -> None:
    # Both in fresh processes, on snapshots drawn once by a third (see native_digest.py).
    drawn = tmp_path / "snapshots.pickle"
    pure = {"GPUPOOL_PURE_PYTHON": "1"}
    digest = "from tests.unit.scheduler import native_digest as d; from pathlib import Path; "
    _run(digest + f"d.draw(Path({str(drawn)!r}))", pure)
    code = (
        digest + "import gpupool.scheduler as s, json; assert s.NATIVE == {native}; "
        f"print(json.dumps(d.digests(Path({str(drawn)!r}))))"
    )
    compiled = json.loads(_run(code.format(native=True), {}))
    source = json.loads(_run(code.format(native=False), pure))
    assert len(compiled) > 150
    differing = [i for i, (a, b) in enumerate(zip(compiled, source, strict=True)) if a != b]
    assert not differing, (
        f"{len(differing)} differ; first:\ncompiled {compiled[differing[0]]}\nsource   {source[differing[0]]}"
    )


@needs_build
def test_a_scheduler_source_changed_since_the_build_runs_as_source(tmp_path: Path) -> None:
    copy = tmp_path / "gpupool"
    shutil.copytree(PACKAGE.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    probe = (
        "import gpupool.scheduler as s, gpupool.scheduler.cycle as c; "
        "print(s.NATIVE, c.__file__.endswith('.py'))"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    assert _run(probe, env, tmp_path).split() == ["True", "False"]
    assert _run(probe, {**env, "GPUPOOL_PURE_PYTHON": "0"}, tmp_path).split() == [
        "True",
        "False",
    ]  # "0" is off
    cycle = copy / "scheduler" / "cycle.py"
    cycle.write_text(cycle.read_text() + "\n# changed\n")
    assert _run(probe, env, tmp_path).split() == ["False", "True"]
    assert _run(probe, {**env, "GPUPOOL_PURE_PYTHON": "1"}, tmp_path).split() == ["False", "True"]
