"""The allocate action: pending work placed in queue order, each workload that stays pending given its
reason; admission (limits, quotas, whether it could ever fit) and the backfill reservation."""

from __future__ import annotations

import heapq
from typing import Final

from gpupool.scheduler import explain
from gpupool.scheduler.evict_search import EvictionSearch
from gpupool.scheduler.ordering import INFINITY
from gpupool.scheduler.placement import families
from gpupool.scheduler.prepare import GLOBAL, same
from gpupool.scheduler.snapshot import RESOURCES, Explanation, WorkloadView
from gpupool.scheduler.state import EPSILON, Held, NodeState, Reservation

# a capacity miss whose sentence is written per workload
NO_ROOM: Final = Explanation(explain.NO_CAPACITY, "")
_UNKNOWN: Final = Explanation("", "")  # not yet in a cache whose values may be None (compared by identity)


class Allocation(EvictionSearch):
    """The allocate action and the reasons of the work it leaves pending."""

    def allocate(self) -> None:
        self._serve_gainers()
        self._walk()

    def _walk(self) -> None:
        """Place the pending work in allocation order (queues most under-served first, each in its own
        order), explaining what stays pending."""
        heap = [self._queue_key(q) for q in self.order]
        heapq.heapify(heap)
        cursor = dict.fromkeys(self.order, 0)
        accounted = self.state.accounted
        unplaced = self.unplaced
        strict = self.config.blocking == "strict"
        while heap:
            key = heapq.heappop(heap)
            queue = key[-1]
            items = self.order[queue]
            i = cursor[queue]
            first = not heap or key < heap[0]  # whether this queue still goes before every other
            while True:
                while i < len(items) and items[i].key not in unplaced:
                    i += 1
                if i >= len(items):
                    break
                w = items[i]
                i += 1
                changes = len(accounted)
                placed = self._try_allocate(w, i - 1)
                if not placed and strict and self._holds_back(w, self.decisions.explanations[w.key].code):
                    for rest in items[i:]:
                        if rest.key in unplaced:
                            self.decisions.explanations[rest.key] = explain.blocked(w.id)
                    self._blockers[queue] = w
                    i = len(items)
                    break
                # Its key moves only with its allocation: with nothing allocated or taken back, it is the
                # same, and while it stays the least, the queue goes on without a trip through the heap.
                if len(accounted) != changes:
                    key = self._queue_key(queue)
                    first = not heap or key < heap[0]
                if not first:
                    heapq.heappush(heap, key)
                    break
            cursor[queue] = i

    def _serve_gainers(self) -> None:
        """Work that evictions under way were made for (a stopping workload's `evicted_for`), or whose
        victims stopped since the last cycle (`victims_stopped`), is served first, in allocation order
        among itself: the GPUs being released, or just released, are its room as when the eviction was
        decided, though the queues' order may have changed since (other work ahead now could take them, or
        the free GPUs that room also needs, and the gainer would evict again). A gainer takes the room it
        was left waiting for (`Snapshot.nominated`) when that room is free and still suits it, not room
        that other gainers' victims freed (which would leave those gainers to evict again)."""
        owed = self._owed
        if not self.state.holding_nodes and not owed:
            return
        unplaced = self.unplaced
        stopping_for = self._stopping_for  # in the order met: the sort below decides
        if self.state.holding_nodes:
            for v in self.snapshot.running:
                gainer = v.evicted_for
                if gainer is not None and v.stopping and gainer in unplaced:
                    victims = stopping_for.get(gainer)
                    if victims is None:
                        stopping_for[gainer] = [v.id]
                    else:
                        victims.append(v.id)
        if not stopping_for and not owed:
            return
        gainers = [unplaced[i] for i in stopping_for]
        gainers.extend(unplaced[w.id] for w in owed if w.id not in stopping_for and w.id in unplaced)
        fair_share = self.config.fair_share
        gainers.sort(key=lambda w: (self._queue_key(w.queue if fair_share else GLOBAL), self.ahead_of(w)))
        # A gainer that does not fit makes no backfill reservation here: it is tried again in its turn
        # in the walk, and the reservation goes to the first workload of the order that does not fit,
        # as in a cycle with no gainer (else, the cycle after, work ahead of it takes the reservation
        # and evicts what it could have evicted now).
        nominated = self.snapshot.nominated
        for w in gainers:
            if w.id not in unplaced:
                continue
            room = nominated.get(w.id)
            if room is not None and self._admission(w) is None and self.placer.place_at(w, room):
                self._bind(w, room)
            else:
                self._try_allocate(w, reserve=False)

    def _try_allocate(self, w: WorkloadView, place: int = -1, *, reserve: bool = True) -> bool:
        """Place `w` now, or explain why not (`place`: its index in its group's order, see `ahead_of`;
        `reserve`: under backfill, whether a workload that does not fit may take the reservation)."""
        refusal = self._admission(w)
        if refusal is not None:
            self.decisions.explanations[w.key] = refusal
            return False
        state = self.state
        if w.gpu_units > state.free_total + EPSILON:
            why = NO_ROOM  # what placing would conclude, sooner; the sentence is written below
        elif (
            (cached := self.failed.get(shape := self._shape(w))) is not None
            and cached[0] == state.generation
            and cached[2] is state.reservation
        ):
            why = cached[1]
        else:
            placed = self.placer.place_gang(w)
            if placed is not None:
                self._bind(w, placed)
                return True
            why = self._why_not_placed(w)
            self.failed[shape] = (state.generation, why, state.reservation)
        # GPUs that stopping work releases go to waiting work in allocation order, like free ones: claimed
        # here, before later work could take the free GPUs such a claim also needs.
        if explain.cured_by_capacity(why.code) and self._fits_after_release(w):
            return False
        self.decisions.explanations[w.key] = self._capacity_explanation(w, why, place)
        if why.code == explain.RESERVED:
            self._reserved_by[w.id] = self.state.reservation
        if (
            self.config.blocking == "backfill"
            and self.state.reservation is None
            and why.code != explain.TOO_LARGE
            and reserve
        ):
            self._reserve(w)
        return False

    def _admission(self, w: WorkloadView) -> Explanation | None:
        """Whether it could ever fit, then queue limits and the quota rule for non-preemptible work: work no
        node could hold is told so, not to wait for a limit whose raising would not start it (and, being
        `too-large`, it holds back no other work of its queue under strict blocking)."""
        never = self._never_fits(w)
        if never is not None:
            if never.code == explain.TOO_LARGE or never.code == explain.NO_MATCHING_GPU:
                return never
            # No node can take work now (none joined, all out of service): that passes, a limit the work
            # alone is larger than does not, and is the news (it was hidden while the node was down).
            return self._over_limit_alone(w) or never
        state = self.state
        limits = self._limits(w.queue)
        if limits:
            wants = whole_demand(w)
            for name, position, limit in limits:
                allocated = state.alloc[name][position]
                if allocated + wants[position] > limit + EPSILON:
                    return explain.queue_limit(name, RESOURCES[position], allocated, limit, wants[position])
        if not w.preemptible and w.gpu_units > 0:
            over: list[tuple[str, float, float]] = []
            for name in state.chain(w.queue):
                queue = self.queues.get(name)
                if queue is None:
                    continue
                quota = queue.gpu.quota
                would = state.allocated_np(name) + w.gpu_units
                if would > quota + EPSILON:
                    over.append((name, would, quota))
            if over:
                return explain.over_quota_nonpreemptible(over)
        return None

    def _over_limit_alone(self, w: WorkloadView) -> Explanation | None:
        """The queue limit (its own or an ancestor's) `w` alone asks for more than, said with its fix."""
        limits = self._limits(w.queue)
        if not limits:
            return None
        wants = whole_demand(w)
        for name, position, limit in limits:
            if wants[position] > limit + EPSILON:
                allocated = self.state.alloc[name][position]
                return explain.queue_limit(name, RESOURCES[position], allocated, limit, wants[position])
        return None

    def _holds_back(self, w: WorkloadView, code: str) -> bool:
        """Under `blocking: strict`, whether `w`, left pending for `code`, holds back the later work of its
        group: work that waits for capacity, or for its queue's allocation to fall below a limit, does; work
        that alone asks for more than a limit waits for the limit to change, not for its turn, and holds
        back nothing, as work too large for the pool does not."""
        if explain.cured_by_capacity(code):
            return True
        if code != explain.QUEUE_LIMIT:
            return False
        wants = whole_demand(w)
        return all(wants[position] <= limit + EPSILON for _, position, limit in self._limits(w.queue))

    def _limits(self, queue: str) -> list[tuple[str, int, float]]:
        """(queue, resource position, limit) for every limit set on `queue` or above it (asked for one
        workload after another of a queue: the last queue's answer without a lookup)."""
        if queue is self._limits_queue:
            return self._limits_found
        found = self._queue_limits.get(queue)
        if found is None:
            found = []
            for name in self.state.chain(queue):
                q = self.queues.get(name)
                if q is None:
                    continue
                for position, resource in enumerate(RESOURCES):
                    limit = q.share(resource).limit
                    if limit is not None:
                        found.append((name, position, limit))
            self._queue_limits[queue] = found
        self._limits_queue, self._limits_found = queue, found
        return found

    def _never_fitting(self, w: WorkloadView) -> bool:
        never = self._never_fits(w)
        return never is not None and (
            never.code == explain.TOO_LARGE or never.code == explain.NO_MATCHING_GPU
        )

    def _never_fits(self, w: WorkloadView) -> Explanation | None:
        # Work alike comes in runs (allocate walks each queue in turn): the last answer, when the shape is
        # the last workload's, without building a key.
        last = self._never_last_asked
        if (
            last is not None
            and w.gpus.count == last.gpus.count
            and w.nodes == last.nodes
            and w.cpus == last.cpus
            and w.memory_bytes == last.memory_bytes
            and same(w.gpus.models, last.gpus.models)
            and same(w.gpus.min_memory_bytes, last.gpus.min_memory_bytes)
            and same(w.node_names, last.node_names)
        ):
            return self._never_last
        self._never_last_asked, self._never_last = w, self._never_keyed(w)
        return self._never_last

    def _never_keyed(self, w: WorkloadView) -> Explanation | None:
        demand = w.gpus
        key: tuple[object, ...]
        if demand.models or demand.min_memory_bytes is not None or w.node_names or w.cpus or w.memory_bytes:
            key = (
                demand.count, demand.models, demand.min_memory_bytes, w.nodes, w.node_names, w.cpus,
                w.memory_bytes,
            )  # fmt: skip
        else:
            key = (demand.count, w.nodes)  # the usual shape: any GPU, any node, no CPUs or memory asked
        found = self._never.get(key, _UNKNOWN)
        if found is _UNKNOWN:
            found = self._never[key] = self._never_fits_shape(w)
        return found

    def _never_fits_shape(self, w: WorkloadView) -> Explanation | None:
        if w.node_names:
            return self._never_fits_named(w)
        if not self.snapshot.nodes:
            return explain.no_nodes(w)  # none has joined yet (or all were deleted): not "can never fit"
        if w.nodes > len(self.snapshot.nodes):
            return explain.too_large(w, f"needs {w.nodes} nodes; the pool has {len(self.snapshot.nodes)}")
        if w.nodes > self.schedulable_nodes:
            return explain.unschedulable_nodes(w, self.snapshot.nodes)
        if w.gpus.count <= 0:
            return self._never_fits_beside(w, [n for n in self.state.nodes.values() if n.schedulable])
        kinds = [(sum(self.placer.matches(group[0], w.gpus)), len(group)) for group in self._kinds()]
        matching = [(count, many) for count, many in kinds if count > 0]
        if not matching:
            return explain.no_matching_gpu(w)
        biggest = max(count for count, _ in matching)
        if w.gpus.count > biggest:
            return explain.too_large(
                w, f"needs {explain.counted(w.gpus.count, 'GPU')} on one node; the largest has {biggest}"
            )
        able = sum(many for count, many in matching if count >= w.gpus.count)
        if w.nodes > able:
            return explain.too_large(
                w,
                f"needs {explain.counted(w.nodes, 'node')} with "
                f"{explain.counted(w.gpus.count, 'matching GPU')}; {able} {_have(able)} them",
            )
        if w.cpus <= 0 and w.memory_bytes <= 0:
            return None
        groups = zip(kinds, self._kinds(), strict=True)  # `kinds` counts each group's matching GPUs
        suited = [node for (count, _), group in groups if count >= w.gpus.count for node in group]
        return self._never_fits_beside(w, suited)

    def _never_fits_beside(self, w: WorkloadView, nodes: list[NodeState]) -> Explanation | None:
        """Whether too few of `nodes` (those whose GPUs could hold one of `w`'s pods) have the CPUs and
        memory `w` asks per pod even with nothing else running there: then it can never fit, and no
        eviction can help (its reason is `too-large`, not a shortage evictions could cure)."""
        if w.cpus <= 0 and w.memory_bytes <= 0:
            return None
        able = 0
        most_cpus, most_memory = 0.0, 0.0
        cpus_anywhere = memory_anywhere = False
        for node in nodes:
            view = node.view  # the node's whole CPUs and memory (none given: no limit), as GPUs count all
            cpus = view.cpus if view.cpus else INFINITY
            memory = float(view.memory_bytes) if view.memory_bytes else INFINITY
            cpus_ok, memory_ok = cpus + EPSILON >= w.cpus, memory >= w.memory_bytes
            able += cpus_ok and memory_ok
            cpus_anywhere |= cpus_ok
            memory_anywhere |= memory_ok
            most_cpus, most_memory = max(most_cpus, cpus), max(most_memory, memory)
        if able >= w.nodes:
            return None
        such = "node with its GPUs" if w.gpus.count > 0 else "node"
        if not cpus_anywhere:
            return explain.too_large(
                w, f"needs {explain.counted(w.cpus, 'CPU')} on one {such}; the largest has {most_cpus:g}"
            )
        if not memory_anywhere:
            return explain.too_large(
                w, f"needs {explain.size_text(w.memory_bytes)} of memory on one {such}; the largest has "
                f"{explain.size_text(most_memory)}",
            )  # fmt: skip
        beside = "beside its GPUs " if w.gpus.count > 0 else ""
        return explain.too_large(
            w, f"needs {explain.counted(w.nodes, 'node')} with {explain.counted(w.cpus, 'CPU')} and "
            f"{explain.size_text(w.memory_bytes)} of memory {beside}each; {able} {_have(able)} them",
        )  # fmt: skip

    def _never_fits_named(self, w: WorkloadView) -> Explanation | None:
        """The same questions for a workload that may run only on the nodes it names."""
        names = sorted(w.node_names)
        listed = _listed(w.node_names)
        views = {n.name: n for n in self.snapshot.nodes if n.name in w.node_names}
        usable = [self.state.nodes[name] for name in names if name in views and views[name].schedulable]
        if len(usable) < w.nodes:
            why = [f"{name} is not in the pool" for name in names if name not in views]
            why += [f"{name} is {views[name].state}" for name in names if name in views and name not in
                    {n.name for n in usable}]  # fmt: skip
            return explain.named_nodes(w, listed, "; ".join(why[:5]))
        if w.gpus.count <= 0:
            return self._never_fits_beside(w, usable)
        suited = [node for node in usable if sum(self.placer.matches(node, w.gpus)) >= w.gpus.count]
        if len(suited) < w.nodes:
            return explain.too_large(
                w,
                f"needs {w.nodes} of its named nodes ({listed}) with {explain.gpu_text(w)}; "
                f"{len(suited)} have them",
            )
        return self._never_fits_beside(w, suited)

    def _kinds(self) -> list[list[NodeState]]:
        """Schedulable nodes grouped by GPU make-up (nodes alike answer every GPU question alike)."""
        if self._node_kinds is None:
            groups: dict[tuple[tuple[str, int], ...], list[NodeState]] = {}
            # Nodes alike share one signature object (see state._template), and mostly come in runs: the
            # last node's group, without hashing the signature again.
            last: tuple[tuple[str, int], ...] | None = None
            group: list[NodeState] = []
            for node in self.state.nodes.values():
                if node.schedulable:
                    if node.signature is not last:
                        last = node.signature
                        found = groups.get(last)
                        if found is None:
                            found = groups[last] = []
                        group = found
                    group.append(node)
            self._node_kinds = list(groups.values())
        return self._node_kinds

    def _why_not_placed(self, w: WorkloadView) -> Explanation:
        reservation = self.state.reservation
        if reservation is not None and reservation.workload_id != w.id:
            saved, self.state.reservation = reservation, None
            checkpoint, generation = self.state.checkpoint(), self.state.generation
            fits = self.placer.place_gang(w) is not None
            self.state.rollback(checkpoint)
            self.state.generation = generation
            self.state.reservation = saved
            if fits:
                if self.now < reservation.start < INFINITY:
                    self.state.expires(reservation.start)  # from then on the sentence says "from now"
                return explain.reserved(reservation.workload_id, reservation.start, self.now)
        if w.node_names:
            named = [self.state.nodes[n] for n in sorted(w.node_names) if n in self.state.nodes]
            free = sum((node.free_sum for node in named if node.schedulable), 0.0)
            return explain.named_nodes_full(w, _listed(w.node_names), free)
        if w.cpus > 0 or w.memory_bytes > 0:
            short = self._node_resources_short(w)
            if short is not None:
                return short
        free_matching = self.state.whole_free(families(w.gpus))
        if not w.gpus.is_fractional and w.gpu_units > 0 and free_matching + EPSILON >= w.gpu_units:
            block, node = self.state.largest_free_block()
            return explain.fragmented(w, block, node)
        return explain.no_capacity(w, self.state.free_gpus(), 0)

    def _node_resources_short(self, w: WorkloadView) -> Explanation | None:
        """Why `w` does not fit where nodes have its GPUs free for one pod but none of them has its CPUs
        and memory free as well; None when some such node has all, or none has the GPUs."""
        need = w.gpus.count
        found = False
        cpus_short_everywhere = memory_short_everywhere = True
        most_cpus, cpus_node, most_memory, memory_node = -1.0, "", -1.0, ""
        # The nodes that placing it walked (those with enough GPUs free by the state's indexes), not all.
        for node in self.placer.nodes_to_try(w) if need > 0 else self.state.nodes.values():
            if not node.schedulable or (w.node_names and node.name not in w.node_names):
                continue
            if need > 0:
                suits = self.placer.matches(node, w.gpus)
                free = node.free
                if w.gpus.is_fractional:
                    fits = any(ok and free[i] + EPSILON >= need for i, ok in enumerate(suits))
                else:
                    fits = sum(1 for i, ok in enumerate(suits) if ok and free[i] >= 1 - EPSILON) >= need
                if not fits:
                    continue
            found = True
            cpus_ok = node.cpus_free + EPSILON >= w.cpus
            memory_ok = node.memory_free >= w.memory_bytes
            if cpus_ok and memory_ok:
                return None
            cpus_short_everywhere &= not cpus_ok
            memory_short_everywhere &= not memory_ok
            if node.cpus_free > most_cpus:
                most_cpus, cpus_node = node.cpus_free, node.name
            if node.memory_free > most_memory:
                most_memory, memory_node = node.memory_free, node.name
        if not found:
            return None
        if cpus_short_everywhere:
            return explain.node_resources_short(w, "cpu", max(0.0, most_cpus), cpus_node)
        if memory_short_everywhere:
            return explain.node_resources_short(w, "memory", max(0.0, most_memory), memory_node)
        return explain.node_resources_short(w, "both", 0.0, "")

    # -- backfill reservation -------------------------------------------------------------------------

    def _reserve(self, w: WorkloadView) -> None:
        """Reserve the nodes where `w` could start soonest, judging by running work's declared ends: where
        its GPUs per pod, and its CPUs and memory, are free (or will be, once the work holding them ends)."""
        if w.gpus.is_fractional or w.gpus.count <= 0:
            return
        need = int(w.gpus.count)
        ready: list[tuple[float, str]] = []
        evicted = self.state.evicted
        last: tuple[bool, ...] | None = None  # nodes of a kind share one answer, and mostly come in runs
        matching: list[int] = []
        for node in self.state.nodes.values():
            if not node.schedulable or (w.node_names and node.name not in w.node_names):
                continue
            suits = self.placer.matches(node, w.gpus)
            if suits is not last:
                last, matching = suits, [i for i, ok in enumerate(suits) if ok]
            if len(matching) < need:
                continue
            free = node.free
            free_now = 0
            for i in matching:
                if free[i] >= 1 - EPSILON:
                    free_now += 1
            cpus_short = w.cpus - node.cpus_free  # what must end before the pod's CPUs, memory are free
            memory_short = w.memory_bytes - node.memory_free
            when = self.now
            if free_now < need or cpus_short > EPSILON or memory_short > 0:
                ends, clocked = self._ends_on(node.name)
                if any(i not in evicted for i in clocked):
                    self.state.expires(self.now)  # an end counted from the clock itself
                freed, when = free_now, INFINITY
                for held in ends:
                    if held.workload in evicted:
                        continue
                    freed += held.gpus
                    cpus_short -= held.cpus
                    memory_short -= held.memory
                    if freed >= need and cpus_short <= EPSILON and memory_short <= 0:
                        when = held.end
                        break
                if self.now < when < INFINITY:
                    self.state.expires(when)  # from then on this node ranks as free now
            ready.append((when, node.name))
        if len(ready) < w.nodes:
            return
        ready.sort()
        chosen = ready[: w.nodes]
        start = max(t for t, _ in chosen)
        self.state.reservation = Reservation(
            w.id, frozenset(n for _, n in chosen), start, relative=start == self.now
        )

    def _ends_on(self, name: str) -> tuple[list[Held], list[int]]:
        """The snapshot's running work on node `name`, soonest declared end first (see `Held`); and the ids
        of the work whose end is counted from the clock (no start time). Built once a cycle, when a
        reservation first asks (several may: each holder that gets room lets the next blocked workload
        reserve), and again for a node that work was bound to since (`Prepared._bind`); work evicted since
        is still listed, for the caller to skip. The same ends in the same order as sorting the work left
        running each time would give: entries alike but for the workload are interchangeable."""
        found = self._ends.get(name)
        if found is None:
            ends: list[Held] = []
            clocked: list[int] = []
            for r in self.by_node.get(name, []):
                if r.max_duration is None:
                    end = INFINITY
                elif r.start_time is None:
                    end = self.now + r.max_duration
                    clocked.append(r.id)
                else:
                    end = r.start_time + r.max_duration
                pods = [p for p in r.placement if p.node == name]
                gpus = sum(len(p.gpu_indices) for p in pods)
                ends.append(Held(end, gpus, r.cpus * len(pods), float(r.memory_bytes * len(pods)), r.id))
            ends.sort(key=Held.order)
            found = self._ends[name] = (ends, clocked)
        return found


def _listed(names: frozenset[str]) -> str:
    ordered = sorted(names)
    return ", ".join(ordered[:5]) + (f" and {len(ordered) - 5} more" if len(ordered) > 5 else "")


def whole_demand(w: WorkloadView) -> tuple[float, float, float]:
    """GPUs, CPUs and memory that all of `w`'s pods ask for, in `RESOURCES`' order (as queue limits count)."""
    return (w.gpus.count * w.nodes, w.cpus * w.nodes, float(w.memory_bytes * w.nodes))


def _have(count: int) -> str:
    """The verb after a count of nodes: "1 has", "2 have"."""
    return "has" if count == 1 else "have"
