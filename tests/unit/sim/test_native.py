"""The compiled simulator engine (tools/build_native.py, run by make) replays exactly as its source does,
with the compiled scheduler or the scheduler's source, and an engine source changed since the build is what
runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpupool.sim as sim

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = Path(sim.__file__).parent
needs_build = pytest.mark.skipif(
    not sim.NATIVE, reason="the compiled simulator engine is not built or is out of date (make builds it)"
)

# Run in a fresh process: every policy replays the Philly fixture on 2x8 and the queue-tree jobs (nested
# queues, fractional GPUs) on 4x8; prints each replay's hash of every job's outcome, and its preemptions.
REPLAYS = """
import hashlib, json, sys
import gpupool.scheduler as scheduler, gpupool.sim as sim
assert [sim.NATIVE, scheduler.NATIVE] == json.loads(sys.argv[1]), (sim.NATIVE, scheduler.NATIVE)
from gpupool.sim.cluster import load_cluster
from gpupool.sim.engine import Simulation
from gpupool.sim.policies import POLICIES
from gpupool.sim.queues import auto_queues
from gpupool.sim.results import SimOptions
from gpupool.sim.trace import load_trace, select
from tests.unit.sim.test_engine_queue_trees import QUEUES, jobs as tree_jobs
philly, origin = select(load_trace("philly:" + sys.argv[2]), None, None)
out = {}
for policy in POLICIES:
    for name, jobs, start, cluster, queues in (
        ("philly", philly, origin, "2x8", None), ("tree", tree_jobs(), 0.0, "4x8", QUEUES)
    ):
        built = load_cluster(cluster)
        views = queues or auto_queues(jobs, built.gpus)
        result = Simulation(jobs, start, built, views, policy, SimOptions()).run()
        outcome = [
            (j.id, j.submit, j.start, j.finish, j.queued, j.preemptions, j.lost_gpu_s) for j in result.jobs
        ]
        preempted = sum(j.preemptions for j in result.jobs)
        out[f"{name} {policy.name}"] = (hashlib.sha256(repr(outcome).encode()).hexdigest(), preempted)
print(json.dumps(out))
"""
PHILLY = ROOT / "tests" / "fixtures" / "traces" / "philly_small.csv"


def _run(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> str:
    done = subprocess.run(
        [sys.executable, "-c", *args], env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


Replays = dict[str, tuple[str, int]]  # replay -> (hash of its jobs' outcomes, preemptions)


def _replays(native: list[bool], env: dict[str, str]) -> Replays:
    """Every replay, in a fresh process that checks `[gpupool.sim.NATIVE, gpupool.scheduler.NATIVE]`."""
    out = json.loads(_run([REPLAYS, json.dumps(native), str(PHILLY)], env))
    return {replay: (digest, preempted) for replay, (digest, preempted) in out.items()}


def _differing(compiled: Replays, source: Replays) -> list[str]:
    assert compiled.keys() == source.keys()
    return [replay for replay in compiled if compiled[replay] != source[replay]]


@needs_build
def test_the_compiled_engine_replays_every_job_as_its_source_does() -> None:
    import gpupool.scheduler as scheduler

    compiled = _replays([True, scheduler.NATIVE], {})
    source = _replays([False, False], {"GPUPOOL_PURE_PYTHON": "1"})
    assert len(compiled) >= 20
    assert sum(preempted for _, preempted in source.values()) > 100  # not only quiet replays
    assert not _differing(compiled, source)


@needs_build
def test_an_engine_source_changed_since_the_build_runs_as_source(tmp_path: Path) -> None:
    copy = tmp_path / "gpupool"
    shutil.copytree(PACKAGE.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    probe = "import gpupool.sim as s, gpupool.sim.engine as e; print(s.NATIVE, e.__file__.endswith('.py'))"
    env = {"PYTHONPATH": str(tmp_path)}
    assert _run([probe], env, tmp_path).split() == ["True", "False"]
    engine = copy / "sim" / "engine.py"
    engine.write_text(engine.read_text() + "\n# changed\n")
    assert _run([probe], env, tmp_path).split() == ["False", "True"]
    assert _run([probe], {**env, "GPUPOOL_PURE_PYTHON": "1"}, tmp_path).split() == ["False", "True"]


@needs_build
def test_the_compiled_engine_replays_alike_with_the_schedulers_source(tmp_path: Path) -> None:
    # A scheduler source changed since its build: the scheduler runs as source, the engine still compiled
    # (its own mypyc group calls the scheduler as Python does).
    copy = tmp_path / "gpupool"
    shutil.copytree(PACKAGE.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    cycle = copy / "scheduler" / "cycle.py"
    cycle.write_text(cycle.read_text() + "\n# changed\n")
    path = os.pathsep.join([str(tmp_path), str(ROOT)])  # the copy's gpupool; the tests' fixtures
    compiled = _replays([True, False], {"PYTHONPATH": path})
    source = _replays([False, False], {"PYTHONPATH": path, "GPUPOOL_PURE_PYTHON": "1"})
    assert not _differing(compiled, source)
