"""Where pods go: node choice (binpack, spread or fragmentation), GPU choice (NVLink island first), gangs,
topology.

Nodes are indexed by GPU model and number of whole free GPUs, so a pod needing k GPUs looks only at
buckets that can hold it: binpack walks them from the fullest that fits, spread from the emptiest.

`fragmentation` (after FGD, Weng et al., USENIX ATC'23) weighs every node that fits: it places a pod where
it costs the least *usable capacity*, the GPUs that the workload's own pod shapes could still take there.
A shape is a (GPU demand, CPUs, memory) seen among the snapshot's pending and running pods, weighted by how
often; on a node, a shape could take as many pods as its GPUs, CPUs and memory all allow (a fraction
packs `floor(free / fraction)` times into each GPU it suits). GPUs that no pod of a shape could use are
that shape's fragments: a GPU left a sliver, GPUs stranded on a node whose CPUs or memory ran out, GPUs of
a model the shape does not accept. FGD asks only whether one pod of a shape fits; counting how many fit
also sees CPUs running out before GPUs do. Ties go to the best fit (least CPU and GPU left), then to
binpack's order.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Final

from gpupool.scheduler.snapshot import GpuDemand, PodPlacement, WorkloadView
from gpupool.scheduler.state import EPSILON, MIXED, ClusterState, Domain, NodeState

_MEMORY_SUFFIX: Final = re.compile(r"^(?P<family>.+?)-(?P<gb>\d+)GB$")


@lru_cache(maxsize=256)
def split_model(name: str) -> tuple[str, int | None]:
    """ "A100-80GB" -> ("A100", 80e9 bytes): a family plus an optional minimum memory size."""
    match = _MEMORY_SUFFIX.match(name.upper())
    if match is None:
        return name.upper(), None
    return match["family"], int(match["gb"]) * 1_000_000_000


def gpu_matches(model: str, memory_bytes: int, demand: GpuDemand) -> bool:
    if demand.min_memory_bytes is not None and memory_bytes < demand.min_memory_bytes:
        return False
    if not demand.models:
        return True
    model = model.upper()
    for wanted in demand.models:
        family, memory = split_model(wanted)
        if family == model and (memory is None or memory_bytes >= memory):
            return True
    return False


def families(demand: GpuDemand) -> frozenset[str]:
    return frozenset(split_model(m)[0] for m in demand.models)


ONE_ISLAND_LOOKAHEAD: Final = 64  # nodes examined for a one-island fit before any fit will do
FRAGMENTATION: Final = "fragmentation"
MAX_SHAPES: Final = 128  # the most frequent pod shapes the fragmentation placement weighs (the rest are rare)

# One pod shape of the workload: (GPU demand, GPUs per pod, fraction per GPU or 0.0 for whole GPUs, CPUs,
# memory bytes, weight: how many pods have it).
_Shape = tuple[GpuDemand, int, float, float, float, float]


class Placer:
    """Finds placements on a ClusterState; allocations are recorded in the state's undo log."""

    def __init__(
        self,
        state: ClusterState,
        policy: str,
        now: float,
        workloads: Sequence[Sequence[WorkloadView]] = (),
    ) -> None:
        self.state = state
        self.spread = policy == "spread"
        self.fragmentation = policy == FRAGMENTATION
        self.now = now
        # The pods whose shapes the fragmentation placement weighs (the snapshot's pending and running
        # work), read on its first use.
        self._workloads = workloads
        self._shapes: list[_Shape] | None = None
        self._usable_memo: dict[tuple[object, ...], float] = {}
        self._alike: dict[int, bool] = {}  # by id(node.signature): the node's GPUs are all alike
        self._scale = (1.0, 1.0)  # the most GPUs and CPUs on one node, for the best-fit tie-break
        self._matches: dict[tuple[tuple[tuple[str, int], ...], GpuDemand], tuple[bool, ...]] = {}
        self._by_identity: dict[tuple[int, int], tuple[bool, ...]] = {}
        self._alive: list[GpuDemand] = []

    def matches(self, node: NodeState, demand: GpuDemand) -> tuple[bool, ...]:
        """Which of the node's GPUs suit `demand` (cached: nodes of one kind share the answer).

        Looked up first by object identity (signatures are interned by the state; a demand object lives
        as long as the snapshot), then by value."""
        fast = (id(node.signature), id(demand))
        found = self._by_identity.get(fast)
        if found is None:
            key = (node.signature, demand)
            found = self._matches.get(key)
            if found is None:
                found = tuple(gpu_matches(model, memory, demand) for model, memory in node.signature)
                self._matches[key] = found
            self._by_identity[fast] = found
            self._alive.append(demand)  # keeps the id in `fast` from being reused this cycle
        return found

    # -- one pod --------------------------------------------------------------------------------------

    def node_admits(self, node: NodeState, w: WorkloadView) -> bool:
        """Whether `w` may go on `node` once work there is stopped (schedulable, reservation allows): its
        CPUs and memory are not asked, as the victims that would release them are not chosen yet."""
        return self._node_fits(node, w, after_release=True, resources=False)

    def _node_fits(
        self, node: NodeState, w: WorkloadView, after_release: bool, resources: bool = True
    ) -> bool:
        if not node.schedulable or (w.node_names and node.name not in w.node_names):
            return False
        if resources:
            cpus, memory = node.cpus_free, node.memory_free
            if after_release:  # with what stopping work holds
                cpus += node.cpus_held
                memory += node.memory_held
            if cpus + EPSILON < w.cpus or memory < w.memory_bytes:
                return False
        reservation = self.state.reservation
        if reservation is not None and reservation.workload_id != w.id and node.name in reservation.nodes:
            ends = None if w.max_duration is None else self.now + w.max_duration
            if ends is None or ends > reservation.start:
                return False
            if not reservation.relative:
                self.state.expires(reservation.start - (ends - self.now))
        return True

    def nodes_to_try(self, w: WorkloadView) -> Iterator[NodeState]:
        """The nodes normal placement tries for one pod of `w` (those the indexes say have room for its
        GPUs), in its order; a node may come more than once."""
        return self._candidates(w, False, None)

    def _candidates(self, w: WorkloadView, after_release: bool, domain: Domain | None) -> Iterator[NodeState]:
        """Nodes to try for one pod, best first (inside `domain` when given). The state's indexes are
        walked as they are: nothing changes them while one pod is being placed."""
        state = self.state
        demand = w.gpus
        wanted = families(demand)
        need = int(demand.count) if not demand.is_fractional else 0
        index = state if domain is None else domain
        partial = index.partial_nodes
        if after_release:
            # Nodes where stopping work releases GPUs first (those with room for the pod once released),
            # then every node normal placement would try.
            holding = index.holding_by_count
            for count in sorted(holding, reverse=self.spread):
                if count < need:
                    continue
                for name in holding[count]:
                    yield state.nodes[name]
        if demand.is_fractional and not self.spread:
            for name in partial:
                yield state.nodes[name]
        for model, everywhere in state.buckets.items():
            if wanted and model not in wanted and model != MIXED:
                continue
            if demand.count > 0 and model == "":
                continue
            by_count = everywhere if domain is None else domain.buckets.get(model)
            if by_count is None:
                continue
            counts = sorted(
                (c for c in by_count if c >= max(need, 1 if demand.count > 0 else 0)), reverse=self.spread
            )
            for count in counts:
                for name in by_count.get(count, ()):
                    yield state.nodes[name]
        if demand.is_fractional and self.spread:
            for name in partial:
                yield state.nodes[name]

    def find_pod(
        self,
        w: WorkloadView,
        *,
        after_release: bool = False,
        domain: Domain | None = None,
        avoid: frozenset[str] = frozenset(),
    ) -> PodPlacement | None:
        # A multi-GPU pod first looks for a node where its GPUs can share one NVLink island (a pass that
        # is skipped where no island is that large; the nodes it would walk are counted all the same).
        whole = int(w.gpus.count) if not w.gpus.is_fractional else 0
        if self.fragmentation and not after_release:
            return self._least_fragmenting(w, domain, avoid, whole)
        passes = (True, False) if whole >= 2 and self.state.island >= whole else (False,)
        for one_island in passes:
            seen: set[str] = set(avoid)
            for node in self._candidates(w, after_release, domain):
                if node.name in seen or (w.node_names and node.name not in w.node_names):
                    continue
                seen.add(node.name)
                if one_island and len(seen) > ONE_ISLAND_LOOKAHEAD + len(avoid):
                    break
                if not self._node_fits(node, w, after_release) or (one_island and node.island < whole):
                    continue
                chosen = self.choose_gpus(node, w.gpus, after_release, one_island=one_island)
                if chosen is not None:
                    return PodPlacement(node.name, chosen[0], chosen[1])
        return None

    # -- fragmentation ----------------------------------------------------------------------------------

    def _least_fragmenting(
        self, w: WorkloadView, domain: Domain | None, avoid: frozenset[str], whole: int
    ) -> PodPlacement | None:
        """The fitting node (and GPU, for a fraction) where `w`'s pod costs the least usable capacity;
        with a multi-GPU pod, nodes where its GPUs share one NVLink island first."""
        shapes = self.shapes()
        demand = w.gpus
        island = whole >= 2 and self.state.island >= whole
        max_gpus, max_cpus = self._scale
        best: tuple[float, ...] | None = None
        chosen: PodPlacement | None = None
        seen: set[str] = set(avoid)
        states: set[tuple[object, ...]] = set()  # node states already weighed for this pod
        for node in self._candidates(w, False, domain):
            if node.name in seen or (w.node_names and node.name not in w.node_names):
                continue
            seen.add(node.name)
            if not self._node_fits(node, w, False):
                continue
            uniform = self.alike(node)
            state = tuple(sorted(node.free)) if uniform else tuple(node.free)
            if not island:
                # A node in the same state as one weighed already would cost the same and fit the same:
                # it cannot beat the earlier one (ties go to the first).
                same = (id(node.signature), state, node.cpus_free, node.memory_free)
                if same in states:
                    continue
                states.add(same)
            cpus_after = node.cpus_free - w.cpus
            memory_after = node.memory_free - w.memory_bytes
            before = self.usable(node, state, node.cpus_free, node.memory_free, shapes)
            if demand.count <= 0:
                options: list[tuple[tuple[int, ...], float, float]] = [
                    ((), 1.0, self.usable(node, state, cpus_after, memory_after, shapes))
                ]
            elif demand.is_fractional:
                options = []
                suits = self.matches(node, demand)
                tried: set[float] = set()
                for i, free in enumerate(node.free):
                    if not suits[i] or free + EPSILON < demand.count or (uniform and free in tried):
                        continue
                    tried.add(free)  # GPUs alike with as much free leave the same node behind
                    after = list(node.free)
                    after[i] = free - demand.count
                    left = tuple(sorted(after)) if uniform else tuple(after)
                    usable = self.usable(node, left, cpus_after, memory_after, shapes)
                    options.append(((node.view.gpus[i].index,), demand.count, usable))
            else:
                picked = self.choose_gpus(node, demand)
                if picked is None:
                    continue
                after = list(node.free)
                for index in picked[0]:
                    after[node.position[index]] = 0.0
                left = tuple(sorted(after)) if uniform else tuple(after)
                options = [(picked[0], 1.0, self.usable(node, left, cpus_after, memory_after, shapes))]
            for indices, fraction, usable in options:
                split = 0.0
                if island:
                    split = float(len({node.view.gpus[node.position[i]].nvlink_island for i in indices}) > 1)
                gpus_left = node.free_sum - demand.count
                fit = gpus_left / max_gpus + (cpus_after / max_cpus if node.view.cpus else 0.0)
                key = (split, round(before - usable, 9), fit)
                if best is None or key < best:
                    best, chosen = key, PodPlacement(node.name, indices, fraction)
        return chosen

    def shapes(self) -> list[_Shape]:
        """The pod shapes of the workload, most frequent first (at most MAX_SHAPES); built once."""
        if self._shapes is None:
            counts: dict[tuple[GpuDemand, float, int], float] = {}
            for group in self._workloads:
                for w in group:
                    if w.gpus.count > 0:
                        key = (w.gpus, w.cpus, w.memory_bytes)
                        counts[key] = counts.get(key, 0.0) + w.nodes
            ranked = sorted(counts.items(), key=lambda item: -item[1])[:MAX_SHAPES]
            self._shapes = [
                (
                    demand,
                    1 if demand.is_fractional else int(demand.count),
                    demand.count if demand.is_fractional else 0.0,
                    cpus,
                    float(memory),
                    weight,
                )
                for (demand, cpus, memory), weight in ranked
            ]
            nodes = [n.view for n in self.state.nodes.values() if n.schedulable]
            self._scale = (
                float(max((len(v.gpus) for v in nodes), default=0) or 1),
                float(max((v.cpus for v in nodes), default=0.0) or 1.0),
            )
        return self._shapes

    def alike(self, node: NodeState) -> bool:
        """Whether all the node's GPUs are of one model and memory size (then only how much each has free
        matters, not which has it)."""
        found = self._alike.get(id(node.signature))
        if found is None:
            found = self._alike[id(node.signature)] = len(set(node.signature)) <= 1
        return found

    def usable(
        self,
        node: NodeState,
        free: tuple[float, ...],
        cpus_free: float,
        memory_free: float,
        shapes: list[_Shape],
    ) -> float:
        """GPUs of `node` (with these free GPUs, CPUs and memory) that the workload's pods could still use:
        per shape, the GPUs that as many of its pods as fit would take, weighted by its frequency. `free`
        is per GPU, sorted when the node's GPUs are alike (see `alike`)."""
        key = (id(node.signature), free, cpus_free, memory_free)
        found = self._usable_memo.get(key)
        if found is not None:
            return found
        alike = self.alike(node)
        total = 0.0
        if sum(free) > EPSILON:
            for demand, per_pod, fraction, cpus, memory, weight in shapes:
                suits = self.matches(node, demand)
                if fraction > 0.0:
                    slots = 0
                    for i, f in enumerate(free):
                        if suits[0 if alike else i] and f + EPSILON >= fraction:
                            slots += int((f + EPSILON) // fraction)
                elif alike:
                    whole = 0
                    for f in free:
                        if suits[0] and f >= 1.0 - EPSILON:
                            whole += 1
                    slots = whole // per_pod
                else:  # a pod's GPUs are of one model (`_one_model`): pods per model
                    by_model: dict[tuple[str, int], int] = {}
                    for i, f in enumerate(free):
                        if suits[i] and f >= 1.0 - EPSILON:
                            by_model[node.signature[i]] = by_model.get(node.signature[i], 0) + 1
                    slots = 0
                    for whole in by_model.values():
                        slots += whole // per_pod
                if slots and cpus > 0.0 and cpus_free + EPSILON < slots * cpus:  # CPUs run out first
                    slots = int((cpus_free + EPSILON) // cpus)
                if slots and memory > 0.0 and memory_free < slots * memory:  # memory runs out first
                    slots = int(memory_free // memory)
                if slots > 0:
                    total += weight * slots * (fraction if fraction > 0.0 else per_pod)
        self._usable_memo[key] = total
        return total

    def choose_gpus(
        self,
        node: NodeState,
        demand: GpuDemand,
        after_release: bool = False,
        *,
        one_island: bool = False,
    ) -> tuple[tuple[int, ...], float] | None:
        if demand.count <= 0:
            return (), 1.0
        gpus = node.view.gpus
        suits = self.matches(node, demand)
        if after_release:
            avail = [node.free[i] + node.held[i] if suits[i] else 0.0 for i in range(len(gpus))]
        else:
            avail = [node.free[i] if suits[i] else 0.0 for i in range(len(gpus))]
        if demand.is_fractional:
            fits = [i for i, a in enumerate(avail) if a + EPSILON >= demand.count]
            if not fits:
                return None
            # binpack: the fullest GPU that still holds the fraction; spread: the emptiest.
            key = (
                (lambda i: (-avail[i], gpus[i].index))
                if self.spread
                else (lambda i: (avail[i], gpus[i].index))
            )
            return (gpus[min(fits, key=key)].index,), demand.count
        whole = int(demand.count)
        free = [i for i, a in enumerate(avail) if a >= 1.0 - EPSILON]
        if len(free) < whole:
            return None
        if whole >= 2 and not self.alike(node):
            free = self._one_model(node, free, whole)
            if not free:
                return None
        islands: dict[int, list[int]] = {}
        for i in free:
            islands.setdefault(gpus[i].nvlink_island, []).append(i)
        fitting = [members for members in islands.values() if len(members) >= whole]
        if fitting:
            # One NVLink island: the smallest that holds it (binpack) or the largest (spread).
            pick = (max if self.spread else min)(
                fitting, key=lambda m: (len(m), -gpus[m[0]].index if self.spread else gpus[m[0]].index)
            )
            chosen = pick[:whole]
        elif one_island:
            return None
        else:
            # Span as few islands as possible: biggest islands first.
            ordered = sorted(islands.values(), key=lambda m: (-len(m), gpus[m[0]].index))
            chosen = [i for members in ordered for i in members][:whole]
        return tuple(sorted(gpus[i].index for i in chosen)), 1.0

    def _one_model(self, node: NodeState, free: list[int], whole: int) -> list[int]:
        """Of the free GPUs (positions) of a node with GPUs of several models, those of the one model (and
        memory size) that a pod of `whole` GPUs takes: a pod's GPUs are all of one model, as a job over
        an H100 and an L4 runs at the L4's pace in the L4's memory, and is billed for neither. The model
        with the fewest free that still hold it (binpack), or the most (spread); [] when none does."""
        signature = node.signature
        groups: dict[tuple[str, int], list[int]] = {}
        for i in free:
            groups.setdefault(signature[i], []).append(i)
        fitting = [members for members in groups.values() if len(members) >= whole]
        if not fitting:
            return []
        return (max if self.spread else min)(fitting, key=lambda m: (len(m), -m[0] if self.spread else m[0]))

    # -- gangs ----------------------------------------------------------------------------------------

    def place_gang(self, w: WorkloadView, *, after_release: bool = False) -> tuple[PodPlacement, ...] | None:
        """Place every pod of `w` (all or nothing); on success the allocation stays in the state."""
        if w.topology:
            return self._in_some_domain(w, w.topology, after_release)
        if w.topology_preferred:
            placed = self._in_some_domain(w, w.topology_preferred, after_release)
            if placed is not None:
                return placed
        return self._place_pods(w, after_release, None)

    def place_at(self, w: WorkloadView, pods: tuple[PodPlacement, ...]) -> bool:
        """Give `w` exactly `pods` (a room an earlier cycle chose for it) when every pod's node may take it
        now and its GPUs are free and suit it; the allocation then stays in the state. Work bound to a
        topology domain or spread over replicas is placed afresh instead: those rules read the cycle's
        whole state, and the room may have been chosen under another."""
        if w.topology or w.topology_preferred or w.spread_group is not None or len(pods) != w.nodes:
            return False
        demand = w.gpus
        fraction = demand.count if demand.is_fractional else 1.0
        per_pod = 0 if demand.count <= 0 else 1 if demand.is_fractional else int(demand.count)  # GPU indices
        seen: set[str] = set()
        for pod in pods:
            node = self.state.nodes.get(pod.node)
            if node is None or pod.node in seen or not self._node_fits(node, w, after_release=False):
                return False
            seen.add(pod.node)
            indices = pod.gpu_indices
            if len(set(indices)) != per_pod or len(indices) != per_pod:
                return False
            if per_pod and abs(pod.gpu_fraction - fraction) > EPSILON:
                return False
            if not per_pod:
                continue
            suits = self.matches(node, demand)
            for index in indices:
                i = node.position.get(index)
                if i is None or not suits[i] or node.free[i] + EPSILON < fraction:
                    return False
        self.state.allocate(w, pods)
        return True

    def _place_pods(
        self, w: WorkloadView, after_release: bool, domain: Domain | None
    ) -> tuple[PodPlacement, ...] | None:
        state = self.state
        if w.nodes == 1:
            pod = None
            if w.spread_group is not None:  # first where no other replica of its group runs
                shared = state.spread(w.spread_group)
                if shared:
                    pod = self.find_pod(w, after_release=after_release, domain=domain, avoid=shared)
            if pod is None:
                pod = self.find_pod(w, after_release=after_release, domain=domain)
            if pod is None:
                return None
            state.allocate(w, (pod,), after_release=after_release)
            return (pod,)
        checkpoint, generation = state.checkpoint(), state.generation
        pods: list[PodPlacement] = []
        used: frozenset[str] = frozenset()
        for _ in range(w.nodes):
            # One pod per node (the job contract's NODE_RANK), so pods of a gang never share a GPU.
            pod = self.find_pod(w, after_release=after_release, domain=domain, avoid=used)
            if pod is None:
                state.rollback(checkpoint)
                state.generation = generation  # back to exactly where we were: cached misses stay valid
                return None
            # Each pod takes its GPUs now so the next pod of the gang cannot take the same ones.
            single = _one_pod(w)
            state.allocate(single, (pod,), after_release=after_release)
            pods.append(pod)
            used = used | {pod.node}
        state.rollback(checkpoint)
        state.generation = generation
        placed = tuple(pods)
        state.allocate(w, placed, after_release=after_release)
        return placed

    def _in_some_domain(
        self, w: WorkloadView, label: str, after_release: bool
    ) -> tuple[PodPlacement, ...] | None:
        """The gang inside one domain of `label`: the fullest that has room (binpack) or the emptiest
        (spread), ties by name."""
        domains = self.state.track(label)
        need = w.gpu_units
        ordered: list[tuple[float, str, float]] = []
        for value, domain in domains.items():
            room = domain.free + domain.held if after_release else domain.free
            ordered.append((-room if self.spread else room, value, room))
        ordered.sort()
        for _, value, room in ordered:
            if room + EPSILON < need:
                continue
            placed = self._place_pods(w, after_release, domains[value])
            if placed is not None:
                return placed
        return None


def _one_pod(w: WorkloadView) -> WorkloadView:
    """The workload as a single pod, for tentative per-pod accounting inside a gang."""
    return w if w.nodes == 1 else replace(w, nodes=1)
