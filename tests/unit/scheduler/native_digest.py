"""What the scheduler decides on every scenario file and on a fixed series of random snapshots, as text.

`python -m tests.unit.scheduler.native_digest --draw FILE` (from the repository root) draws the random
snapshots from the property tests' strategies, derandomized, into FILE; `python -m
tests.unit.scheduler.native_digest FILE` prints the text as JSON. test_native.py compares the compiled
scheduler's answers with the source's (run with GPUPOOL_PURE_PYTHON=1) on the same FILE.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis.strategies import SearchStrategy

import gpupool.scheduler.snapshot as snapshot_types
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


def _plain(value: Any) -> Any:
    """A snapshot as plain data (each snapshot type as its name and fields), which any process can load
    and build again with its own classes, compiled or not."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return ("@", type(value).__name__, fields)
    if isinstance(value, tuple | list | frozenset):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _built(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "@":
        return getattr(snapshot_types, value[1])(**{k: _built(v) for k, v in value[2].items()})
    if isinstance(value, tuple | list | frozenset):
        return type(value)(_built(v) for v in value)
    if isinstance(value, dict):
        return {k: _built(v) for k, v in value.items()}
    return value


def drawn_from(strategy: SearchStrategy[Snapshot], count: int) -> list[Snapshot]:
    """`count` snapshots from `strategy`, derandomized: the same ones each time in one process (what
    Hypothesis draws can differ between processes that import different code, see `digests`)."""
    found: list[Snapshot] = []

    @settings(
        derandomize=True,
        database=None,
        max_examples=count,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(snapshot: Snapshot) -> None:
        found.append(snapshot)

    collect()
    return found


def draw(path: Path) -> None:
    """Draw the random snapshots and write them to `path`, as plain data (see `_plain`)."""
    path.write_bytes(pickle.dumps([_plain(s) for s in drawn_from(snapshots(), RANDOM_SNAPSHOTS)]))


def digests(drawn: Path) -> list[str]:
    """What the scheduler decides on every scenario file, then on each snapshot `draw` wrote to `drawn`.
    The snapshots are drawn once, in one process, for both codes: what Hypothesis draws can differ
    between processes that import different code (the compiled scheduler or its source)."""
    out = []
    for path in sorted(SCENARIOS.glob("*.yaml")):
        scenario = load_scenario(path)
        out.append(f"{path.name}: {canonical(decide(scenario.snapshot, scenario.now))}")
    for plain in pickle.loads(drawn.read_bytes()):
        out.append(canonical(decide(_built(plain), NOW)))
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--draw"]:
        draw(Path(sys.argv[2]))
    else:
        print(json.dumps(digests(Path(sys.argv[1]))))
