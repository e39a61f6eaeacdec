"""Every example spec in examples/ is one a user can submit as it is: it parses with no error."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.spec import parse_workload_spec

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").rglob("*.yaml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_spec_parses(path: Path) -> None:
    spec = parse_workload_spec(path.read_text())
    assert spec.commands


def test_the_sweep_example_is_an_array_of_8_tasks_4_at_once() -> None:
    (sweep,) = (p for p in EXAMPLES if p.name == "sweep.yaml")
    assert parse_workload_spec(sweep.read_text()).array == "0-7%4"
