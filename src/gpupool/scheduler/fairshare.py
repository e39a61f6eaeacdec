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


def children_of(queues: Sequence[QueueView]) -> dict[str | None, list[QueueView]]:
    """Queues by parent name; a queue whose parent is unknown counts as top-level."""
    return {parent: [queues[i] for i in kids] for parent, kids in _positions(queues).items()}


def _positions(queues: Sequence[QueueView]) -> dict[str | None, list[int]]:
    """`children_of` as positions in `queues`: each parent's children (None: the top level) by name, ties
    in the queues' order; the parents in the order their first child by name comes."""
    names = [q.name for q in queues]
    known = set(names)
    children: dict[str | None, list[int]] = {}
    for i in sorted(range(len(names)), key=names.__getitem__):
        parent = queues[i].parent
        key = parent if parent in known else None
        found = children.get(key)
        if found is None:
            found = children[key] = []
        found.append(i)
    return children


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
    kids = children.get(name)
    if kids is not None:
        for child in kids:
            below += _sum_subtree(children, own, child.name, out)
    total = own.get(name, 0.0) + below
    out[name] = total
    return total


class _Filled:
    """One resource's shares and what they were computed from (see `fair_shares`)."""

    __slots__ = ("capacity", "own", "queues", "shares", "usage_weight")

    def __init__(
        self,
        queues: list[QueueView],
        own: dict[str, float],
        capacity: float,
        usage_weight: float,
        shares: dict[str, float],
    ) -> None:
        self.queues = queues
        self.own = own
        self.capacity = capacity
        self.usage_weight = usage_weight
        self.shares = shares

    def same_inputs(
        self, queues: list[QueueView], own: dict[str, float], capacity: float, usage_weight: float
    ) -> bool:
        """The same queues (objects, in order), and equal demand, capacity and usage weight."""
        if len(queues) != len(self.queues) or capacity != self.capacity or usage_weight != self.usage_weight:
            return False
        last = self.queues
        for i in range(len(queues)):  # zip's `strict` would make this loop a call through Python
            if queues[i] is not last[i]:
                return False
        return own == self.own


# Each resource's last shares, replaced whole (one reference, so a reader never sees half of it). The shares
# are a function of their inputs, so equal inputs may take them from here: the simulator asks twice a cycle
# with the same queues and demand (its skip test, then `decide`), and again cycle after cycle until work
# arrives or finishes; the control loop, with fresh queue views every pass, computes them afresh.
_LAST: Final[dict[str, _Filled]] = {}


def fair_shares(
    queues: Sequence[QueueView],
    demand: dict[str, dict[str, float]],
    capacity: dict[str, float],
    usage_weight: float = 0.0,
    resources: Sequence[str] = RESOURCES,
) -> dict[str, dict[str, float]]:
    """Fair share of every queue (parents included) for each of `resources` (by default all three)."""
    queues = list(queues)
    result: dict[str, dict[str, float]] = {}
    rows: list[dict[str, float]] = []  # the queues' rows of `result` (of a name given twice, the last is)
    asked: list[dict[str, float] | None] = []  # the queues' demand
    for q in queues:
        row: dict[str, float] = {}
        result[q.name] = row
        rows.append(row)
        asked.append(demand.get(q.name))
    children: dict[str | None, list[QueueView]] | None = None
    for resource in resources:
        if not _wanted(asked, resource) and _no_negative_share(queues, resource):
            for row in rows:  # what water-filling gives when no queue wants any of it, without the walk
                row[resource] = 0.0
            continue
        own: dict[str, float] = {}
        for i, q in enumerate(queues):
            wants = asked[i]
            own[q.name] = wants.get(resource, 0.0) if wants is not None else 0.0
        available = capacity.get(resource, 0.0)
        last = _LAST.get(resource)
        if last is not None and last.same_inputs(queues, own, available, usage_weight):
            for name, share in last.shares.items():
                result[name][resource] = share
            continue
        if children is None:
            children = _children(queues)
        totals: dict[str, float] = {}
        for top in children.get(None, []):  # the trees are disjoint: each writes its own queues' totals
            _sum_subtree(children, own, top.name, totals)
        _split(children, None, available, resource, totals, usage_weight, result)
        # a queue whose parents form a loop is on no tree from the top, and gets no share (as before)
        filled = {name: row[resource] for name, row in result.items() if resource in row}
        _LAST[resource] = _Filled(queues, own, available, usage_weight, filled)
    return result


class _Tree:
    """The names and parents of the last queues given to `fair_shares`, and their tree by position."""

    __slots__ = ("names", "parents", "positions")

    def __init__(self, queues: list[QueueView]) -> None:
        self.names = [q.name for q in queues]
        self.parents = [q.parent for q in queues]
        self.positions = _positions(queues)

    def fits(self, queues: list[QueueView]) -> bool:
        """Whether `queues` have these names and parents, in this order."""
        names = self.names
        parents = self.parents
        if len(queues) != len(names):
            return False
        return all(q.name == names[i] and q.parent == parents[i] for i, q in enumerate(queues))


_TREE: Final[list[_Tree]] = []  # at most one: the last


def _children(queues: list[QueueView]) -> dict[str | None, list[QueueView]]:
    """`children_of(queues)`, its shape taken from the last call when the queues have the same names and
    parents in the same order: the tree is a function of those alone (the simulator's queue views change
    with their weights, cycle after cycle; their names and parents do not)."""
    last = _TREE[0] if _TREE else None
    if last is None or not last.fits(queues):
        last = _Tree(queues)
        _TREE[:] = [last]
    return {parent: [queues[i] for i in kids] for parent, kids in last.positions.items()}


def _wanted(asked: list[dict[str, float] | None], resource: str) -> bool:
    """Whether some queue's demand (None: none) asks for some of `resource`."""
    return any(wants is not None and wants.get(resource, 0.0) != 0.0 for wants in asked)


def _no_negative_share(queues: list[QueueView], resource: str) -> bool:
    """No quota or limit of `resource` is negative: where no queue wants any of it, every share is 0 then.
    (Traces without CPU or memory requests, and clusters that do not count them, ask this for two
    resources of three.)"""
    for q in queues:
        share = q.share(resource)
        if share.quota < 0.0 or (share.limit is not None and share.limit < 0.0):
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
        if queue.name in children:
            _split(children, queue.name, share, resource, demand, usage_weight, result)


def water_fill(
    siblings: list[QueueView],
    capacity: float,
    resource: str,
    demand: dict[str, float],
    usage_weight: float = 0.0,
) -> dict[str, float]:
    count = len(siblings)
    caps: list[float] = []
    shares: list[float] = []
    guaranteed = 0.0  # summed in order, as sum() adds floats
    for q in siblings:
        share = q.share(resource)
        cap = demand.get(q.name, 0.0)
        limit = share.limit
        if limit is not None and limit < cap:
            cap = limit
        caps.append(cap)
        given = cap if cap < share.quota else share.quota  # min(quota, cap), ties as min gives them
        shares.append(given)
        guaranteed += given
    if guaranteed > capacity + EPSILON:
        # Quotas promise more than exists (a node is down, say): scale the guarantees down evenly.
        scale = capacity / guaranteed if guaranteed > 0 else 0.0
        return {q.name: shares[i] * scale for i, q in enumerate(siblings)}
    remaining = capacity - guaranteed
    if remaining > EPSILON:
        weights = _weights(siblings, resource, usage_weight)
        tiers = _tiers(siblings)
        for tier in tiers:
            active: list[int] = []
            for i in range(count):
                if siblings[i].priority == tier and caps[i] - shares[i] > EPSILON:
                    active.append(i)
            while remaining > EPSILON and active:
                total_weight = 0.0
                for i in active:
                    total_weight += weights[i]
                if total_weight <= 0:
                    break
                given = 0.0
                for i in active:
                    offer = remaining * weights[i] / total_weight
                    room = caps[i] - shares[i]
                    take = room if room < offer else offer
                    shares[i] += take
                    given += take
                remaining -= given
                still: list[int] = []
                for i in active:
                    if caps[i] - shares[i] > EPSILON and weights[i] > 0:
                        still.append(i)
                active = still
                if given <= EPSILON:
                    break
    return {q.name: shares[i] for i, q in enumerate(siblings)}


def _tiers(siblings: list[QueueView]) -> list[int]:
    """The siblings' priorities, each once, highest first."""
    if not siblings:
        return []
    first = siblings[0].priority
    for q in siblings:
        if q.priority != first:
            return sorted({q.priority for q in siblings}, reverse=True)
    return [first]


def _weights(siblings: list[QueueView], resource: str, usage_weight: float) -> list[float]:
    """Each sibling's over-quota weight, in the siblings' order, tilted by usage (see the module)."""
    weights = [max(0.0, q.share(resource).weight) for q in siblings]
    if usage_weight <= 0:
        return weights
    total_usage = sum(max(0.0, q.usage) for q in siblings)
    total_weight = sum(weights)
    if total_usage <= 0 or total_weight <= 0:
        return weights
    tilted: list[float] = []
    for q, weight in zip(siblings, weights, strict=True):
        weight_share = weight / total_weight
        if weight_share <= 0:
            tilted.append(0.0)
            continue
        ratio = (max(0.0, q.usage) / total_usage) / weight_share
        exponent = max(-MAX_TILT_EXPONENT, min(MAX_TILT_EXPONENT, -usage_weight * (ratio - 1.0)))
        tilted.append(weight * 2.0**exponent)
    return tilted
