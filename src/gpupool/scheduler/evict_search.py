"""Making room for one pending workload by evicting running work: which nodes, which victims, at what
cost (the phase above `Victims`; reclaim, preempt and consolidation all search through it)."""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Iterator
from typing import Final

from gpupool.scheduler import explain
from gpupool.scheduler.ordering import INFINITY
from gpupool.scheduler.placement import families
from gpupool.scheduler.prepare import AbleNode, Prepared
from gpupool.scheduler.snapshot import Eviction, PodPlacement, WorkloadView
from gpupool.scheduler.state import EPSILON, MIXED, NodeState
from gpupool.scheduler.victims import Victims

# An eviction search examines nodes likeliest first; it gives up after SEARCH_LIMIT nodes with no choice,
# and settles SEARCH_LIMIT_AFTER_PICK nodes after its first choice.
SEARCH_LIMIT: Final = 128
SEARCH_LIMIT_AFTER_PICK: Final = 16
SMALL_SEARCH: Final = 64  # a search ranks up to this many candidate nodes outright


class VictimRule:
    """Which running work a search may take as a victim for its taker (reclaim's and preempt's rules:
    cycle.py). A class rather than a function: the compiled search calls its method directly."""

    def allows(self, v: WorkloadView) -> bool:
        raise NotImplementedError


class EvictionSearch(Victims):
    """For one pending workload: the cheapest set of victims that makes room for it, and the evictions."""

    def _fits_after_release(self, w: WorkloadView) -> bool:
        """If `w` fits once stopping work is gone, take that room for it (so no one else counts it)."""
        state = self.state
        if not state.holding_nodes or w.gpu_units > state.free_total + state.held_total + EPSILON:
            return False
        key = self._shape(w)
        stamp = (state.generation, state.held_generation)
        if self._no_release_fit.get(key) == stamp:
            return False
        placed = self.placer.place_gang(w, after_release=True)
        if placed is None:
            self._no_release_fit[key] = stamp
            return False
        self._waiting(w, [], placed)
        return True

    def _evict_for(
        self,
        w: WorkloadView,
        candidates: dict[str, list[WorkloadView]],
        code: str,
        reason: Callable[[WorkloadView], str],
        rule: VictimRule,
        units: dict[str, float],
        budget: Budget | None = None,
    ) -> bool:
        """Evict the fewest, cheapest victims that let `w` fit; all or nothing. `units`: an upper bound,
        per node, on the GPUs the taker's victims there hold.

        `candidates`: possible victims by node, each list in victim order (fewest GPUs, lowest priority,
        least work lost, newest); gangs are not among them."""
        if self._stop_limit is not None and not self._may_search(w):
            return False
        state = self.state
        # Whose victims a search may take: for preempt the lower-priority work of w's own queue; for
        # reclaim, what queues outside w's line hold above their fair share. Every reclaimer is below its
        # own fair share, so reclaimers under the same parents may take the very same victims and share
        # their misses.
        who: object = (w.queue, w.priority)
        if code == "reclaim":
            who = (budget.floor if budget is not None else "", state.chain(w.queue)[1:])
        key = (code, who, self._shape(w))
        # A search that found nothing stays a miss for the rest of the cycle unless capacity is given
        # back: other evictions only take victims away (their gainers take the GPUs they free). What
        # this might miss, the next cycle finds.
        stamp = (state.generation, 0)
        if self._no_victims.get(key) == stamp:
            return False
        # Needing more of the same GPUs can only be harder: a single pod's miss covers any larger pod, and
        # any gang of them (one of its pods would need victims that a single pod could have had).
        family = (code, who, w.gpus.models, w.gpus.min_memory_bytes, w.node_names, self._shape(w)[-2])
        smallest = self._smallest_miss.get(family)
        if smallest is not None and smallest[0] == stamp and w.gpus.count >= smallest[1]:
            return False
        if self._evict_by_nodes(w, candidates, code, reason, rule, key, stamp, budget, units):
            return True
        single = w.nodes == 1 and not (w.topology or w.topology_preferred)
        if single and (smallest is None or smallest[0] != stamp or w.gpus.count < smallest[1]):
            self._smallest_miss[family] = (stamp, w.gpus.count)
        return False

    def _evict_by_nodes(
        self,
        w: WorkloadView,
        candidates: dict[str, list[WorkloadView]],
        code: str,
        reason: Callable[[WorkloadView], str],
        rule: VictimRule,
        key: tuple[object, ...],
        stamp: tuple[int, int],
        budget: Budget | None,
        units: dict[str, float],
    ) -> bool:
        """Per node, the cheapest victims there that make room for one pod, counted without touching the
        state; then the cheapest `w.nodes` nodes (inside one topology domain when required). `units`:
        an upper bound, per node, on the GPUs the candidates there hold.

        Nodes are examined in order of a lower bound on the GPUs that must be freed there (nodes with
        more room first), and the search stops once a choice is found and either no later node can be
        cheaper in GPUs or SEARCH_LIMIT_AFTER_PICK more nodes were examined."""
        state = self.state
        able: dict[str, AbleNode] | None = None
        if not w.gpus.is_fractional and w.gpus.count >= 1:
            able = self._able(candidates, units, w.gpus.count)
        options: dict[str, tuple[tuple[float, ...], list[WorkloadView]]] = {}
        picked: list[str] | None = None
        worst = 0.0  # most GPUs disrupted on one node of the current pick
        since_pick = misses = 0
        whole_pod, need = not w.gpus.is_fractional, w.gpus.count
        # one pod placed by its cost alone (not by domain): a node that cannot beat the pick is not weighed
        alone = w.nodes == 1 and not (w.topology or w.topology_preferred) and need >= 1 and need == int(need)
        for bound, node in self._search_order(w, candidates, able, units):
            if picked is not None:
                since_pick += 1  # counted from the first feasible pick: later ones only refine it
                if bound > worst + EPSILON or since_pick > SEARCH_LIMIT_AFTER_PICK:
                    break
            else:
                misses += 1
                if misses > SEARCH_LIMIT:
                    break  # bounded effort: the likeliest nodes came first
            if w.gpus.count > 0 and not any(self.placer.matches(node, w.gpus)):
                continue
            if not self.placer.node_admits(node, w):
                continue
            if whole_pod and node.released + units.get(node.name, 0.0) + EPSILON < need:
                continue  # even every victim there would not make room
            if able is None:
                pool = candidates.get(node.name, ())
            else:
                entry = able.get(node.name)
                pool = entry[2] if entry is not None else ()
            victims = [v for v in pool if v.id not in state.evicted and rule.allows(v)]
            if not victims and able is not None:
                # Later searches of the same taker skip the node: victims only go, minimum runtimes are
                # the cycle's, and headroom shrinks as reclaim evicts (a parent queue that the gainers'
                # binds lift above its share is the exception; what that misses, the next cycle finds).
                able.pop(node.name, None)
            if not victims and w.nodes == 1:
                continue  # a single pod fitting with no victims would have fitted after release already
            if whole_pod and node.released + sum((v.gpus.count for v in victims), 0.0) + EPSILON < need:
                continue
            if (
                alone
                and picked is not None
                and self._cannot_beat(node, need, victims, options[picked[0]][0], picked[0])
            ):
                continue
            chosen = self._cheapest_room(node, w, victims, budget)
            if chosen is None:
                continue
            cost = self._cost(chosen)
            options[node.name] = (cost, chosen)
            if w.nodes == 1 and not (w.topology or w.topology_preferred):
                if picked is None or (cost, node.name) < (options[picked[0]][0], picked[0]):
                    picked, worst = [node.name], cost[0]
            elif len(options) >= w.nodes:
                again = self._pick_nodes(w, options)
                if again is not None:
                    picked = again
                    worst = max(options[name][0][0] for name in picked)
        if picked is None or not any(options[name][1] for name in picked):
            self._no_victims[key] = stamp
            return False
        victims = [v for name in picked for v in options[name][1]]
        if (budget is not None and not budget.admits(victims)) or not self._may_stop(w, victims):
            self._no_victims[key] = stamp
            return False
        checkpoint, generation = state.checkpoint(), state.generation
        for victim in victims:
            state.evict(victim, code)
        trial = state.checkpoint()
        placed = self.placer.place_gang(w, after_release=True)
        if placed is None:
            state.rollback(checkpoint)
            state.generation = generation
            self._no_victims[key] = stamp
            return False
        self._keep_trial(w, victims, code, reason, (checkpoint, trial, generation), placed)
        return True

    def _keep_trial(
        self,
        w: WorkloadView,
        victims: list[WorkloadView],
        code: str,
        reason: Callable[[WorkloadView], str],
        undo: tuple[int, int, int],
        placed: tuple[PodPlacement, ...],
    ) -> None:
        """Keep a trial that evicted `victims` and then placed `w` after release (`placed`). `undo`: the
        state's checkpoint before the evictions, its checkpoint before the placement, and its generation
        before both: the trial is undone to them when a bind of this cycle is among the victims, since such
        a bind is taken back (its room free at once), not evicted."""
        if not any(victim.id in self._tentative for victim in victims):
            # The trial is the outcome: the same evictions and the same room after release that doing it
            # again would give.
            self._waits_for(w, victims, code, reason, placed)
            return
        state = self.state
        checkpoint, trial, generation = undo
        state.rollback(trial)
        state.rollback(checkpoint)
        state.generation = generation
        evicted: list[int] = []
        taken_back: list[WorkloadView] = []
        for victim in victims:
            if victim.id in self._tentative:
                taken_back.append(self._retract(victim))
            else:
                self._evict(victim, code, reason(victim), w.id)
                self._count_stopped([victim])
                evicted.append(victim.id)
        if state.reservation is not None and state.reservation.workload_id == w.id:
            state.reservation = None
        now = None if evicted else self.placer.place_gang(w)
        if now is not None:  # only binds of this cycle gave way: nothing to wait for
            self._bind(w, now)
        else:
            later = self.placer.place_gang(w, after_release=True)
            assert later is not None
            self._waiting(w, evicted, later)
        # Work whose bind was taken back is tried again at once, as the next cycle's allocate would try
        # it: it may fit elsewhere; if not, its reason is the one that cycle would give.
        for original in taken_back:
            self._try_allocate(original)

    def _try_allocate(self, w: WorkloadView, place: int = -1, *, reserve: bool = True) -> bool:
        """Place `w` now, or explain why not (the allocate action's, `Allocation._try_allocate`)."""
        raise NotImplementedError

    # -- work stopping at once (SchedulerConfig.max_stopping_gpus) --------------------------------------

    def _stopping_gpus(self) -> float:
        """GPUs held by work stopped for waiting work: stopping in the snapshot for a workload it names
        (`evicted_for`: stopped by preempt, reclaim or consolidate, or promised) and stopped by this cycle."""
        if self._stopping_before < 0:
            self._stopping_before = sum(
                (v.gpu_units for v in self.snapshot.running if v.stopping and v.evicted_for is not None), 0.0
            )
        return self._stopping_before + self._stopped_now

    def _may_search(self, w: WorkloadView) -> bool:
        """Whether room may still be made for `w` by stopping work: not once the work stopping for waiting
        work holds `max_stopping_gpus` (then `w` is told so, and no search is made)."""
        limit = self._stop_limit
        if limit is None:
            return True
        stopping = self._stopping_gpus()
        if stopping <= 0 or stopping < limit - EPSILON:
            return True
        self.decisions.explanations[w.key] = explain.stopping_limit(limit, stopping, 0.0)
        return False

    def _may_stop(self, w: WorkloadView, victims: list[WorkloadView]) -> bool:
        """Whether stopping `victims` for `w` keeps the work stopping at once within `max_stopping_gpus`
        (this cycle's binds among them are taken back, not stopped); always while nothing is stopping, so
        work larger than the limit still gets its room. If not, `w` is told so."""
        limit = self._stop_limit
        if limit is None:
            return True
        wanted = sum((v.gpu_units for v in victims if v.id not in self._tentative), 0.0)
        stopping = self._stopping_gpus()
        if wanted <= 0 or stopping <= 0 or stopping + wanted <= limit + EPSILON:
            return True
        self.decisions.explanations[w.key] = explain.stopping_limit(limit, stopping, wanted)
        return False

    def _count_stopped(self, victims: list[WorkloadView]) -> None:
        """Count `victims`, just stopped for waiting work, against `max_stopping_gpus`."""
        if self._stop_limit is not None:
            self._stopped_now += sum((v.gpu_units for v in victims), 0.0)

    def _waits_for(
        self,
        w: WorkloadView,
        victims: list[WorkloadView],
        code: str,
        reason: Callable[[WorkloadView], str],
        placed: tuple[PodPlacement, ...],
    ) -> None:
        """Keep a trial that evicted `victims` and placed `w` after release (`placed`): the evictions are
        decided and `w` waits for their GPUs."""
        for victim in victims:
            self.decisions.evictions.append(Eviction(victim.id, code, reason(victim), w.id))
        self._count_stopped(victims)
        state = self.state
        if state.reservation is not None and state.reservation.workload_id == w.id:
            state.reservation = None
        self._waiting(w, [v.id for v in victims], placed)

    def _waiting(self, w: WorkloadView, evicted: list[int], placed: tuple[PodPlacement, ...]) -> None:
        """`w` waits for GPUs being released, its room once they are being `placed`: those of `evicted`
        (just now, for it), and of work stopping for it since an earlier cycle."""
        self.decisions.explanations[w.key] = explain.waiting_for_release(
            w, [*self._stopping_for.get(w.id, ()), *evicted]
        )
        del self.unplaced[w.key]
        self.decisions.nominated[w.id] = placed
        if self._snapshot_stopping or self._ownerless:  # work stopping, or evicted this cycle for no one
            self._promise(w, placed)

    def _promise(self, w: WorkloadView, placed: tuple[PodPlacement, ...]) -> None:
        """Promise `w` the GPUs of stopping work that its room `placed` takes, where that work stops for no
        pending workload (`Decisions.released_to`; the first promise of a cycle stands): work stopping in
        the snapshot, or evicted this cycle for no one (a stale gang). Kept as the stopping work's
        `evicted_for`, it lets the next cycle serve `w` first: otherwise work that comes earlier in that
        cycle's order could take the room (a gainer of other work, served first, taking the free GPUs the
        room also needs), and `w` would evict other work for room again."""
        stopping_on = self._stopping_on
        if stopping_on is None or self._stopping_seen != self._ownerless:
            ownerless = {e.workload_id for e in self.decisions.evictions if e.for_workload is None}
            stopping_on = self._stopping_on = {}
            self._stopping_seen = self._ownerless
            for v in self.snapshot.running:
                if v.stopping or v.id in ownerless:
                    for pod in v.placement:
                        on_node = stopping_on.get(pod.node)
                        if on_node is None:
                            stopping_on[pod.node] = [(v, pod)]
                        else:
                            on_node.append((v, pod))
        released_to = self.decisions.released_to
        pending = self._pending_by_id
        for pod in placed:
            for v, held in stopping_on.get(pod.node, ()):
                if v.id in released_to or (v.evicted_for is not None and v.evicted_for in pending):
                    continue  # promised already, or its GPUs are another (or `w`'s) gainer's room
                if any(index in pod.gpu_indices for index in held.gpu_indices):
                    released_to[v.id] = w.id

    def _retract(self, v: WorkloadView) -> WorkloadView:
        """Take back this cycle's bind of `v` (it never started): its room goes to the gainer at once, and
        `v` is pending again (its pending view, returned). Cheaper than starting it now and evicting it
        next cycle."""
        original = self._tentative[v.id]
        self._taken_back += 1
        self.state.release(original, v.placement)
        binds = self.decisions.binds
        for i in range(len(binds) - 1, -1, -1):
            if binds[i].workload_id == v.id:
                del binds[i]
                break
        self.unplaced[v.id] = original
        return original

    def _able(
        self, candidates: dict[str, list[WorkloadView]], units: dict[str, float], need: float
    ) -> dict[str, AbleNode]:
        """The candidate nodes with victims where `need` whole GPUs could be freed at all: GPUs free or
        released there plus the victims' GPUs (`units`, an upper bound). A node with room but no victims
        is left out: a single pod would have fitted there after release already, and a gang's search
        walks the nodes with room first anyway. Kept for the cycle: evictions only move victims' GPUs to
        released, so a node left out stays out until capacity is given back on it (state.freed), when
        it is looked at again; a node in it that no longer qualifies is skipped by the search."""
        key = (id(candidates), id(units), need)
        found = self._able_cache.get(key)
        freed = self.state.freed
        if found is None:
            base, fewest_first = self._able_base(candidates, units)
            # From `cut` on, the victims alone could free enough; before it, a node qualifies only with
            # GPUs free or released there already (few nodes have any by now).
            cut = bisect.bisect_left(fewest_first, need, key=_able_gpus)
            able: dict[str, AbleNode]
            if cut * 2 <= len(fewest_first):
                able = dict(base)
                for entry in fewest_first[:cut]:
                    if entry[0].released + entry[1] + EPSILON < need:
                        del able[entry[0].name]
            else:
                able = {entry[0].name: entry for entry in fewest_first[cut:]}
                for name in self.state.releasing():
                    there = base.get(name)
                    if there is not None and there[0].released + there[1] + EPSILON >= need:
                        able[name] = there
            found = self._able_cache[key] = (able, len(freed), (candidates, units))
        elif found[1] < len(freed):
            able = found[0]
            base = self._able_base(candidates, units)[0]
            for name in freed[found[1] :]:
                again = base.get(name)
                if again is not None and name not in able and again[0].released + again[1] + EPSILON >= need:
                    able[name] = again
            found = self._able_cache[key] = (able, len(freed), found[2])
        return found[0]

    def _able_base(
        self, candidates: dict[str, list[WorkloadView]], units: dict[str, float]
    ) -> tuple[dict[str, AbleNode], list[AbleNode]]:
        """The nodes of `units` with victims and GPUs to free, with both, by name and fewest GPUs first:
        what `_able` filters by the GPUs needed and released there (built once per pair of dicts;
        neither changes in a cycle)."""
        key = (id(candidates), id(units))
        found = self._able_bases.get(key)
        if found is None:
            nodes = self.state.nodes
            base: dict[str, AbleNode] = {}
            for name, gpus in units.items():
                node = nodes.get(name)
                victims = candidates.get(name)
                if node is not None and gpus > 0.0 and victims:
                    base[name] = (node, gpus, victims)
            fewest_first = sorted(base.values(), key=operator.itemgetter(1))
            found = self._able_bases[key] = (base, fewest_first, (candidates, units))
        return found[0], found[1]

    def _search_order(
        self,
        w: WorkloadView,
        candidates: dict[str, list[WorkloadView]],
        able: dict[str, AbleNode] | None,
        units: dict[str, float],
    ) -> Iterator[tuple[float, NodeState]]:
        """Nodes where room for one pod of `w` might be made (those of `able` when given, else of
        `candidates`), each with a lower bound on the GPUs that must be freed there, bounds never
        decreasing: first, for a gang, nodes that already have room; then nodes with candidate victims
        (those holding released GPUs first)."""
        state = self.state
        need = w.gpus.count if not w.gpus.is_fractional else 0.0
        seen: set[str] = set()
        if w.nodes > 1:
            for node in self._nodes_with_room(w):
                seen.add(node.name)
                yield 0.0, node
        among: dict[str, AbleNode] | dict[str, list[WorkloadView]] = candidates if able is None else able
        if len(among) <= SMALL_SEARCH or len(among) * 8 <= len(state.nodes):
            ranked: list[tuple[float, str, NodeState]] = []
            if able is not None:
                for found, gpus, _ in able.values():
                    if not found.schedulable or found.name in seen:
                        continue
                    bound = max(0.0, need - found.released)
                    if bound <= gpus + EPSILON:  # its victims could make the room
                        ranked.append((bound, found.name, found))
            else:
                for name in candidates:
                    there = state.nodes.get(name)
                    if there is None or not there.schedulable or name in seen:
                        continue
                    bound = max(0.0, need - there.released)
                    if bound <= units.get(name, 0.0) + EPSILON:
                        ranked.append((bound, name, there))
            # Names are unique, so nodes are never compared. Sorted whole, though the search often stops
            # early: a list's sort compares these tuples' floats and names in C, where a heap's every
            # comparison goes through the interpreter's generic one (several times the cost here).
            ranked.sort()
            for bound, _, node in ranked:
                yield bound, node
            return
        # The state does not change while a search runs, so its buckets are walked as they are.
        for count, names, holding in self._levels(w):
            bound = max(0.0, need - count)
            for name in names:
                if name in among and name not in seen:
                    node = state.nodes[name]
                    if node.holding == holding:  # a holding node is ranked by its GPUs once released
                        yield bound, node

    def _nodes_with_room(self, w: WorkloadView) -> Iterator[NodeState]:
        """Nodes where one pod of `w` has enough whole GPUs now or once stopping work is gone."""
        state = self.state
        need = w.gpus.count if not w.gpus.is_fractional else 0.0
        for count, names, holding in self._levels(w):
            if count + EPSILON < need:
                break
            for name in names:
                node = state.nodes[name]
                if node.holding == holding:
                    yield node

    def _levels(self, w: WorkloadView) -> list[tuple[int, dict[str, None], bool]]:
        """Schedulable nodes whose GPU family suits `w` in groups of equal room, the most room first:
        (whole GPUs, names, holding). Holding nodes count the GPUs they will have once released (they
        are also in the free-GPU buckets; a walker takes each node from its own kind of group only)."""
        wanted = families(w.gpus)
        levels: list[tuple[int, dict[str, None], bool]] = []
        for model, by_count in self.state.buckets.items():
            if wanted and model not in wanted and model != MIXED:
                continue
            levels.extend((count, names, False) for count, names in by_count.items() if names)
        levels.extend((count, names, True) for count, names in self.state.holding_by_count.items() if names)
        levels.sort(key=lambda item: (-item[0], item[2]))
        return levels

    def _cannot_beat(
        self,
        node: NodeState,
        need: float,
        victims: list[WorkloadView],
        best: tuple[float, ...],
        best_node: str,
    ) -> bool:
        """Whether no victims `_cheapest_room` could choose on `node` (among `victims`) for one pod of `need`
        whole GPUs cost less than `best`, the pick's cost on `best_node` (ties go to the first name).

        Exact, from a floor under every choice's `_cost`, compared as costs are. Where each victim holds
        whole GPUs of its own, each GPU a choice releases is one it counts, so it counts at least the GPUs
        missing there (`need` less those whole once released), and at least the smallest victim's: the
        floor's GPUs are the larger of the two. A choice that counts just that many holds only victims
        that count no more, so its highest priority is at least the lowest among those, and with that
        priority, it loses at least the least that such a victim loses (none loses less than nothing);
        and it holds at least one victim. A choice that counts more GPUs is above the floor anyway."""
        missing = need - node.released
        if missing <= 0.0:
            return False  # room may need no victim at all
        smallest = INFINITY
        for v in victims:
            pod = v.placement[0]
            if pod.gpu_fraction != 1.0 or float(len(pod.gpu_indices)) != v.gpu_units:
                return False  # a fraction released may complete a GPU that it does not count
            if v.gpu_units < smallest:
                smallest = v.gpu_units
        gpus = max(missing, smallest)
        # the lowest priority of a victim counting no more than `gpus` (the smallest does), and the least
        # work lost by such a victim of that priority
        lowest = least = INFINITY
        for v in victims:
            if v.gpu_units > gpus:
                continue
            lost = self._lost(v)
            if not lost >= 0.0:
                return False
            priority = float(v.priority)
            if priority < lowest:
                lowest, least = priority, lost
            elif priority == lowest and lost < least:
                least = lost
        floor = (gpus, lowest, least, 1.0)
        return floor > best or (floor == best and node.name > best_node)

    def _cost(self, victims: list[WorkloadView]) -> tuple[float, ...]:
        """Fewest GPUs disrupted, then lowest priority, then least work lost, then fewest workloads."""
        if not victims:
            return (0.0, float("-inf"), 0.0, 0.0)
        return (
            sum((v.gpu_units for v in victims), 0.0),
            float(max(v.priority for v in victims)),
            sum((self._lost(v) for v in victims), 0.0),
            float(len(victims)),
        )

    def _pick_nodes(
        self, w: WorkloadView, options: dict[str, tuple[tuple[float, ...], list[WorkloadView]]]
    ) -> list[str] | None:
        def cheapest(names: list[str]) -> tuple[tuple[float, ...], list[str]] | None:
            if len(names) < w.nodes:
                return None
            ranked = sorted(names, key=lambda n: (options[n][0], n))[: w.nodes]
            costs = [options[n][0] for n in ranked]
            total = tuple(
                sum((c[i] for c in costs), 0.0) if i != 1 else max(c[1] for c in costs) for i in range(4)
            )
            return total, ranked

        label = w.topology or w.topology_preferred
        if label is not None:
            best: tuple[tuple[float, ...], list[str]] | None = None
            domains: dict[str, list[str]] = {}
            for name in options:
                value = self.state.nodes[name].labels.get(label)
                if value is not None:
                    domains.setdefault(value, []).append(name)
            for value in sorted(domains):
                found = cheapest(domains[value])
                if found is not None and (best is None or found[0] < best[0]):
                    best = found
            if best is not None or w.topology is not None:
                return None if best is None else best[1]
        found = cheapest(list(options))
        return None if found is None else found[1]

    def _cheapest_room(
        self,
        node: NodeState,
        w: WorkloadView,
        victims: list[WorkloadView],
        budget: Budget | None = None,
    ) -> list[WorkloadView] | None:
        """The shortest prefix of `victims` (in victim order) whose GPUs, CPUs and memory make room for `w`
        on `node`, without the ones it turns out not to need; where a budget stops the prefix short, the
        first victim that makes room alone."""
        suits = self.placer.matches(node, w.gpus)
        base = [node.free[i] + node.held[i] for i in range(len(node.free))]
        # what the victims must release beyond what is free or held there already (<= 0: nothing)
        cpus = w.cpus - (node.cpus_free + node.cpus_held)
        memory = w.memory_bytes - (node.memory_free + node.memory_held)

        need = w.gpus.count
        if _makes_room(node, need, suits, base, cpus, memory, []):
            return []
        chosen: list[WorkloadView] = []
        taken: dict[str, Taken] = {}
        for v in victims:
            if budget is not None and not budget.take(taken, v):
                continue
            chosen.append(v)
            if _makes_room(node, need, suits, base, cpus, memory, chosen):
                break
        else:
            if budget is None:
                return None  # every victim together does not make room: no subset does
            # The budget went on smaller victims that do not make room; a larger one alone may.
            for v in victims:
                if _makes_room(node, need, suits, base, cpus, memory, [v]) and budget.admits([v]):
                    return [v]
            return None
        for v in sorted(chosen, key=lambda v: (-v.gpu_units, v.id)):
            trial = [c for c in chosen if c.id != v.id]
            if trial and _makes_room(node, need, suits, base, cpus, memory, trial):
                chosen = trial
        return chosen

    def _fits_tentatively(self, w: WorkloadView) -> bool:
        """Would `w` fit after release? The state is left exactly as it was."""
        checkpoint, generation = self.state.checkpoint(), self.state.generation
        fits = self.placer.place_gang(w, after_release=True) is not None
        self.state.rollback(checkpoint)
        self.state.generation = generation
        return fits


def _releases(cpus: float, memory: float, chosen: list[WorkloadView]) -> bool:
    """Whether `chosen` (single-pod work on one node) release at least `cpus` CPUs and `memory` bytes."""
    if cpus > EPSILON and sum((v.cpus for v in chosen), 0.0) + EPSILON < cpus:
        return False
    return memory <= 0 or sum((v.memory_bytes for v in chosen), 0) >= memory


def _makes_room(
    node: NodeState,
    count: float,
    suits: tuple[bool, ...],
    base: list[float],
    cpus: float,
    memory: float,
    chosen: list[WorkloadView],
) -> bool:
    """Whether stopping `chosen` leaves room on `node` for a pod of `count` GPUs (`suits`, `base`: see
    `_room_fits`) that needs `cpus` and `memory` beyond what is free or held there (see `_releases`)."""
    return _room_fits(node, count, suits, base, chosen) and _releases(cpus, memory, chosen)


def _room_fits(
    node: NodeState, count: float, suits: tuple[bool, ...], base: list[float], chosen: list[WorkloadView]
) -> bool:
    """Whether a pod of `count` GPUs (suitable ones, `suits`) fits on `node` once `chosen` (single-pod work
    there) is gone, its GPUs' free and held fractions being `base` now. (Plain loops: this is asked for
    every prefix an eviction search tries.)"""
    avail = list(base)
    position = node.position
    for v in chosen:
        pod = v.placement[0]
        for index in pod.gpu_indices:
            pos = position.get(index)
            if pos is not None:
                avail[pos] += pod.gpu_fraction
    if count <= 0:
        return True
    if count < 1:  # a fraction of one GPU
        return any(suits[i] and avail[i] + EPSILON >= count for i in range(len(avail)))
    whole = 0
    for i in range(len(avail)):
        if suits[i] and avail[i] >= 1 - EPSILON:
            whole += 1
    return whole >= count


def _able_gpus(entry: AbleNode) -> float:
    """What a node's victims could free, plus the tolerance `_able` compares with."""
    return entry[1] + EPSILON


# Per level of a victim queue: the GPUs a search has taken there so far, and its largest victim's.
Taken = tuple[float, float]


class Budget:
    """What reclaim may take from the queues outside a reclaimer's line, in total.

    By fair share, every level of them keeps at least its fair share. By quota, a level may be taken from
    while it is above its quota before each victim goes (KAI-Scheduler's rule): a job that holds borrowed
    GPUs is borrowed whole, so a quota is a guarantee even where the lender's borrowed GPUs are part of
    one larger job; the lender ends below its quota by less than one job. Victims are checked as if the
    largest went last (whatever order they are taken in), so a set is admitted whenever some order is."""

    def __init__(self, cycle: Prepared, queue: str, floor: str = "fair share") -> None:
        self.cycle = cycle
        self.mine = frozenset(cycle.state.chain(queue))
        self.floor = floor
        self.by_quota = floor == "quota"

    def take(self, taken: dict[str, Taken], v: WorkloadView) -> bool:
        """Add `v` to `taken` (per level: the GPUs taken so far and the largest victim's, all within
        budget) if that stays within budget; only `v`'s own levels change, so only they are checked."""
        state, cycle = self.cycle.state, self.cycle
        levels = [level for level in state.chain(v.queue) if level not in self.mine]
        units = v.gpu_units
        for level in levels:
            floor = cycle.reclaim_floor(level, self.floor)
            total, largest = taken.get(level, (0.0, 0.0))
            if self.by_quota:
                # before the largest victim goes, the level still holds more than its quota
                if state.allocated(level) - (total + units - max(largest, units)) <= floor + EPSILON:
                    return False
            elif state.allocated(level) - total - units < floor - EPSILON:
                return False
        for level in levels:
            total, largest = taken.get(level, (0.0, 0.0))
            taken[level] = (total + units, max(largest, units))
        return True

    def admits(self, victims: list[WorkloadView]) -> bool:
        taken: dict[str, Taken] = {}
        return all(self.take(taken, v) for v in victims)
