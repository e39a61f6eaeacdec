"""One scheduling cycle: a fixed pipeline of actions over a tentative state, least disruptive first.

stale_gang -> allocate -> consolidate -> reclaim -> preempt. Each action tries scenarios on the state and
keeps only whole, feasible ones (see state.py's undo log). The cycle is pure: it reads the snapshot and
`now`, and returns Decisions. `Cycle` is the top of a chain of classes, one phase per module (see
prepare.py); this file holds the pipeline and the actions that evict: stale gangs, reclaim, preempt and
consolidation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from gpupool.scheduler import explain
from gpupool.scheduler.allocate import Allocation, whole_demand
from gpupool.scheduler.evict_search import Budget, VictimRule
from gpupool.scheduler.prepare import GLOBAL, same_shape
from gpupool.scheduler.snapshot import Decisions, Eviction, PodPlacement, WorkloadView
from gpupool.scheduler.state import EPSILON, GANG_LOST_STATES, LOST_STATES
from gpupool.spec.quantities import format_figure

MAX_CONSOLIDATION_TRIES: Final = 8
MAX_CONSOLIDATION_TARGETS: Final = 8  # nodes per pod considered for emptying
MAX_FILTERED: Final = 2  # queues whose victims a cycle filters out one by one before it splits them all


class Cycle(Allocation):
    # -- the pipeline ---------------------------------------------------------------------------------

    def run(self) -> Decisions:
        for action in self.config.actions:
            getattr(self, action)()
        if self._taken_back and "allocate" in self.config.actions:
            # A bind taken back gave less room than it held (its gainer took part of it): work that an
            # earlier walk left pending for want of that capacity, or over a fair share the bind counted
            # toward, may fit now. Walked again, as the next cycle's allocate would walk it.
            self._walk()
        if self._blockers and self.config.blocking == "strict":
            self._unblock_on_release()
        if self.decisions.released_to:
            self._keep_promises_in_line()
        return self.decisions

    def _unblock_on_release(self) -> None:
        """Under strict blocking, a queue's blocker that found no room when its turn came may fit once the
        GPUs that this cycle's evictions for other work release beyond what their gainers take are free:
        it then waits for them, and the work behind it goes free (`_let_go`), as the next cycle would
        have it."""
        for group, blocker in list(self._blockers.items()):
            why = self.decisions.explanations.get(blocker.id)
            if (
                not self.still_unplaced(blocker)
                or why is None
                or not explain.cured_by_capacity(why.code)
                or not self._fits_after_release(blocker)
            ):
                continue
            for w in self.order[group]:
                held = self.decisions.explanations.get(w.key)
                if self.still_unplaced(w) and held is not None and held.code == explain.BLOCKED:
                    self._let_go(w, explain.BLOCKED)

    def _keep_promises_in_line(self) -> None:
        """A promise of released GPUs (`_promise`) stands only for a workload that nothing still pending
        comes before in its group's order: served first in the next cycle, it would otherwise start ahead
        of work its own queue ranks higher (work this cycle left without room)."""
        fair_share = self.config.fair_share
        released_to = self.decisions.released_to
        for stopping, waiting in list(released_to.items()):
            w = self._pending_by_id[waiting]
            line = self.order[w.queue if fair_share else GLOBAL]
            ahead = self.ahead_of(w)
            if any(v.id in self.unplaced for v in line[:ahead]):
                del released_to[stopping]

    # -- stale gangs ----------------------------------------------------------------------------------

    def stale_gang(self) -> None:
        state = self.state
        nodes = state.nodes  # every node of the snapshot, by name, the last when a name repeats
        # Each node that running work (or a bind of this cycle, placed only on nodes in service) is on,
        # once: when all are known and in service, only a gang missing pods is stale (`_short`: those, in
        # the order of the running work). The state counted when every node is.
        whole = (not state.lost_nodes and not state.unknown_nodes) or all(
            (node := nodes.get(name)) is not None and node.view.state not in GANG_LOST_STATES
            for name in self.by_node
        )
        for w in self._short if whole else self.snapshot.running:
            if w.stopping or (whole and len(w.placement) >= w.nodes):
                continue
            gone = GANG_LOST_STATES if len(w.placement) > 1 else LOST_STATES
            lost: list[str] = []
            for pod in w.placement:
                node = nodes.get(pod.node)
                if node is None or node.view.state in gone:
                    lost.append(pod.node)
            if lost or len(w.placement) < w.nodes:
                where = ", ".join(sorted(set(lost))) or "a missing pod"
                self._evict(
                    w, "stale-gang", f"gang lost part of its placement ({where}); restarting it whole"
                )

    # -- what wants room -------------------------------------------------------------------------------

    def _wants_room(self, w: WorkloadView) -> bool:
        """Still unplaced in this phase (see pending_groups), for want of capacity."""
        if not self.still_unplaced(w):
            return False
        explanation = self.decisions.explanations.get(w.key)
        if explanation is None:
            return False
        code = explanation.code
        if code == explain.BLOCKED or code == explain.RESERVED:
            return self._let_go(w, code)
        return explain.cured_by_capacity(code)

    def _let_go(self, w: WorkloadView, code: str) -> bool:
        """Work held back by another workload that did not fit (`blocking: strict`: the one of its group
        that every later one waits behind; `backfill`: the holder of the reservation) goes free once room
        has been made for that one (it waits for release; its reservation is dropped): it is tried as the
        next cycle's allocate would try it, and may hold back others in turn. Whether `w` now wants room."""
        group = w.queue if self.config.fair_share else GLOBAL
        if code == explain.BLOCKED:
            blocker = self._blockers[group]
            if self.still_unplaced(blocker):
                self.decisions.explanations[w.key] = explain.blocked(blocker.id)  # it may be another by now
                return False
        else:
            reservation = self.state.reservation
            if (
                reservation is not None
                and self._reserved_by.get(w.id) is reservation
                and reservation.workload_id in self.unplaced
            ):
                return False
        self._let_go_count += 1
        if self._try_allocate(w) or not self.still_unplaced(w):
            return False  # started, or waits for GPUs being released
        code = self.decisions.explanations[w.key].code
        if self.config.blocking == "strict" and self._holds_back(w, code):
            self._blockers[group] = w
        return explain.cured_by_capacity(code)

    # -- reclaim --------------------------------------------------------------------------------------

    def reclaim(self) -> None:
        # (floor, reclaimer line) -> GPUs a reclaimer on that line may free per node
        lines: dict[tuple[str, ...], dict[str, float]] = {}
        # (queue, shape) -> the stamp of the state after reclaiming for such a workload changed nothing
        fruitless: dict[tuple[object, ...], tuple[object, ...]] = {}
        # The last workload that reclaiming did nothing for, and the stamp then: one alike that comes next,
        # while nothing changed, is told so without its shape built and hashed (the usual case).
        alike: WorkloadView | None = None
        alike_at: tuple[object, ...] = ()
        stamp = self._stamp()  # as it is now: only reclaiming for a workload (or trying one again) changes it
        tried = self._let_go_count
        for group in self.pending_groups():
            if (
                group != GLOBAL
                and self.state.allocated(group) + self._least_gpus(group) > self.fair(group) + EPSILON
            ):
                # None of it may reclaim (see _reclaim_for); during its turn only its own gains change that.
                continue
            for w in self.order[group]:
                wants = self._wants_room(w)
                if self._let_go_count != tried:
                    stamp, tried = self._stamp(), self._let_go_count
                if not wants:
                    continue
                # What reclaiming for `w` does depends on its queue, its shape and the state, not on which
                # workload it is (but for a backfill reservation, held by one: then every one is tried).
                # While the state is as it was when it did nothing for one alike, it does nothing again.
                key: tuple[object, ...] | None = None
                if self.state.reservation is None:
                    # `stamp` stays the same object while nothing changes (see below): asked by identity
                    unchanged = stamp is alike_at or stamp == alike_at
                    if alike is not None and unchanged and same_shape(w, alike):
                        self._unreclaimable(w)
                        continue
                    key = (w.queue, self._shape(w))
                    # (asked only once something is kept: hashing the shape costs more than building it)
                    if fruitless and fruitless.get(key) == stamp:
                        alike, alike_at = w, stamp
                        self._unreclaimable(w)
                        continue
                if not self._reclaim_for(w, lines):
                    return
                after = self._stamp()
                if after != stamp:
                    stamp = after
                elif key is not None:
                    fruitless[key] = stamp
                    alike, alike_at = w, stamp

    def _stamp(self) -> tuple[object, ...]:
        """What changes whenever an action changes anything: the state's counters and undo log, and the
        decisions so far."""
        state, decisions = self.state, self.decisions
        return (
            state.checkpoint(), state.generation, state.held_generation, len(state.accounted),
            len(decisions.evictions), len(decisions.binds), len(self.unplaced),
        )  # fmt: skip

    def _reclaim_for(self, w: WorkloadView, lines: dict[tuple[str, ...], dict[str, float]]) -> bool:
        """Reclaim room for `w` where it may and can; False when nothing at all could be reclaimed.

        Two rules, as KAI-Scheduler's reclaim strategies: first from queues above their fair share, each
        kept at or above it; then, for a reclaimer that stays within its quota, from queues above their
        quota, each while it is above its quota (a job holding borrowed GPUs may go whole: see Budget).
        Single-pod victims first; a whole gang only when they cannot make room. The reclaimer never ends
        above its own fair share or, by quota, its quota, so no victim queue can take the GPUs straight
        back by either rule (the reclaimer would have to be above its quota, or above its fair share)."""
        queue, state = w.queue, self.state
        if state.allocated(queue) + w.gpu_units > self.fair(queue) + EPSILON:
            return True  # the reclaimer may not end above its fair share
        if self._fits_after_release(w):
            return True
        if not self._victim_groups() and not self._gangs():  # taken only once someone could gain from them
            self._unreclaimable(w)
            return False
        floors: list[str] = ["fair share"]
        if self._within_quota(w):
            floors.append("quota")
        for floor in floors:
            if self._victim_groups() and self._reclaim_singles(w, lines, floor):
                return True
        for floor in floors:
            if self._reclaim_gang(w, floor):
                return True
        self._unreclaimable(w)
        return True

    def _unreclaimable(self, w: WorkloadView) -> None:
        """Nothing may be reclaimed for `w`: when its queue is within its quota and `w` waits for capacity,
        its explanation says why the quota's guarantee does not start it (the code stays allocate's)."""
        why = self.decisions.explanations.get(w.key)
        if why is None or why.code != explain.NO_CAPACITY or w.gpu_units <= 0 or not self._within_quota(w):
            return  # (work with no GPUs waits for a node, which no quota promises)
        queue = w.queue
        self.decisions.explanations[w.key] = explain.quota_not_reclaimable(
            why, queue, self.state.allocated(queue), self.reclaim_floor(queue, "quota")
        )

    def _within_quota(self, w: WorkloadView) -> bool:
        """Whether `w`'s queue and every ancestor stay within their GPU quota with `w` started.

        Asked for one pending workload after another of a queue (each that reclaim could not serve): the
        last answer stands while the queue, the GPUs asked and the allocations (`state.accounted` grows
        with every change) are the same."""
        state = self.state
        queue, units, changes = w.queue, w.gpu_units, len(state.accounted)
        if queue == self._quota_queue and units == self._quota_units and changes == self._quota_changes:
            return self._quota_answer
        answer = all(
            state.allocated(level) + units <= self.reclaim_floor(level, "quota") + EPSILON
            for level in state.chain(queue)
        )
        self._quota_queue, self._quota_units, self._quota_changes = queue, units, changes
        self._quota_answer = answer
        return answer

    def _reclaim_singles(
        self, w: WorkloadView, lines: dict[tuple[str, ...], dict[str, float]], floor: str
    ) -> bool:
        """Evict single-pod work of queues above their `floor` for `w`; whether room was made."""
        queue, state = w.queue, self.state
        surplus = self._surplus_elsewhere(queue) if floor != "quota" else self._above_quota_elsewhere(queue)
        if surplus + state.held_gpus() + state.free_gpus() + EPSILON < w.gpu_units:
            return False
        index = self._victim_index()
        mine = frozenset(state.chain(queue))
        line = (floor, *state.chain(queue)[1:])
        units = lines.get(line)
        if units is None:
            if self._reclaim_gpus is None:
                self._reclaim_gpus = self._gpus_by_queue(index)
            units = lines[line] = self._reclaimable(self._reclaim_gpus, mine, floor)
        return self._evict_for(
            w,
            index,
            "reclaim",
            self._reclaim_reason(w, floor),
            _ReclaimRule(self, mine, floor),
            units,
            Budget(self, queue, floor),
        )

    def _reclaim_reason(self, w: WorkloadView, floor: str) -> Callable[[WorkloadView], str]:
        queue = w.queue

        def reason(v: WorkloadView) -> str:  # written only for the victims taken
            return (
                f"reclaimed for queue {queue} (below its {floor} of "
                f"{format_figure(self.reclaim_floor(queue, floor))} GPUs) by workload {w.id}; "
                + (
                    f"queue {v.queue} holds GPUs beyond its quota, and a job that borrows is stopped whole"
                    if floor == "quota"
                    else f"queue {v.queue} stays at or above its {floor}"
                )
            )

        return reason

    def _gangs(self) -> list[WorkloadView]:
        """Running multi-pod work that reclaim could evict whole, and this cycle's multi-pod binds so far,
        fewest GPUs first (built once a cycle, at the first question, as _victim_groups)."""
        if self._gang_victims is None:
            nodes = self.state.nodes
            gangs = [
                v
                for v in self.snapshot.running
                if len(v.placement) > 1
                and self._evictable(v)
                and all(pod.node in nodes and nodes[pod.node].schedulable for pod in v.placement)
            ]
            gangs.extend(self._binds_as_victims(gangs=True))
            gangs.sort(key=self._victim_key)
            self._gang_victims = gangs
        return self._gang_victims

    def _reclaim_gang(self, w: WorkloadView, floor: str) -> bool:
        """Evict the cheapest one whole gang of a queue above its `floor` that makes room for `w`."""
        if self._stop_limit is not None and not self._may_search(w):
            return False
        state = self.state
        # A miss stays a miss for the cycle unless capacity is given back (as in _evict_for).
        key = ("gang", floor, state.chain(w.queue)[1:], self._shape(w))
        stamp = (state.generation, 0)
        if self._no_victims.get(key) == stamp:
            return False
        mine = frozenset(state.chain(w.queue))
        single = w.nodes == 1 and not w.gpus.is_fractional and w.gpus.count >= 1
        budget = Budget(self, w.queue, floor)
        for g in self._gangs():
            if g.id in state.evicted or g.queue in mine or not self._old_enough(g, "reclaim"):
                continue
            if single and not any(self._pod_makes_room(w, pod) for pod in g.placement):
                continue
            if not budget.admits([g]) or not self._may_stop(w, [g]):
                continue
            checkpoint, generation = state.checkpoint(), state.generation
            state.evict(g, "reclaim")
            trial = state.checkpoint()
            placed = self.placer.place_gang(w, after_release=True)
            if placed is None:
                state.rollback(checkpoint)
                state.generation = generation
                continue
            reason = self._reclaim_reason(w, floor)
            self._keep_trial(w, [g], "reclaim", reason, (checkpoint, trial, generation), placed)
            return True
        self._no_victims[key] = stamp
        return False

    def _pod_makes_room(self, w: WorkloadView, pod: PodPlacement) -> bool:
        """Whether the GPUs `pod` holds, with those already released on its node, could hold one pod of
        single-pod `w` there (a cheap test before a trial)."""
        node = self.state.nodes.get(pod.node)
        if node is None or not self.placer.node_admits(node, w):
            return False
        return node.released + len(pod.gpu_indices) * pod.gpu_fraction + EPSILON >= w.gpus.count

    def _gpus_by_queue(self, index: dict[str, list[WorkloadView]]) -> dict[str, dict[str, float]]:
        """The GPUs of the victims reclaim could take at all (past their queue's minimum runtime for
        reclaim), by queue, then by node."""
        out: dict[str, dict[str, float]] = {}
        nodes: dict[str, float] = {}
        for name, victims in index.items():
            # A node's victims mostly come in runs of one queue: each run's GPUs are added up unboxed, in
            # the same order as adding each victim's to the queue's row.
            queue: str | None = None
            total = 0.0
            for v in victims:
                if not self._old_enough(v, "reclaim"):
                    continue
                if v.queue != queue:
                    if queue is not None:
                        nodes[name] = total
                    queue = v.queue
                    found = out.get(queue)
                    if found is None:
                        found = out[queue] = {}
                    nodes = found
                    total = nodes.get(name, 0.0)
                total += v.gpus.count
            if queue is not None:
                nodes[name] = total
        return out

    def _reclaimable(
        self, by_queue: dict[str, dict[str, float]], mine: frozenset[str], floor: str
    ) -> dict[str, float]:
        """Per node, an upper bound on the GPUs reclaim may free there for a reclaimer whose line is `mine`:
        from each queue, the GPUs of its victims there, but no more than its headroom (the least that any
        level of it outside that line holds above its `floor`, fair share or quota: what the budget lets
        reclaim take from it). Reclaimers under the same parents get the same answer (each is below its own
        fair share, so none of their own work is ever a victim). It is kept while reclaim runs: evictions only
        lower the victims' queues, and a gainer never ends above its own share (its parent may: then this
        misses what the next cycle finds)."""
        units: dict[str, float] = {}
        by_quota = floor == "quota"
        for queue, nodes in by_queue.items():
            room = self._headroom(queue, mine, floor)
            if room <= EPSILON:
                continue
            for name, gpus in nodes.items():
                # by quota, a queue above it may lose a whole job past its headroom (Budget)
                units[name] = units.get(name, 0.0) + (gpus if by_quota else min(gpus, room))
        return units

    def _surplus_elsewhere(self, queue: str) -> float:
        """GPUs the queues outside `queue`'s line hold above their fair share: the most reclaim could
        free for it (an upper bound). Each victim queue's part is kept, and recomputed only when work of
        its line was allocated or taken back; the line's own part is taken off the sum."""
        state = self.state
        surplus = self._surplus
        if self._surplus_seen < 0:
            for name in self._victim_queues():
                surplus[name] = max(0.0, state.allocated(name) - self.fair(name))
            self._surplus_total = sum(surplus.values(), 0.0)
            self._surplus_seen = len(state.accounted)
        elif self._surplus_seen < len(state.accounted):
            # Only the lines of queues whose work was allocated or taken back since have changed.
            for changed in state.accounted[self._surplus_seen :]:
                for name in state.chain(changed):
                    if name in surplus:
                        surplus[name] = max(0.0, state.allocated(name) - self.fair(name))
            self._surplus_total = sum(surplus.values(), 0.0)
            self._surplus_seen = len(state.accounted)
        return self._surplus_total - sum((surplus.get(name, 0.0) for name in state.chain(queue)), 0.0)

    def _victim_queues(self) -> list[str]:
        if self._victim_queue_names is None:
            self._victim_queue_names = sorted({v.queue for vs in self._victim_groups().values() for v in vs})
        return self._victim_queue_names

    def _headroom(self, queue: str, mine: frozenset[str], floor: str) -> float:
        """GPUs reclaim may take from `queue` for a reclaimer whose line is `mine`: the least that any
        level of `queue` outside that line holds above its `floor` (none if every level is shared)."""
        levels = [n for n in self.state.chain(queue) if n not in mine]
        if not levels:
            return float("-inf")
        return min(self.state.allocated(n) - self.reclaim_floor(n, floor) for n in levels)

    def _above_quota_elsewhere(self, queue: str) -> float:
        """An upper bound on what reclaim by quota could free for `queue`: all the GPUs of the victim
        queues outside its line that hold more than their quota (each may lose a whole job, and a job may
        be most of what it holds)."""
        line, state = set(self.state.chain(queue)), self.state
        return sum(
            (
                state.allocated(name)
                for name in self._victim_queues()
                if name not in line and state.allocated(name) > self.reclaim_floor(name, "quota") + EPSILON
            ),
            0.0,
        )

    # -- preempt --------------------------------------------------------------------------------------

    def preempt(self) -> None:
        lower: dict[tuple[str, int], tuple[dict[str, list[WorkloadView]], dict[str, float]]] = {}
        # (queue, priority, demand) for which stopping work within a limit found nothing this cycle: later
        # work alike is not searched again (evictions only take victims away; the next cycle tries again)
        limit_misses: set[tuple[str, int, tuple[float, float, float]]] = set()
        for group in self.pending_groups():
            for w in self.order[group]:
                limited = False  # held back by a queue limit: lower-priority work of its queue holds it
                if not self._wants_room(w):
                    if not self._held_by_limit(w):
                        continue
                    limited = True
                if self._lowest_victims().get(w.queue, w.priority) >= w.priority:
                    if group != GLOBAL:
                        break  # the rest of this queue is of no higher priority: none of it may preempt
                    continue
                if not limited and self._fits_after_release(w):
                    continue
                key = (w.queue, w.priority)
                found = lower.get(key)
                if found is None:
                    found = lower[key] = _below(self._queue_victims(w.queue), w.priority)
                if limited:
                    alike = (w.queue, w.priority, whole_demand(w))
                    if alike not in limit_misses and not self._preempt_within_limit(w, found[0]):
                        limit_misses.add(alike)
                else:
                    self._preempt_for(w, found[0], found[1])

    def _held_by_limit(self, w: WorkloadView) -> bool:
        if not self.still_unplaced(w):
            return False
        why = self.decisions.explanations.get(w.key)
        return why is not None and why.code == explain.QUEUE_LIMIT

    def _preempt_within_limit(self, w: WorkloadView, candidates: dict[str, list[WorkloadView]]) -> bool:
        """`w` waits for a limit of its queue (or of one above it) that lower-priority work of its own
        queue takes up: stop the first of that work, in victim order, that brings every such limit within
        reach of `w`, where `w` then has room once they have stopped (all or nothing, as preempt is). Work
        that alone asks for more than a limit waits for the limit to be raised. Whether it stopped any."""
        state = self.state
        wants = whole_demand(w)
        over = [0.0, 0.0, 0.0]  # by RESOURCES' position: how much must stop for `w` to be admitted
        limiting: list[str] = []
        for name, position, limit in self._limits(w.queue):
            if wants[position] > limit + EPSILON:
                return False
            excess = state.alloc[name][position] + wants[position] - limit
            if excess > over[position] + EPSILON:
                over[position] = excess
            if excess > EPSILON and name not in limiting:
                limiting.append(name)
        rule = _PreemptRule(self, w.priority)
        pool = [
            v
            for on_node in candidates.values()
            for v in on_node
            if v.id not in state.evicted and rule.allows(v)
        ]
        pool.sort(key=self._victim_key)
        chosen: list[WorkloadView] = []
        freed = [0.0, 0.0, 0.0]
        for v in pool:
            if _covered(freed, over):
                break
            gives = whole_demand(v)
            if any(gives[i] > 0 and freed[i] + EPSILON < over[i] for i in range(3)):
                chosen.append(v)
                for i in range(3):
                    freed[i] += gives[i]
        if not chosen or not _covered(freed, over) or not self._may_stop(w, chosen):
            return False
        checkpoint, generation = state.checkpoint(), state.generation
        for victim in chosen:
            state.evict(victim, "preempt")
        trial = state.checkpoint()
        placed = self.placer.place_gang(w, after_release=True) if self._admission(w) is None else None
        if placed is None:
            state.rollback(checkpoint)
            state.generation = generation
            return False
        kept = (
            f"queue {limiting[0]} within its limit"
            if len(limiting) == 1
            else f"queues {' and '.join(limiting)} within their limits"
        )

        def reason(v: WorkloadView) -> str:
            return (
                f"preempted by workload {w.id} (priority {w.priority} > {v.priority}), queue {w.queue}, "
                f"to keep {kept}"
            )

        self._keep_trial(w, chosen, "preempt", reason, (checkpoint, trial, generation), placed)
        return True

    def _preempt_for(
        self, w: WorkloadView, candidates: dict[str, list[WorkloadView]], units: dict[str, float]
    ) -> None:
        def reason(v: WorkloadView) -> str:
            return f"preempted by workload {w.id} (priority {w.priority} > {v.priority}), queue {w.queue}"

        self._evict_for(w, candidates, "preempt", reason, _PreemptRule(self, w.priority), units)

    def _lowest_victims(self) -> dict[str, int]:
        """Each queue's lowest victim priority (built once a cycle)."""
        if self._lowest is None:
            lowest: dict[str, int] = {}
            groups = self._victim_groups()
            if self._singles_whole:
                # The victims are all that `Prepared` grouped (each queue's lowest counted in its pass) and
                # this cycle's binds.
                for queue, row in self._sums.items():
                    if row.lowest is not None:
                        lowest[queue] = row.lowest
                _lower(lowest, self._bind_victims)
            else:
                for victims in groups.values():
                    _lower(lowest, victims)
            self._lowest = lowest
        return self._lowest

    def _queue_victims(self, queue: str) -> dict[str, list[WorkloadView]]:
        """One queue's victims (`_victim_groups`) by node, each node's list in victim order (built once a
        cycle per queue, from the victim index when reclaim built it, else sorting this queue's alone:
        the same lists; the search ranks nodes by its own measure, not by this order)."""
        found = self._by_queue.get(queue)
        if found is None:
            index = self._index
            source = index if index is not None else self._victim_groups()
            split = self._victims_split
            if split is not None and split[0] is source:
                found = split[1].get(queue, {})
            else:
                # The first queues asked are filtered out alone (a cycle mostly asks for one or two of a
                # few); past them, every queue's are split off at once (a large pool preempts for many).
                asked = self._filtered[1] if self._filtered[0] is source else 0
                if asked < MAX_FILTERED:
                    self._filtered = (source, asked + 1)
                    found = _of_queue(source, queue)
                else:
                    split = self._victims_split = (source, _split_by_queue(source))
                    found = split[1].get(queue, {})
            self._by_queue[queue] = found
            if index is None:  # the groups are in no victim order: this queue's lists alone are sorted
                for name, on_node in found.items():
                    if len(on_node) > 1:
                        self._sort_victims(queue, name, on_node)
        return found

    # -- consolidate ----------------------------------------------------------------------------------

    def consolidate(self) -> None:
        groups = self.pending_groups()
        if not any(e.code == explain.FRAGMENTED for e in self.decisions.explanations.values()):
            return  # nothing waits on fragmentation: the walk below would find nothing
        tries = 0
        for group in groups:
            for w in self.order[group]:
                if not self.still_unplaced(w):
                    continue
                explanation = self.decisions.explanations.get(w.key)
                if explanation is None or explanation.code != explain.FRAGMENTED:
                    continue
                tries += 1
                if tries > MAX_CONSOLIDATION_TRIES:
                    return
                self._consolidate_for(w)

    def _consolidate_for(self, w: WorkloadView) -> bool:
        if self._stop_limit is not None and not self._may_search(w):
            return False
        state = self.state
        saved = state.reservation
        if saved is not None and saved.workload_id == w.id:
            state.reservation = None  # w's own reservation must not keep the moved work from its new homes
        if self._consolidate(w):
            return True
        state.reservation = saved
        return False

    def _consolidate(self, w: WorkloadView) -> bool:
        state = self.state
        checkpoint, generation = state.checkpoint(), state.generation
        need = int(w.gpus.count)
        moved: list[WorkloadView] = []
        targets = sorted(
            (n for n in state.nodes.values() if n.schedulable and 0 < n.whole < need and n.model != ""),
            key=lambda n: (-n.whole, n.name),
        )[: MAX_CONSOLIDATION_TARGETS * w.nodes]
        ready = 0
        for node in targets:
            if ready >= w.nodes and self._fits_tentatively(w):
                break
            movable = sorted(
                (v for v in self.by_node.get(node.name, []) if v.nodes == 1 and self._movable(v)),
                key=lambda v: (v.gpu_units, v.id),
            )
            for v in movable:
                if len(moved) >= self.config.max_consolidation_moves:
                    break
                state.evict(v, "consolidate")
                moved.append(v)
                if sum(node.free[i] + node.held[i] >= 1 - EPSILON for i in range(len(node.free))) >= need:
                    ready += 1
                    break
        trial = state.checkpoint()
        placed = self.placer.place_gang(w, after_release=True)
        if placed is not None:
            state.rollback(trial)
        if placed is None or not moved or len(moved) > self.config.max_consolidation_moves:
            state.rollback(checkpoint)
            state.generation = generation
            return False
        # Keep the gang's room, then every moved workload must find a new home this cycle, or nothing moves.
        placed = self.placer.place_gang(w, after_release=True)
        assert placed is not None  # as just before, on the same state
        for v in moved:
            if self.placer.place_gang(v) is None:
                state.rollback(checkpoint)
                state.generation = generation
                return False
        if not self._may_stop(w, moved):
            state.rollback(checkpoint)
            state.generation = generation
            return False
        self._count_stopped(moved)
        for v in moved:
            why = f"moved to make room for workload {w.id} ({w.nodes} x {explain.gpu_text(w)})"
            self.decisions.evictions.append(Eviction(v.id, "consolidate", why, w.id))
        self._waiting(w, [v.id for v in moved], placed)
        return True


class _ReclaimRule(VictimRule):
    """Reclaim takes work of queues outside the reclaimer's line (`mine`), past their minimum runtime for
    reclaim, while its queue has headroom above `floor` (see Cycle._headroom): by fair share, as much as
    the victim holds; by quota, any (Budget: a job that borrows is borrowed whole)."""

    def __init__(self, cycle: Cycle, mine: frozenset[str], floor: str) -> None:
        self.cycle = cycle
        self.mine = mine
        self.floor = floor
        self.by_quota = floor == "quota"
        self.headroom: dict[str, float] = {}

    def allows(self, v: WorkloadView) -> bool:
        if v.queue in self.mine or not self.cycle._old_enough(v, "reclaim"):
            return False
        room = self.headroom.get(v.queue)
        if room is None:
            room = self.headroom[v.queue] = self.cycle._headroom(v.queue, self.mine, self.floor)
        return room > EPSILON if self.by_quota else room >= v.gpu_units - EPSILON


class _PreemptRule(VictimRule):
    """Preempt takes work of lower priority than the taker's, past its queue's minimum runtime for it."""

    def __init__(self, cycle: Cycle, priority: int) -> None:
        self.cycle = cycle
        self.priority = priority

    def allows(self, v: WorkloadView) -> bool:
        return v.priority < self.priority and self.cycle._old_enough(v, "preempt")


def _covered(freed: list[float], over: list[float]) -> bool:
    return all(freed[i] + EPSILON >= over[i] for i in range(3))


def _lower(lowest: dict[str, int], victims: list[WorkloadView]) -> None:
    """Lower each queue's entry in `lowest` to the priority of any of its `victims` below it."""
    for v in victims:
        low = lowest.get(v.queue)
        if low is None or v.priority < low:
            lowest[v.queue] = v.priority


def _of_queue(by_node: dict[str, list[WorkloadView]], queue: str) -> dict[str, list[WorkloadView]]:
    """`queue`'s victims of `by_node`, by node, in its order: `_split_by_queue(by_node).get(queue, {})`."""
    mine: dict[str, list[WorkloadView]] = {}
    for name, victims in by_node.items():
        on_node: list[WorkloadView] | None = None
        for v in victims:
            if v.queue == queue:
                if on_node is None:
                    on_node = mine[name] = []
                on_node.append(v)
    return mine


def _split_by_queue(by_node: dict[str, list[WorkloadView]]) -> dict[str, dict[str, list[WorkloadView]]]:
    """Victims by node split into each queue's, by node, in one walk: each queue's nodes and each node's
    list in the order of `by_node`, as filtering `by_node` for one queue at a time gives them."""
    split: dict[str, dict[str, list[WorkloadView]]] = {}
    for name, victims in by_node.items():
        last: str | None = None  # the queue of the victim before on this node, and its list here
        on_node: list[WorkloadView] = []
        for v in victims:
            queue = v.queue
            if queue is not last:
                mine = split.get(queue)
                if mine is None:
                    mine = split[queue] = {}
                found = mine.get(name)
                if found is None:
                    found = mine[name] = []
                on_node, last = found, queue
            on_node.append(v)
    return split


def _below(
    by_node: dict[str, list[WorkloadView]], priority: int
) -> tuple[dict[str, list[WorkloadView]], dict[str, float]]:
    """A queue's victims of lower priority than `priority`, by node (keeping their order), and their GPUs
    per node: all that preempt may take there for work of that priority."""
    victims: dict[str, list[WorkloadView]] = {}
    units: dict[str, float] = {}
    for name, candidates in by_node.items():
        low = [v for v in candidates if v.priority < priority]
        if low:
            victims[name] = low
            units[name] = sum((v.gpus.count for v in low), 0.0)
    return victims, units
