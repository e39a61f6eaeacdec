"""Which running work a cycle may evict, and in what order (the phase above `Prepared`)."""

from __future__ import annotations

from typing import Final

from gpupool.scheduler import explain
from gpupool.scheduler.prepare import Prepared
from gpupool.scheduler.snapshot import WorkloadView

MIN_MOVE_AGE: Final = 60.0  # seconds a workload runs before consolidation may move it


class Victims(Prepared):
    """Running work as victims: who may be evicted (minimum runtimes, preemptibility) and in what order."""

    def _victim_key(self, v: WorkloadView) -> tuple[float, ...]:
        since = v.last_checkpoint_time if v.last_checkpoint_time is not None else v.start_time
        lost = (self.now - since) * v.gpu_units if since is not None else 0.0
        started = v.start_time if v.start_time is not None else 0.0
        return (v.gpu_units, v.priority, lost, -started, v.id)

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
            for v in self.snapshot.running:
                if len(v.placement) != 1 or not self._evictable(v):
                    continue
                name = v.placement[0].node
                group = groups.get(name)  # made only for a schedulable node
                if group is None:
                    node = nodes.get(name)
                    if node is None or not node.schedulable:
                        continue
                    group = groups[name] = []
                group.append(v)
            # This cycle's own binds give way first: they lose no work and nothing needs stopping.
            for bind in self.decisions.binds:
                w = self._tentative.get(bind.workload_id) or self._pending_by_id[bind.workload_id]
                if len(bind.pods) == 1 and w.preemptible and bind.workload_id not in self.state.evicted:
                    self._tentative[w.id] = w
                    groups.setdefault(bind.pods[0].node, []).append(w.started(bind.pods, self.now))
            self._groups = groups
        return self._groups

    def _victim_index(self) -> dict[str, list[WorkloadView]]:
        """The victims (`_victim_groups`) by node, each list in victim order, the nodes by their first."""
        if self._index is None:
            groups = dict(self._victim_groups())
            # Sorted per node, and the nodes by their first victim: the same lists, in the same order, as
            # sorting every victim at once and grouping them by node (keys are unique: they end in the id).
            firsts: list[tuple[tuple[float, ...], str]] = []
            for name, victims in groups.items():
                keys = [self._victim_key(v) for v in victims]
                if len(victims) == 1:
                    groups[name] = [victims[0]]
                    firsts.append((keys[0], name))
                    continue
                # Stable: equal keys (there are none, they end in the id) would keep the victims' order.
                order = sorted(range(len(keys)), key=keys.__getitem__)
                groups[name] = [victims[i] for i in order]
                firsts.append((keys[order[0]], name))
            firsts.sort()
            self._index = {name: groups[name] for _, name in firsts}
        return self._index

    def _wants_room(self, w: WorkloadView) -> bool:
        """Still unplaced in this phase (see pending_groups), for want of capacity."""
        if not self.still_unplaced(w):
            return False
        explanation = self.decisions.explanations.get(w.id)
        return explanation is not None and explanation.code in explain.CAPACITY_CODES
