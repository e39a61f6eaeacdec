"""`decide` pauses Python's cyclic garbage collector while it runs (see core.py): it must leave the
collector as it found it, and leave no reference cycles behind, or its garbage would pile up until the
next collection."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.scheduler import decide
from tests.unit.scheduler.scenario_loader import load_scenario

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.yaml"))


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    yield None
    gc.enable()


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_a_cycle_leaves_nothing_for_the_collector(path: Path, collector_off: object) -> None:
    scenario = load_scenario(path)
    decisions = decide(scenario.snapshot, scenario.now)
    assert not gc.isenabled()  # it was off before the cycle: it stays off
    del decisions
    assert gc.collect() == 0  # nothing the cycle made is unreachable yet alive


def test_the_collector_is_back_on_after_a_cycle() -> None:
    scenario = load_scenario(SCENARIOS[0])
    assert gc.isenabled()
    decide(scenario.snapshot, scenario.now)
    assert gc.isenabled()
