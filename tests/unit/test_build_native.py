"""The profile-guided build's parts (tools/build_native.py, tools/native_training.py): the training trace is
the same every time and a valid `csv` trace, and only GCC is asked for a profile-guided build. The build
itself runs in `make test` before the suite, whose tests/unit/*/test_native.py check that what it compiled
decides and replays exactly as the source does."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpupool.sim.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_training_trace_is_seeded_and_loads_as_a_csv_trace(tmp_path: Path) -> None:
    training = _tool("native_training")
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    training.write_trace(first)
    training.write_trace(second)
    assert first.read_bytes() == second.read_bytes()
    trace = load_trace(f"csv:{first}")
    assert len(trace.jobs) == training.JOBS
    assert {j.queue for j in trace.jobs} == {name for name, _ in training.TENANTS}
    assert {j.gpus for j in trace.jobs} == {float(count) for count, _ in training.SIZES}
    submits = [j.submit for j in trace.jobs]
    assert submits == sorted(submits)
    assert max(j.duration for j in trace.jobs) <= 2 * 86400


def test_only_gcc_gets_a_profile_guided_build(tmp_path: Path) -> None:
    build = _tool("build_native")
    assert not build.gcc(str(tmp_path / "no-such-compiler"))
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'clang version 16.0.6'\n")
    fake.chmod(0o755)
    assert not build.gcc(str(fake))
    system = shutil.which("gcc")
    if system is None:
        pytest.skip("no gcc here")
    assert build.gcc(system)
