"""What the scheduler decides on every scenario file and on a fixed series of random snapshots, as text.

Run as `python -m tests.unit.scheduler.native_digest` (from the repository root) it prints that text as
JSON; test_native.py compares the compiled scheduler's answers with the source's, run this way with
GPUPOOL_PURE_PYTHON=1. The random snapshots come from the property tests' strategies, derandomized, so
every process draws the same ones.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from gpupool.scheduler import decide
from gpupool.scheduler.snapshot import Decisions, Snapshot
from tests.unit.scheduler.scenario_loader import load_scenario
from tests.unit.scheduler.strategies import NOW, snapshots

SCENARIOS = Path(__file__).parent / "scenarios"
RANDOM_SNAPSHOTS = 150


def canonical(decisions: Decisions) -> str:
    """Every decision, in a fixed order: binds with their placements, evictions with their reasons,
    explanations with their sentences, fair shares."""
    return repr(
        (
            sorted((b.workload_id, b.pods) for b in decisions.binds),
            sorted((e.workload_id, e.code, e.reason, e.for_workload) for e in decisions.evictions),
            sorted((k, v.code, v.message) for k, v in decisions.explanations.items()),
            sorted((q, sorted(s.items())) for q, s in decisions.fair_shares.items()),
        )
    )


def digests() -> list[str]:
    out = []
    for path in sorted(SCENARIOS.glob("*.yaml")):
        scenario = load_scenario(path)
        out.append(f"{path.name}: {canonical(decide(scenario.snapshot, scenario.now))}")

    @settings(
        derandomize=True,
        database=None,
        max_examples=RANDOM_SNAPSHOTS,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(snapshots())
    def collect(snapshot: Snapshot) -> None:
        out.append(canonical(decide(snapshot, NOW)))

    collect()
    return out


if __name__ == "__main__":
    print(json.dumps(digests()))
