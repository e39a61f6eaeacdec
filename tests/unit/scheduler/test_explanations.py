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


def test_work_held_back_by_strict_order_names_the_workload_it_waits_behind() -> None:
    # 10 blocks the queue until preempt makes room for it; then 11 is tried and does not fit (nothing it
    # may evict): 12, which would fit on the free GPU, waits behind 11, not behind 10.
    scenario = parse_scenario(
        {
            "description": "strict order",
            "now": 10000,
            "config": {"blocking": "strict"},
            "nodes": [{"name": "n1", "gpus": 4}],
            "running": [
                {"id": 1, "on": {"n1": "0-1"}, "priority": 10},
                {"id": 2, "on": {"n1": [2]}, "priority": 50, "preemptible": False},
            ],
            "pending": [
                {"id": 10, "gpus": 2, "priority": 100},
                {"id": 11, "gpus": 3, "priority": 100},
                {"id": 12, "gpus": 1, "priority": 100},
            ],
            "expect": {"binds": {}, "evictions": {1: "preempt for 10"}},
        },
        "strict_order",
    )
    decisions = decide(scenario.snapshot, scenario.now)
    assert [e.workload_id for e in decisions.evictions] == [1]
    assert decisions.explanations[11].code == "no-capacity"
    assert decisions.explanations[12].message == "waiting behind workload 11 (strict order)"
