"""Which running work a cycle may evict, and in what order (the phase above `Prepared`)."""

from __future__ import annotations

import bisect
from typing import Final

from gpupool.scheduler.ordering import has_nan
from gpupool.scheduler.prepare import Prepared
from gpupool.scheduler.snapshot import WorkloadView
from gpupool.scheduler.state import MAX_TEMPLATES, same_work

MIN_MOVE_AGE: Final = 60.0  # seconds a workload runs before consolidation may move it


class _NodeOrder:
    """A node's victims in victim order, for the next cycle with the same victims (see `_victim_index`)."""

    __slots__ = ("first", "order", "victims")

    def __init__(self, victims: list[WorkloadView], order: list[WorkloadView], first: tuple[float, ...]):
        self.victims = victims
        self.order = order
        self.first = first


# The last victim order of each node, by name: a pure cache that changes no result, bounded.
_ORDERS: Final[dict[str, _NodeOrder]] = {}
# The same for one queue's victims on a node, by (queue, node): see `Victims._sort_victims`.
_QUEUE_ORDERS: Final[dict[tuple[str, str], _NodeOrder]] = {}


class _NodesOrder:
    """The nodes of a victim index in order of their first victim's key (ascending, distinct keys without
    NaN), and each node's key."""

    __slots__ = ("by_name", "keys", "names")

    def __init__(
        self, keys: list[tuple[float, ...]], names: list[str], by_name: dict[str, tuple[float, ...]]
    ) -> None:
        self.keys = keys
        self.names = names
        self.by_name = by_name


class _LastNodes:
    """The last cycle's `_NodesOrder`, replaced whole (one reference)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = _NodesOrder([], [], {})


_NODES: Final = _LastNodes()
MAX_MOVED: Final = 16  # nodes whose first victim changed since the last index beyond which all are sorted


def _by_first(firsts: list[tuple[tuple[float, ...], str]]) -> list[str]:
    """The names of `firsts` (a node's first victim's key, and the node; each node once), in ascending order
    of the pairs, exactly as sorting them gives.

    Most nodes' first victims are the same from one cycle to the next, and so is their key object (see
    `_ORDERS`). So this starts from the last order: the nodes whose key is the same object keep their
    places, and only the others are inserted. When the keys are distinct (they end in the victim's id) and
    none holds a NaN, there is one order they sort to: this one. Otherwise the pairs are sorted, and not
    remembered."""
    last = _NODES.last
    moved: list[tuple[tuple[float, ...], str]] = []
    for pair in firsts:
        if last.by_name.get(pair[1]) is not pair[0]:
            moved.append(pair)
            if len(moved) > MAX_MOVED:
                return _sort_firsts(firsts)
    now: dict[str, tuple[float, ...]] = {}
    for key, name in firsts:
        now[name] = key
    keys: list[tuple[float, ...]] = []
    names: list[str] = []
    last_keys, last_names = last.keys, last.names
    for i in range(len(last_names)):  # zip's `strict` would make this loop a call through Python
        name = last_names[i]
        key = last_keys[i]
        if now.get(name) is key:
            keys.append(key)
            names.append(name)
    for key, name in moved:
        at = bisect.bisect_right(keys, key)
        if has_nan(key) or (at > 0 and keys[at - 1] == key) or (at < len(keys) and keys[at] == key):
            return _sort_firsts(firsts)
        keys.insert(at, key)
        names.insert(at, name)
    _NODES.last = _NodesOrder(keys, names, now)
    return list(names)


def _timeless(victims: list[WorkloadView]) -> bool:
    """Whether these victims' keys, once asked (`Victims._victim_key`), do not depend on the clock: then
    each view keeps its key, and their order holds in any later cycle."""
    return all(v.victim_key is not None for v in victims)


def _sort_firsts(firsts: list[tuple[tuple[float, ...], str]]) -> list[str]:
    """`firsts` sorted; remembered for the next cycle when the keys are distinct and free of NaN."""
    firsts.sort()
    keys = [pair[0] for pair in firsts]
    names = [pair[1] for pair in firsts]
    _NODES.last = _NodesOrder([], [], {})
    for i, key in enumerate(keys):
        if has_nan(key) or (i > 0 and keys[i - 1] == key):
            return names
    _NODES.last = _NodesOrder(keys, list(names), {name: key for key, name in firsts})
    return names


class Victims(Prepared):
    """Running work as victims: who may be evicted (minimum runtimes, preemptibility) and in what order."""

    def _victim_key(self, v: WorkloadView) -> tuple[float, ...]:
        """Fewest GPUs, lowest priority, least work lost, latest started, then the id (keys are unique).

        Work lost is `_lost`: GPUs times the time since the last checkpoint (or the start). Among victims
        of the same GPUs it orders as the time of that checkpoint does, latest first, so the key holds that
        time and not the clock: the same victims keep the same order from cycle to cycle. (Without a start
        or checkpoint time nothing is lost, as if checkpointed now.) A key that does not read the clock is
        kept on the view (`WorkloadView.victim_key`): the same view has the same key in every cycle."""
        known = v.victim_key
        if known is not None:
            return known
        since = v.last_checkpoint_time if v.last_checkpoint_time is not None else v.start_time
        timeless = since is not None
        if since is None:
            since = self.now
        units = v.gpu_units
        recent = -since if units > 0.0 else (since if units < 0.0 else 0.0)
        started = v.start_time if v.start_time is not None else 0.0
        key = (units, v.priority, recent, -started, v.id)
        if timeless:
            v.victim_key = key
        return key

    def _lost(self, v: WorkloadView) -> float:
        """GPU-seconds of work that evicting `v` now loses: since its last checkpoint, or its start."""
        since = v.last_checkpoint_time if v.last_checkpoint_time is not None else v.start_time
        return (self.now - since) * v.gpu_units if since is not None else 0.0

    def _min_runtime(self, queue: str, kind: str) -> float:
        key = (queue, kind)
        found = self._runtime_floor.get(key)
        if found is None:
            found = self._runtime_floor[key] = self._inherited_min_runtime(queue, kind)
        return found

    def _inherited_min_runtime(self, queue: str, kind: str) -> float:
        for name in self.state.chain(queue):
            q = self.queues.get(name)
            value = (
                None if q is None else (q.min_runtime_preempt if kind == "preempt" else q.min_runtime_reclaim)
            )
            if value is not None:
                return value
        return 0.0

    def _old_enough(self, v: WorkloadView, kind: str) -> bool:
        if not self._floors and (v.start_time is None or v.start_time <= self.now):
            return True  # what _past_min_runtime finds with every floor at zero or below
        known = self._old[kind]
        found = known.get(v.id)
        if found is None:
            found = known[v.id] = self._past_min_runtime(v, kind)
        return found

    def _past_min_runtime(self, v: WorkloadView, kind: str) -> bool:
        if v.id in self._tentative:
            return True  # a bind of this cycle has not started: no minimum runtime to protect
        started = v.start_time if v.start_time is not None else float("-inf")
        floor = self._min_runtime(v.queue, kind)
        if self.now - started >= floor:
            return True
        self.state.expires(started + floor)
        return False

    def _movable(self, v: WorkloadView) -> bool:
        """Consolidation moves only settled work: evictable, past its queue's minimum runtime for preempt,
        and older than MIN_MOVE_AGE (work just placed is never moved again at once)."""
        started = v.start_time if v.start_time is not None else float("-inf")
        if not (v.running and self._evictable(v) and self._old_enough(v, "preempt")):
            return False
        if self.now - started >= MIN_MOVE_AGE:
            return True
        self.state.expires(started + MIN_MOVE_AGE)
        return False

    def _evictable(self, v: WorkloadView) -> bool:
        evicted = self.state.evicted
        return v.preemptible and not v.stopping and (not evicted or v.id not in evicted)

    def _victim_groups(self) -> dict[str, list[WorkloadView]]:
        """Evictable running single-pod work on schedulable nodes, by node (gangs are never victims here),
        and this cycle's single-pod binds so far: the victims of this cycle, taken once, at the first
        question about them (callers skip what was evicted since). `_victim_index` orders them; the
        questions that need no order (which queues have victims, their lowest priority) ask this, and a
        cycle that never needs the order never sorts."""
        if self._groups is None:
            groups: dict[str, list[WorkloadView]] = {}
            nodes = self.state.nodes
            if not self.state.evicted:
                # Nothing evicted yet: the victims are the running work `Prepared` grouped by node in its
                # pass (`_singles`, the nodes in the same order), on the nodes that are schedulable.
                whole = True
                for name, group in self._singles.items():
                    node = nodes.get(name)
                    if node is not None and node.schedulable:
                        groups[name] = group
                    else:
                        whole = False
                self._singles_whole = whole
            else:
                for v in self.snapshot.running:
                    if len(v.placement) != 1 or not self._evictable(v):
                        continue
                    name = v.placement[0].node
                    found = groups.get(name)  # made only for a schedulable node
                    if found is None:
                        node = nodes.get(name)
                        if node is None or not node.schedulable:
                            continue
                        found = groups[name] = []
                    found.append(v)
            # This cycle's own binds give way first: they lose no work and nothing needs stopping.
            binds = self._bind_victims = self._binds_as_victims(gangs=False)
            for v in binds:
                groups.setdefault(v.placement[0].node, []).append(v)
            self._groups = groups
        return self._groups

    def _binds_as_victims(self, gangs: bool) -> list[WorkloadView]:
        """This cycle's preemptible binds so far, of gangs or of single-pod work, as running views: victims
        that are taken back rather than evicted (see EvictionSearch._keep_trial)."""
        found: list[WorkloadView] = []
        for bind in self.decisions.binds:
            if (len(bind.pods) > 1) != gangs or bind.workload_id in self.state.evicted:
                continue
            w = self._tentative.get(bind.workload_id) or self._pending_by_id[bind.workload_id]
            if w.preemptible:
                self._tentative[w.id] = w
                found.append(w.started(bind.pods, self.now))
        return found

    def _sort_victims(self, queue: str, name: str, victims: list[WorkloadView]) -> None:
        """Sort one queue's victims on one node (`victims`, in place) into victim order. The order is taken
        from the last cycle that sorted this queue's victims there when they are the same (objects, in the
        same order) and have a start or checkpoint time: their keys do not depend on the clock."""
        known = _QUEUE_ORDERS.get((queue, name))
        if known is not None and same_work(known.victims, victims):
            victims[:] = known.order
            return
        before = list(victims)
        victims.sort(key=self._victim_key)  # keys are unique: they end in the id
        if _timeless(victims):
            if len(_QUEUE_ORDERS) >= MAX_TEMPLATES:
                _QUEUE_ORDERS.clear()
            _QUEUE_ORDERS[(queue, name)] = _NodeOrder(before, list(victims), ())

    def _victim_index(self) -> dict[str, list[WorkloadView]]:
        """The victims (`_victim_groups`) by node, each list in victim order, the nodes by their first."""
        if self._index is None:
            groups = dict(self._victim_groups())
            # Sorted per node, and the nodes by their first victim: the same lists, in the same order, as
            # sorting every victim at once and grouping them by node (keys are unique: they end in the id).
            # A node's order is taken from the last cycle when its victims are the same (objects, in the
            # same order) and have a start or checkpoint time: their keys do not depend on the clock.
            firsts: list[tuple[tuple[float, ...], str]] = []
            for name, victims in groups.items():
                known = _ORDERS.get(name)
                if known is not None and same_work(known.victims, victims):
                    groups[name] = list(known.order)
                    firsts.append((known.first, name))
                    continue
                keys = [self._victim_key(v) for v in victims]
                if len(victims) == 1:
                    ordered = [victims[0]]
                    first = keys[0]
                else:
                    # Stable: equal keys (there are none, they end in the id) would keep the victims' order.
                    order = sorted(range(len(keys)), key=keys.__getitem__)
                    ordered = [victims[i] for i in order]
                    first = keys[order[0]]
                groups[name] = ordered
                firsts.append((first, name))
                if _timeless(victims):
                    if len(_ORDERS) >= MAX_TEMPLATES:
                        _ORDERS.clear()
                    _ORDERS[name] = _NodeOrder(list(victims), list(ordered), first)
            self._index = {name: groups[name] for name in _by_first(firsts)}
        return self._index
