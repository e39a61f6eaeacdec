"""Fair shares: a resource that no queue wants gets 0 everywhere, as the full water-filling walk gives."""

from __future__ import annotations

import pytest

from gpupool.scheduler import QueueView, Share, fairshare
from gpupool.scheduler.fairshare import _split, children_of, fair_shares, subtree_demand

QUEUES = [
    QueueView("research", gpu=Share(quota=16.0, weight=1.5), cpu=Share(quota=64.0, limit=128.0)),
    QueueView("nlp", parent="research", gpu=Share(quota=8.0), cpu=Share(quota=32.0, weight=2.0)),
    QueueView("vision", parent="research", cpu=Share(quota=0.0, limit=0.0)),
    QueueView("product", gpu=Share(quota=12.0), priority=1),
    QueueView("orphan", parent="gone", memory=Share(quota=2.0**30)),
]


def walked(resource: str, capacity: float) -> dict[str, float]:
    """The shares by the water-filling walk itself, with no queue wanting any of `resource`."""
    children = children_of(QUEUES)
    own = dict.fromkeys((q.name for q in QUEUES), 0.0)
    totals: dict[str, float] = {}
    for top in children.get(None, []):
        totals.update(subtree_demand(children, own, top.name))
    result: dict[str, dict[str, float]] = {q.name: {} for q in QUEUES}
    _split(children, None, capacity, resource, totals, 0.0, result)
    return {name: shares[resource] for name, shares in result.items()}


@pytest.mark.parametrize("capacity", [0.0, 96.0])
def test_a_resource_no_queue_wants_gets_a_share_of_zero_everywhere_as_water_filling_gives(
    capacity: float,
) -> None:
    demand = {"nlp": {"gpu": 12.0}, "product": {"gpu": 20.0}}  # GPUs only: no CPU or memory asked
    shares = fair_shares(QUEUES, demand, {"gpu": 32.0, "cpu": capacity, "memory": capacity})
    for resource in ("cpu", "memory"):
        got = {name: row[resource] for name, row in shares.items()}
        assert got == walked(resource, capacity) == dict.fromkeys(got, 0.0)
    assert shares["nlp"]["gpu"] == 12.0 and shares["product"]["gpu"] == 20.0  # GPUs shared as before


def test_shares_asked_again_with_the_same_inputs_are_the_same_and_the_caller_may_change_them() -> None:
    demand = {"nlp": {"gpu": 12.0}, "product": {"gpu": 20.0}, "vision": {"gpu": 30.0}}
    capacity = {"gpu": 40.0, "cpu": 0.0, "memory": 0.0}
    first = fair_shares(QUEUES, demand, capacity)
    expected = {name: dict(row) for name, row in first.items()}
    first["nlp"]["gpu"] = -1.0  # the caller's own copy (the decisions hold it)
    again = fair_shares(QUEUES, demand, capacity)
    assert again == expected and again is not first
    assert again["product"]["gpu"] == 20.0 and again["nlp"]["gpu"] + again["vision"]["gpu"] == 20.0


@pytest.mark.parametrize(
    "change",
    ["demand", "capacity", "queue", "parent", "usage_weight"],
)
def test_shares_follow_any_change_of_their_inputs(change: str) -> None:
    demand = {"nlp": {"gpu": 12.0}, "product": {"gpu": 20.0}, "vision": {"gpu": 30.0}}
    capacity = {"gpu": 40.0, "cpu": 0.0, "memory": 0.0}
    # the same queues throughout, `nlp` having used GPUs (which counts only with a usage weight above 0)
    queues = [QueueView(q.name, q.parent, q.priority, q.gpu, q.cpu, q.memory, usage=u) for q, u in
              zip(QUEUES, (0.0, 100.0, 0.0, 0.0, 0.0), strict=True)]  # fmt: skip
    usage_weight = 0.0
    before = fair_shares(queues, demand, capacity, usage_weight)
    if change == "demand":
        demand = {**demand, "product": {"gpu": 4.0}}
    elif change == "capacity":
        capacity = {**capacity, "gpu": 24.0}
    elif change == "queue":  # an equal-looking list, one queue changed
        queues[3] = QueueView("product", gpu=Share(quota=2.0, limit=10.0), priority=1)
    elif change == "parent":  # the same names, one queue moved to the top: another tree
        queues[2] = QueueView("vision", cpu=Share(quota=0.0, limit=0.0))
    else:
        usage_weight = 1.0
    after = fair_shares(queues, demand, capacity, usage_weight)
    assert after != before
    assert after == _fresh(queues, demand, capacity, usage_weight)


def _fresh(
    queues: list[QueueView],
    demand: dict[str, dict[str, float]],
    capacity: dict[str, float],
    usage_weight: float,
) -> dict[str, dict[str, float]]:
    """The shares computed with nothing remembered."""
    fairshare._LAST.clear()
    fairshare._TREE.clear()
    return fair_shares(queues, demand, capacity, usage_weight)


def test_shares_asked_for_one_resource_are_that_resource_s_shares_of_all_three() -> None:
    demand = {"nlp": {"gpu": 12.0, "cpu": 40.0}, "product": {"gpu": 20.0}, "vision": {"gpu": 30.0}}
    capacity = {"gpu": 40.0, "cpu": 64.0, "memory": 0.0}
    every = _fresh(QUEUES, demand, capacity, 0.0)
    fairshare._LAST.clear()
    gpus = fair_shares(QUEUES, demand, capacity, resources=("gpu",))
    assert gpus == {name: {"gpu": row["gpu"]} for name, row in every.items()}
    # and the three asked after one come out as when asked at once
    assert fair_shares(QUEUES, demand, capacity) == every
