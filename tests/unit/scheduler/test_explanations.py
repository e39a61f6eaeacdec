"""What a workload left pending is told about its place: how many workloads of its queue come before it,
in the queue's own order (which allocate walks; the count must be that of the order, not of the walk)."""

from __future__ import annotations

import re

from gpupool.scheduler import decide
from tests.unit.scheduler.scenario_loader import parse_scenario


def _ahead(message: str) -> int:
    found = re.search(r"(\d+) workloads ahead", message)
    return int(found.group(1)) if found else 0


def test_each_pending_workload_is_told_how_many_of_its_queue_come_before_it() -> None:
    # One free GPU: the first of queue a starts; queue b's work is ordered before a's by fair share, and
    # inside a queue by submit time (the ids), whatever order the snapshot lists them in.
    scenario = parse_scenario(
        {
            "description": "places in line",
            "nodes": [{"name": "n1", "gpus": 1}],
            "queues": [{"name": "a", "gpu": 1}, {"name": "b"}],
            "pending": [
                {"id": 13, "queue": "a"},
                {"id": 21, "queue": "b"},
                {"id": 11, "queue": "a"},
                {"id": 12, "queue": "a"},
                {"id": 20, "queue": "b"},
            ],
            "expect": {"binds": {11: "any"}},
        },
        "places_in_line",
    )
    decisions = decide(scenario.snapshot, scenario.now)
    assert [b.workload_id for b in decisions.binds] == [11]
    ahead = {wid: _ahead(e.message) for wid, e in decisions.explanations.items()}
    assert ahead == {12: 1, 13: 2, 20: 0, 21: 1}
