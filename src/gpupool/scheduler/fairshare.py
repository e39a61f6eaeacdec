"""Fair share by hierarchical water-filling, per resource.

Among siblings sharing a capacity (the cluster for top-level queues, the parent's fair share below):
1. each queue gets min(demand, quota, limit);
2. what is left goes to queues that still want more, tier by tier (higher queue priority first), split in
   proportion to over-quota weight and capped by min(demand, limit), in rounds until the capacity or the
   demand runs out.
With `usage_weight` > 0 a queue's weight is tilted by its decayed historical usage relative to its weight's
share: w * 2^(-usage_weight * (usage_share / weight_share - 1)), so a queue that used twice its share gets
half the weight at usage_weight 1 (the shape of Slurm's classic fair-share factor 2^(-U/S)).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gpupool.scheduler.snapshot import RESOURCES, QueueView

EPSILON: Final = 1e-9
MAX_TILT_EXPONENT: Final = 4.0


INFINITY: Final = float("inf")


def children_of(queues: Sequence[QueueView]) -> dict[str | None, list[QueueView]]:
    """Queues by parent name; a queue whose parent is unknown counts as top-level."""
    names = {q.name for q in queues}
    children: dict[str | None, list[QueueView]] = {}
    for queue in sorted(queues, key=_name):
        parent = queue.parent if queue.parent in names else None
        found = children.get(parent)
        if found is None:
            found = children[parent] = []
        found.append(queue)
    return children


def _name(queue: QueueView) -> str:
    return queue.name


def subtree_demand(
    children: dict[str | None, list[QueueView]], own: dict[str, float], root: str
) -> dict[str, float]:
    """Demand of every queue below and including `root`: its own plus all its descendants'."""
    out: dict[str, float] = {}
    _sum_subtree(children, own, root, out)
    return out


def _sum_subtree(
    children: dict[str | None, list[QueueView]], own: dict[str, float], name: str, out: dict[str, float]
) -> float:
    below = 0.0  # the children's totals summed in order, as sum(..., 0.0) adds them
    for child in children.get(name, []):
        below += _sum_subtree(children, own, child.name, out)
    total = own.get(name, 0.0) + below
    out[name] = total
    return total


def fair_shares(
    queues: Sequence[QueueView],
    demand: dict[str, dict[str, float]],
    capacity: dict[str, float],
    usage_weight: float = 0.0,
) -> dict[str, dict[str, float]]:
    """Fair share of every queue (parents included) for each resource."""
    queues = list(queues)
    children = children_of(queues)
    result: dict[str, dict[str, float]] = {q.name: {} for q in queues}
    tops = children.get(None, [])
    for resource in RESOURCES:
        own: dict[str, float] = {}
        for q in queues:
            row = demand.get(q.name)
            own[q.name] = row.get(resource, 0.0) if row is not None else 0.0
        if _nothing_wanted(queues, own, resource):
            for q in queues:  # what water-filling gives when no queue wants any of it, without the walk
                result[q.name][resource] = 0.0
            continue
        totals: dict[str, float] = {}
        for top in tops:  # the trees are disjoint: each writes its own queues' totals
            _sum_subtree(children, own, top.name, totals)
        _split(children, None, capacity.get(resource, 0.0), resource, totals, usage_weight, result)
    return result


def _nothing_wanted(queues: list[QueueView], own: dict[str, float], resource: str) -> bool:
    """No queue wants any of `resource` and no quota or limit is negative: every share is 0. (Traces without
    CPU or memory requests, and clusters that do not count them, ask this for two resources of three.)"""
    for q in queues:
        share = q.share(resource)
        if own[q.name] != 0.0 or share.quota < 0.0 or (share.limit is not None and share.limit < 0.0):
            return False
    return True


def _split(
    children: dict[str | None, list[QueueView]],
    parent: str | None,
    capacity: float,
    resource: str,
    demand: dict[str, float],
    usage_weight: float,
    result: dict[str, dict[str, float]],
) -> None:
    siblings = children.get(parent)
    if not siblings:
        return
    shares = water_fill(siblings, capacity, resource, demand, usage_weight)
    for queue in siblings:
        share = shares[queue.name]
        result[queue.name][resource] = share
        _split(children, queue.name, share, resource, demand, usage_weight, result)


def water_fill(
    siblings: Sequence[QueueView],
    capacity: float,
    resource: str,
    demand: dict[str, float],
    usage_weight: float = 0.0,
) -> dict[str, float]:
    caps: dict[str, float] = {}
    for q in siblings:
        limit = q.share(resource).limit
        caps[q.name] = min(demand.get(q.name, 0.0), limit if limit is not None else INFINITY)
    shares: dict[str, float] = {}
    for q in siblings:
        shares[q.name] = min(q.share(resource).quota, caps[q.name])
    guaranteed = 0.0  # summed in order, as sum() adds floats
    for share in shares.values():
        guaranteed += share
    if guaranteed > capacity + EPSILON:
        # Quotas promise more than exists (a node is down, say): scale the guarantees down evenly.
        scale = capacity / guaranteed if guaranteed > 0 else 0.0
        return {name: share * scale for name, share in shares.items()}
    remaining = capacity - guaranteed
    weights = _weights(siblings, resource, usage_weight)
    for tier in sorted({q.priority for q in siblings}, reverse=True):
        active: list[str] = []
        for q in siblings:
            if q.priority == tier and caps[q.name] - shares[q.name] > EPSILON:
                active.append(q.name)
        while remaining > EPSILON and active:
            total_weight = 0.0
            for name in active:
                total_weight += weights[name]
            if total_weight <= 0:
                break
            given = 0.0
            for name in active:
                offer = remaining * weights[name] / total_weight
                take = min(offer, caps[name] - shares[name])
                shares[name] += take
                given += take
            remaining -= given
            still: list[str] = []
            for name in active:
                if caps[name] - shares[name] > EPSILON and weights[name] > 0:
                    still.append(name)
            active = still
            if given <= EPSILON:
                break
    return shares


def _weights(siblings: Sequence[QueueView], resource: str, usage_weight: float) -> dict[str, float]:
    weights = {q.name: max(0.0, q.share(resource).weight) for q in siblings}
    total_usage = sum(max(0.0, q.usage) for q in siblings)
    total_weight = sum(weights.values())
    if usage_weight <= 0 or total_usage <= 0 or total_weight <= 0:
        return weights
    tilted = {}
    for q in siblings:
        weight_share = weights[q.name] / total_weight
        if weight_share <= 0:
            tilted[q.name] = 0.0
            continue
        ratio = (max(0.0, q.usage) / total_usage) / weight_share
        exponent = max(-MAX_TILT_EXPONENT, min(MAX_TILT_EXPONENT, -usage_weight * (ratio - 1.0)))
        tilted[q.name] = weights[q.name] * 2.0**exponent
    return tilted
