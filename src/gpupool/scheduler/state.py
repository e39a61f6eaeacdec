"""The tentative cluster state one cycle works on, with an undo log (KAI's Statement, as an idea).

Every tentative allocate or evict mutates the state and records its reverse. `checkpoint()` is the log's
length; `rollback(cp)` undoes back to it. Actions try scenarios (a gang's pods, a set of victims) and keep
them only when whole. No copies of the snapshot are made.

Per GPU, `free` is what nothing holds; `held` is what stopping work still holds (released soon). Each node
keeps CPUs and memory the same way (`cpus_free`, `cpus_held`, `memory_free`, `memory_held`). Normal
placement uses what is free; placement "after release" (for the beneficiaries of evictions) may also take
what is held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from gpupool.scheduler.snapshot import RESOURCES, NodeView, PodPlacement, QueueView, WorkloadView

EPSILON: Final = 1e-9
MIXED: Final = "*"
# A pod on a lost node is gone. A pod on an unhealthy node still runs: the health loop drains such a node's
# work gracefully (checkpoint, then stop), and its own check jobs run there; only a gang, whose other pods
# cannot go on without it, is restarted whole at once.
LOST_STATES: Final = frozenset({"lost"})
GANG_LOST_STATES: Final = frozenset({"lost", "unhealthy"})


class NodeState:
    """One node as a cycle sees it: its GPUs' free and held fractions and the counts derived from them.

    A plain class, not a dataclass: a cycle builds one per node, and compiled with mypyc a dataclass's
    generated `__init__` runs as interpreted Python (it was most of the cost of building the state).
    """

    __slots__ = (
        "cpus_free", "cpus_held", "dirty", "free", "free_sum", "held", "held_sum", "holding", "island",
        "labels", "memory_free", "memory_held", "model", "name", "partial", "position", "released",
        "schedulable", "signature", "template", "view", "whole", "workloads",
    )  # fmt: skip

    def __init__(self, view: NodeView, t: _NodeTemplate) -> None:
        self.name = view.name
        self.view = view
        self.position: dict[int, int] = t.position  # GPU index -> position in the lists below (read only)
        self.free: list[float] = list(t.free)
        self.held: list[float] = [0.0] * len(t.free)
        self.cpus_free = t.cpus_free
        self.memory_free = t.memory_free
        self.cpus_held = 0.0  # CPUs and memory of stopping work here: free once it has stopped
        self.memory_held = 0.0
        self.schedulable = view.schedulable
        self.model = t.model  # the GPUs' family when uniform, MIXED otherwise, "" without GPUs
        self.labels: dict[str, str] = t.labels  # read only
        self.whole = t.whole  # GPUs entirely free (normal placement)
        self.partial = t.partial  # some GPU is partly free (room for fractions)
        self.free_sum = t.free_sum
        self.held_sum = 0.0
        self.holding = False  # some GPU is held by stopping work
        self.released = t.whole  # GPUs entirely free once stopping work has released them
        # (model, memory) per GPU: nodes alike share match results
        self.signature: tuple[tuple[str, int], ...] = t.signature
        self.island = t.island  # GPUs in the node's largest NVLink island: no pod wanting more fits in one
        self.template = t
        # the running work loaded on it (see ClusterState._add_nodes), and whether a cycle changed it since
        self.workloads: list[WorkloadView] = _NO_WORK
        self.dirty = False

    def recount(self) -> None:
        whole = 0
        partial = False
        free_sum = 0.0
        for f in self.free:
            if f >= 1.0 - EPSILON:
                whole += 1
            elif f > EPSILON:
                partial = True
            free_sum += f
        held_sum = 0.0
        for h in self.held:
            held_sum += h
        self.whole = whole
        self.partial = partial
        self.free_sum = free_sum
        self.held_sum = held_sum
        self.holding = held_sum > EPSILON
        if self.holding:
            released = 0
            free, held = self.free, self.held
            for i in range(len(free)):  # zip's `strict` would make this loop a call through Python
                if free[i] + held[i] >= 1.0 - EPSILON:
                    released += 1
            self.released = released
        else:
            self.released = whole


class Sums:
    """GPUs, CPUs and memory of some workloads, summed (a plain class: compiled, its floats stay unboxed)."""

    __slots__ = ("cpu", "gpu", "memory")

    def __init__(self) -> None:
        self.gpu = 0.0
        self.cpu = 0.0
        self.memory = 0.0

    def add(self, w: WorkloadView) -> None:
        self.gpu += w.gpus.count * w.nodes
        self.cpu += w.cpus * w.nodes
        self.memory += w.memory_bytes * w.nodes


class QueueSums:
    """One queue's work, summed in a cycle's first pass over the snapshot: all of it, pending and running
    (its demand, for fair shares), and its running work that is not stopping, preemptible and not (what the
    state accounts to it, see `ClusterState`); the lowest priority of its running single-pod work that may
    be evicted (see Cycle._lowest_victims); its pending work in the snapshot's order."""

    __slots__ = ("demand", "lowest", "other", "pending", "preemptible")

    def __init__(self) -> None:
        self.demand = Sums()
        self.preemptible: Sums | None = None
        self.other: Sums | None = None
        self.lowest: int | None = None
        self.pending: list[WorkloadView] = []


# Running work's sums by (queue, preemptible), in the order the pairs first appear (see `running_sums`).
Loaded = list[tuple[str, bool, Sums]]


def running_sums(workloads: Iterable[WorkloadView]) -> Loaded:
    """Each queue's running work that is not stopping, preemptible and not, summed in the order the pairs
    first appear."""
    totals: Loaded = []
    # queue -> its sums, of preemptible work and of the rest (two names: a tuple indexed by a variable
    # would be built as an object for each workload, compiled)
    preemptible_rows: dict[str, Sums] = {}
    other_rows: dict[str, Sums] = {}
    for workload in workloads:
        if not workload.stopping:
            rows = preemptible_rows if workload.preemptible else other_rows
            row = rows.get(workload.queue)
            if row is None:
                row = rows[workload.queue] = Sums()
                totals.append((workload.queue, workload.preemptible, row))
            row.add(workload)
    return totals


@dataclass(frozen=True, slots=True)
class _NodeTemplate:
    """What a NodeView always gives a fresh NodeState: built once per view object, then copied."""

    view: NodeView  # held so that the id keying the cache stays this view's
    position: dict[int, int]
    free: tuple[float, ...]
    cpus_free: float
    memory_free: float
    model: str
    labels: dict[str, str]
    signature: tuple[tuple[str, int], ...]
    whole: int
    partial: bool
    free_sum: float
    island: int


# Memoized per NodeView object (callers such as the simulator and the control loop pass the same view
# objects cycle after cycle): a pure cache, bounded, that changes no result.
_TEMPLATES: Final[dict[int, _NodeTemplate]] = {}
_SIGNATURES: Final[dict[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]] = {}
MAX_TEMPLATES: Final = 20_000  # a caller that builds new views every cycle only churns it, in bounded memory


def _template(view: NodeView) -> _NodeTemplate:
    found = _TEMPLATES.get(id(view))
    if found is not None and found.view is view:
        return found
    if len(_TEMPLATES) >= MAX_TEMPLATES:
        _TEMPLATES.clear()
    models = {g.model for g in view.gpus}
    islands: dict[int, int] = {}
    for g in view.gpus:
        islands[g.nvlink_island] = islands.get(g.nvlink_island, 0) + 1
    free = tuple(max(0.0, 1.0 - g.allocated) for g in view.gpus)
    signature = tuple((g.model.upper(), g.memory_bytes) for g in view.gpus)
    if len(_SIGNATURES) >= MAX_TEMPLATES:
        _SIGNATURES.clear()
    found = _TEMPLATES[id(view)] = _NodeTemplate(
        view=view,
        position={g.index: i for i, g in enumerate(view.gpus)},
        free=free,
        cpus_free=view.cpus - view.cpus_allocated if view.cpus else float("inf"),
        memory_free=float(view.memory_bytes - view.memory_allocated) if view.memory_bytes else float("inf"),
        model="" if not models else (next(iter(models)) if len(models) == 1 else MIXED),
        labels=dict(view.labels),
        # One object per distinct GPU make-up, so nodes alike can be matched by identity.
        signature=_SIGNATURES.setdefault(signature, signature),
        whole=sum(1 for f in free if f >= 1.0 - EPSILON),
        partial=any(EPSILON < f < 1.0 - EPSILON for f in free),
        free_sum=sum(free, 0.0),
        island=max(islands.values(), default=0),
    )
    return found


def _load(node: NodeState, on_node: list[WorkloadView]) -> None:
    """Take the pods of `on_node` (a workload once per pod it has on `node`) from the node's GPUs, CPUs and
    memory; stopping work's are also held."""
    name = node.name
    position = node.position
    free = node.free
    held = node.held
    last: WorkloadView | None = None
    for workload in on_node:
        if workload is last:
            continue  # its pods here were all taken at its first entry
        last = workload
        stopping = workload.stopping
        for pod in workload.placement:
            if pod.node != name:
                continue
            fraction = pod.gpu_fraction
            for index in pod.gpu_indices:
                pos = position.get(index)
                if pos is not None:
                    free[pos] -= fraction
                    if stopping:
                        held[pos] += fraction
            node.cpus_free -= workload.cpus
            node.memory_free -= workload.memory_bytes
            if stopping:
                node.cpus_held += workload.cpus
                node.memory_held += workload.memory_bytes


class _Loaded:
    """A node's values once its running work was loaded, for the next cycle with the same view and work."""

    __slots__ = ("counts", "cpus_free", "cpus_held", "free", "held", "memory_free", "memory_held", "view",
                 "workloads")  # fmt: skip

    def __init__(self, node: NodeState, workloads: list[WorkloadView]) -> None:
        self.view = node.view
        self.workloads = workloads
        self.free = tuple(node.free)
        self.held = tuple(node.held)
        self.cpus_free = node.cpus_free
        self.memory_free = node.memory_free
        self.cpus_held = node.cpus_held
        self.memory_held = node.memory_held
        # what recount() derived from them: whole, partial, free_sum, held_sum, holding, released
        self.counts = (node.whole, node.partial, node.free_sum, node.held_sum, node.holding, node.released)

    def restore(self, node: NodeState) -> None:
        node.free[:] = self.free  # the node's own lists, as fresh from its template: same lengths
        node.held[:] = self.held
        node.cpus_free = self.cpus_free
        node.memory_free = self.memory_free
        node.cpus_held = self.cpus_held
        node.memory_held = self.memory_held
        node.whole, node.partial, node.free_sum, node.held_sum, node.holding, node.released = self.counts


# The last loaded values of each node, by name (see ClusterState._add_nodes): a pure cache that changes
# no result, bounded like the templates.
_LOADED: Final[dict[str, _Loaded]] = {}


class _Pool:
    """The last cycle's nodes, by name (see ClusterState.park). A cycle takes them all at once (two cycles
    at once never share one) and uses those that the last cycle left unchanged (not `dirty`) and whose
    view and running work are the same; the next cycle gets only what the last one left."""

    __slots__ = ("nodes",)

    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}

    def take(self) -> dict[str, NodeState]:
        nodes = self.nodes
        self.nodes = {}
        return nodes


_POOL: Final = _Pool()
# What a node without running work has loaded (read only).
_NO_WORK: Final[list[WorkloadView]] = []


def same_work(a: list[WorkloadView], b: list[WorkloadView]) -> bool:
    """The same workloads (objects), in the same order."""
    if len(a) != len(b):
        return False
    return all(a[i] is b[i] for i in range(len(a)))


@dataclass(slots=True)
class Domain:
    """One value of a topology label (a rack, a zone): its schedulable nodes' free and held GPUs, and the
    state's placement indexes (see ClusterState) restricted to its nodes. Each index holds its nodes in
    the same relative order as the state's own, so walking a domain visits the nodes that walking the
    whole cluster and skipping the others would, in the same order."""

    free: float = 0.0
    held: float = 0.0
    buckets: dict[str, dict[int, dict[str, None]]] = field(default_factory=dict)
    partial_nodes: dict[str, None] = field(default_factory=dict)
    holding_by_count: dict[int, dict[str, None]] = field(default_factory=dict)


def _enter(
    buckets: dict[str, dict[int, dict[str, None]]],
    partial_nodes: dict[str, None],
    holding_by_count: dict[int, dict[str, None]],
    node: NodeState,
) -> None:
    """Put `node` in placement indexes (the state's own, or a domain's) as it is now."""
    _bucket(buckets, node.model, node.whole)[node.name] = None
    if node.partial:
        partial_nodes[node.name] = None
    if node.holding:
        holding = holding_by_count.get(node.released)
        if holding is None:
            holding = holding_by_count[node.released] = {}
        holding[node.name] = None


def _bucket(buckets: dict[str, dict[int, dict[str, None]]], model: str, count: int) -> dict[str, None]:
    """The index of nodes of `model` with `count` whole free GPUs, made (empty) if there was none."""
    by_count = buckets.get(model)
    if by_count is None:
        by_count = buckets[model] = {}
    names = by_count.get(count)
    if names is None:
        names = by_count[count] = {}
    return names


def _leave(
    buckets: dict[str, dict[int, dict[str, None]]],
    partial_nodes: dict[str, None],
    holding_by_count: dict[int, dict[str, None]],
    node: NodeState,
    holding: bool,
) -> None:
    """Take `node` out of placement indexes, as `_enter` put it there (`holding`: it was holding then)."""
    by_count = buckets.get(node.model)
    if by_count is not None:
        bucket = by_count.get(node.whole)
        if bucket is not None:
            bucket.pop(node.name, None)
    partial_nodes.pop(node.name, None)
    if holding:
        holding_by_count[node.released].pop(node.name, None)


class Held:
    """What one running workload holds on a node, and when it declares it will end (`max_duration` after
    its start; never without one), for backfill reservations."""

    __slots__ = ("cpus", "end", "gpus", "memory", "workload")

    def __init__(self, end: float, gpus: int, cpus: float, memory: float, workload: int) -> None:
        self.end = end
        self.gpus = gpus
        self.cpus = cpus
        self.memory = memory
        self.workload = workload

    def order(self) -> tuple[float, int, float, float]:
        return (self.end, self.gpus, self.cpus, self.memory)


@dataclass(slots=True)
class Reservation:
    """Backfill's promise to the highest blocked workload: these nodes, from `start` (seconds) on."""

    workload_id: int
    nodes: frozenset[str]
    start: float
    relative: bool = False  # `start` is the cycle's own `now` (the nodes are free now), not a fixed time


class ClusterState:
    def __init__(
        self,
        nodes: Iterable[NodeView],
        queues: Iterable[QueueView],
        running: Iterable[WorkloadView] = (),
        by_node: dict[str, list[WorkloadView]] | None = None,
        loaded: Loaded | None = None,
    ) -> None:
        """The state of `nodes` with the `running` work loaded: `by_node` holds each node's running work, the
        nodes in the order the workloads first reach them, a workload once per pod it has there; `loaded`,
        when the caller has summed it already, is `running_sums(running)`."""
        self.nodes: dict[str, NodeState] = {}
        # GPUs, CPUs, memory of schedulable nodes, before running work
        self.capacity_gpu = 0.0
        self.capacity_cpu = 0.0
        self.capacity_memory = 0.0
        self.buckets: dict[str, dict[int, dict[str, None]]] = {}
        self.partial_nodes: dict[str, None] = {}
        self.holding_nodes: dict[str, None] = {}
        self.holding_by_count: dict[int, dict[str, None]] = {}  # holding nodes by GPUs whole once released
        self.free_total = 0.0  # free GPUs on schedulable nodes
        self.held_total = 0.0  # GPUs on schedulable nodes that stopping work holds
        self.held_generation = 0  # bumped whenever GPUs become held (an eviction)
        self.domains: dict[str, dict[str, Domain]] = {}  # label -> value -> Domain, see track()
        self.generation = 0  # bumped whenever capacity is given back, so cached "does not fit" expires
        self.freed: list[str] = []  # the nodes where capacity was given back, in order (may repeat)
        self._log: list[Callable[[], None]] = []
        self.reservation: Reservation | None = None
        # The earliest time at which a time-dependent test this cycle made (a minimum runtime reached, a
        # backfill window closed) would come out otherwise; until then the same snapshot decides the same.
        self.horizon = float("inf")
        self.island = 0  # GPUs in the largest NVLink island of any schedulable node
        self.accounted: list[str] = []  # the queues whose work was allocated or taken back, in order
        self.evicted: dict[int, str] = {}
        # Spread groups' members placed (+1) or taken off (-1) this cycle, by group and node (see `spread`).
        self.group_moves: dict[int, dict[str, int]] = {}
        self.lost_nodes = 0  # nodes lost or unhealthy (GANG_LOST_STATES)
        self.unknown_nodes = 0  # nodes that running work is on but the snapshot lacks
        queues = list(queues)
        self.parents = {q.name: q.parent for q in queues}
        self.chains: dict[str, tuple[str, ...]] = {q.name: self._chain(q.name) for q in queues}
        self.alloc: dict[str, list[float]] = {q.name: [0.0, 0.0, 0.0] for q in queues}
        self.alloc_np: dict[str, list[float]] = {q.name: [0.0, 0.0, 0.0] for q in queues}
        self._load_queues(running_sums(running) if loaded is None else loaded)
        self._add_nodes(nodes, by_node if by_node is not None else {})

    # -- construction ---------------------------------------------------------------------------------

    def _chain(self, name: str) -> tuple[str, ...]:
        chain = [name]
        seen = {name}
        parent = self.parents.get(name)
        while parent is not None and parent in self.parents and parent not in seen:
            chain.append(parent)
            seen.add(parent)
            parent = self.parents.get(parent)
        return tuple(chain)

    def chain(self, queue: str) -> tuple[str, ...]:
        found = self.chains.get(queue)
        if found is None:
            self.chains[queue] = found = (queue,)
            self.alloc.setdefault(queue, [0.0, 0.0, 0.0])
            self.alloc_np.setdefault(queue, [0.0, 0.0, 0.0])
        return found

    def _new_node(self, view: NodeView) -> _NodeTemplate:
        """A node as its view gives it, counted in the capacity, not yet in the placement indexes."""
        t = _template(view)
        return self._counted(NodeState(view, t))

    def _counted(self, node: NodeState) -> _NodeTemplate:
        """`node` in the state, counted in the capacity as its view gives it."""
        t = node.template
        view = node.view
        self.nodes[view.name] = node
        if view.schedulable:
            if t.island > self.island:
                self.island = t.island
            self.capacity_gpu += t.free_sum
            self.capacity_cpu += view.cpus - view.cpus_allocated
            self.capacity_memory += view.memory_bytes - view.memory_allocated
        return t

    def _add_nodes(self, views: Iterable[NodeView], by_node: dict[str, list[WorkloadView]]) -> None:
        """The nodes with their running work (`by_node`, see `__init__`), each put in the placement indexes
        once.

        The indexes and totals come out exactly as when every node was indexed as its view gives it, in
        the views' order, and then each node with work was loaded alone, in `by_node`'s order, taken out
        of the indexes and put back in that order: the index keys are created in the same order (a node's
        own count as its view gives it, even if it is loaded before it is indexed), each index lists the
        nodes without work in the views' order and then those with work in `by_node`'s order, and the
        free and held totals take the same sums in the same order.

        Two memories make this cheap when little changes between cycles (the simulator passes the same
        views cycle after cycle; the control loop's running views carry attained service, so they miss):
        - a node that the last cycle using it left unchanged (`park`), with the same view and the same
          running work, is taken as it is: it holds what building and loading it again would give;
        - otherwise a node whose view and running work are those of the last cycle that loaded it takes
          the loaded values from memory: the same arithmetic in the same order gave them."""
        nodes = self.nodes
        free_total = 0.0
        parked = _POOL.take()
        lost = 0
        for view in views:
            name = view.name
            if view.state in GANG_LOST_STATES:
                lost += 1
            on_node = by_node.get(name)
            node = parked.get(name)
            if (
                node is not None
                and not node.dirty
                and node.view is view
                and node.name == name
                and (same_work(node.workloads, on_node) if on_node is not None else not node.workloads)
            ):
                del parked[name]  # a view listed twice gets a node of its own
                t = self._counted(node)
            else:
                t = self._new_node(view)
            if not view.schedulable:
                continue
            free_total += t.free_sum
            if on_node is not None:
                _bucket(self.buckets, t.model, t.whole)  # its keys, made as indexing it now would
            else:
                _enter(self.buckets, self.partial_nodes, self.holding_by_count, nodes[name])
        self.lost_nodes = lost
        touched: list[NodeState] = []
        for name, on_node in by_node.items():
            node = nodes.get(name)
            if node is None:
                self.unknown_nodes += 1
                continue
            touched.append(node)
            if node.schedulable:
                free_total -= node.template.free_sum
            if node.workloads:
                continue  # taken from the last cycle, loaded
            known = _LOADED.get(name)
            if known is not None and known.view is node.view and same_work(known.workloads, on_node):
                known.restore(node)
                node.workloads = known.workloads
            else:
                _load(node, on_node)
                node.recount()
                if len(_LOADED) >= MAX_TEMPLATES:
                    _LOADED.clear()
                loaded = _LOADED[name] = _Loaded(node, list(on_node))
                node.workloads = loaded.workloads
        self.free_total = free_total
        for node in touched:
            self._index(node)

    def park(self) -> None:
        """The cycle is over: leave its nodes for the next cycle to take those it left unchanged (see
        `_add_nodes`). Nothing of this state may be used after."""
        _POOL.nodes = self.nodes

    def track(self, label: str) -> dict[str, Domain]:
        """The domains of `label` (values on schedulable nodes), kept current from now on."""
        found = self.domains.get(label)
        if found is None:
            found = self.domains[label] = {}
            # Walk the state's indexes in their own order: each domain's indexes start in the same order.
            for model, by_count in self.buckets.items():
                for count, names in by_count.items():
                    for name in names:
                        domain = self._domain(found, label, self.nodes[name])
                        if domain is not None:
                            domain.buckets.setdefault(model, {}).setdefault(count, {})[name] = None
            for name in self.partial_nodes:
                domain = self._domain(found, label, self.nodes[name])
                if domain is not None:
                    domain.partial_nodes[name] = None
            for count, names in self.holding_by_count.items():
                for name in names:
                    domain = self._domain(found, label, self.nodes[name])
                    if domain is not None:
                        domain.holding_by_count.setdefault(count, {})[name] = None
            for node in self.nodes.values():
                domain = self._domain(found, label, node) if node.schedulable else None
                if domain is not None:
                    domain.free += node.free_sum
                    domain.held += node.held_sum
        return found

    def _domain(self, domains: dict[str, Domain], label: str, node: NodeState) -> Domain | None:
        value = node.labels.get(label)
        if value is None:
            return None
        found = domains.get(value)
        if found is None:
            found = domains[value] = Domain()
        return found

    def _index(self, node: NodeState) -> None:
        if not node.schedulable:
            return
        _enter(self.buckets, self.partial_nodes, self.holding_by_count, node)
        if node.holding:
            self.holding_nodes[node.name] = None
        self.free_total += node.free_sum
        self.held_total += node.held_sum
        for label, domains in self.domains.items():
            domain = self._domain(domains, label, node)
            if domain is not None:
                domain.free += node.free_sum
                domain.held += node.held_sum
                _enter(domain.buckets, domain.partial_nodes, domain.holding_by_count, node)

    def _unindex(self, node: NodeState) -> None:
        if not node.schedulable:
            return
        holding = self.holding_nodes.pop(node.name, 0) is None
        _leave(self.buckets, self.partial_nodes, self.holding_by_count, node, holding)
        self.free_total -= node.free_sum
        self.held_total -= node.held_sum
        for label, domains in self.domains.items():
            domain = self._domain(domains, label, node)
            if domain is not None:
                domain.free -= node.free_sum
                domain.held -= node.held_sum
                _leave(domain.buckets, domain.partial_nodes, domain.holding_by_count, node, holding)

    def _load_queues(self, totals: Loaded) -> None:
        """Account the running workloads of the snapshot to their queues, from their sums (no undo)."""
        for queue, preemptible, row in totals:
            for name in self.chain(queue):
                for target in (self.alloc[name], None if preemptible else self.alloc_np[name]):
                    if target is not None:
                        target[0] += row.gpu
                        target[1] += row.cpu
                        target[2] += row.memory

    def expires(self, at: float) -> None:
        """Note that a decision of this cycle depends on the clock staying before `at`."""
        if at < self.horizon:
            self.horizon = at

    # -- undo log -------------------------------------------------------------------------------------

    def checkpoint(self) -> int:
        return len(self._log)

    def rollback(self, checkpoint: int) -> None:
        while len(self._log) > checkpoint:
            self._log.pop()()

    def commit(self) -> None:
        """Keep everything done so far: the undo log is emptied (its entries refer back to the state)."""
        self._log.clear()

    # -- tentative operations -------------------------------------------------------------------------

    def allocate(
        self, workload: WorkloadView, pods: tuple[PodPlacement, ...], *, after_release: bool = False
    ) -> None:
        """Give `pods` to `workload`; `after_release` lets it take GPUs held by stopping work."""
        taken = self._apply(workload, pods, sign=-1.0, use_held=after_release)
        self._account(workload, +1.0)
        self._group_move(workload.spread_group, pods, +1)

        def undo() -> None:
            self._restore(taken)
            self._account(workload, -1.0)
            self.generation += 1
            self.freed.extend(pod.node for pod in pods)
            self._group_move(workload.spread_group, pods, -1)

        self._log.append(undo)

    def evict(self, workload: WorkloadView, code: str) -> None:
        """Stop a running workload: its resources become held (released once it has stopped)."""
        self.evicted[workload.id] = code
        self.held_generation += 1
        moved = self._apply(workload, workload.placement, sign=0.0, held=True)
        self._account(workload, -1.0)
        self._group_move(workload.spread_group, workload.placement, -1)

        def undo() -> None:
            self._restore(moved)
            self._account(workload, +1.0)
            del self.evicted[workload.id]
            self._group_move(workload.spread_group, workload.placement, +1)

        self._log.append(undo)

    def release(self, workload: WorkloadView, pods: tuple[PodPlacement, ...]) -> None:
        """Take back an allocation made this cycle (a bind not yet carried out): free again at once."""
        self.evicted[workload.id] = "retract"
        freed = self._apply(workload, pods, sign=1.0)
        self._account(workload, -1.0)
        self.generation += 1
        self.freed.extend(pod.node for pod in pods)
        self._group_move(workload.spread_group, pods, -1)

        def undo() -> None:
            self._restore(freed)
            self._account(workload, +1.0)
            del self.evicted[workload.id]
            self._group_move(workload.spread_group, pods, +1)

        self._log.append(undo)

    def _group_move(self, group: int | None, pods: tuple[PodPlacement, ...], sign: int) -> None:
        if group is None:
            return
        moves = self.group_moves.setdefault(group, {})
        for pod in pods:
            moves[pod.node] = moves.get(pod.node, 0) + sign

    def spread(self, group: int) -> frozenset[str]:
        """The nodes where a member of spread group `group` runs now: running when the cycle began (and not
        stopping or evicted since), or placed this cycle. Read from every node's work: call it only for
        workloads of a group."""
        count: dict[str, int] = dict(self.group_moves.get(group, {}))
        for name, node in self.nodes.items():
            for w in node.workloads:
                if w.spread_group == group and not w.stopping:
                    count[name] = count.get(name, 0) + 1
        return frozenset(name for name, n in count.items() if n > 0)

    # -- resource bookkeeping -------------------------------------------------------------------------

    def _apply(
        self,
        workload: WorkloadView,
        pods: tuple[PodPlacement, ...],
        *,
        sign: float,
        held: bool = False,
        use_held: bool = False,
    ) -> list[tuple[NodeState, int, float, float, float, float]]:
        """Change free/held on each pod's GPUs, CPUs and memory; returns (node, pos, dfree, dheld, dcpu,
        dmem) records: one per GPU (pos >= 0, dcpu and dmem 0), then one per pod for its CPUs and memory
        (pos -1, dfree and dheld being the changes of the node's held CPUs and memory)."""
        records = []
        for pod in pods:
            node = self.nodes.get(pod.node)
            if node is None:
                continue
            self._unindex(node)
            node.dirty = True
            for index in pod.gpu_indices:
                pos = node.position.get(index)
                if pos is None:
                    continue
                amount = pod.gpu_fraction
                if sign == 0.0:  # evict: the amount moves from "in use" to "held"
                    d_free, d_held = 0.0, amount
                elif sign > 0.0:  # release: the amount is free again at once
                    d_free, d_held = amount, 0.0
                elif use_held:
                    from_held = min(node.held[pos], amount)
                    d_free, d_held = -(amount - from_held), -from_held
                else:
                    d_free, d_held = -amount, (amount if held else 0.0)
                node.free[pos] += d_free
                node.held[pos] += d_held
                records.append((node, pos, d_free, d_held, 0.0, 0.0))
            cpus = workload.cpus
            memory = float(workload.memory_bytes)
            d_cpu_held = d_mem_held = 0.0
            if sign == 0.0:  # evict: in use -> held
                d_cpu = d_mem = 0.0
                d_cpu_held, d_mem_held = cpus, memory
            elif sign > 0.0:
                d_cpu, d_mem = cpus, memory
            elif use_held:
                d_cpu_held = -min(node.cpus_held, cpus)
                d_mem_held = -min(node.memory_held, memory)
                d_cpu, d_mem = -(cpus + d_cpu_held), -(memory + d_mem_held)
            else:
                d_cpu, d_mem = -cpus, -memory
            node.cpus_free += d_cpu
            node.memory_free += d_mem
            node.cpus_held += d_cpu_held
            node.memory_held += d_mem_held
            records.append((node, -1, d_cpu_held, d_mem_held, d_cpu, d_mem))
            node.recount()
            self._index(node)
        return records

    def _restore(self, records: list[tuple[NodeState, int, float, float, float, float]]) -> None:
        touched: dict[str, NodeState] = {}
        for node, _, _, _, _, _ in records:
            if node.name not in touched:
                touched[node.name] = node
                node.dirty = True
                self._unindex(node)
        for node, pos, d_free, d_held, d_cpu, d_mem in reversed(records):
            if pos >= 0:
                node.free[pos] -= d_free
                node.held[pos] -= d_held
            else:  # a pod's CPUs and memory: d_free and d_held are the held CPUs' and memory's changes
                node.cpus_held -= d_free
                node.memory_held -= d_held
            node.cpus_free -= d_cpu
            node.memory_free -= d_mem
        for node in touched.values():
            node.recount()
            self._index(node)

    def _account(self, workload: WorkloadView, sign: float) -> None:
        scale = workload.nodes * sign
        gpu = workload.gpus.count * scale
        cpu = workload.cpus * scale
        memory = workload.memory_bytes * scale
        self.accounted.append(workload.queue)
        for name in self.chain(workload.queue):
            row = self.alloc[name]
            row[0] += gpu
            row[1] += cpu
            row[2] += memory
            if not workload.preemptible:
                row_np = self.alloc_np[name]
                row_np[0] += gpu
                row_np[1] += cpu
                row_np[2] += memory

    # -- queries --------------------------------------------------------------------------------------

    def allocated(self, queue: str, resource: str = "gpu") -> float:
        row = self.alloc.get(queue)
        if row is None:
            return 0.0
        return row[0] if resource == "gpu" else row[RESOURCES.index(resource)]

    def allocated_np(self, queue: str, resource: str = "gpu") -> float:
        row = self.alloc_np.get(queue)
        if row is None:
            return 0.0
        return row[0] if resource == "gpu" else row[RESOURCES.index(resource)]

    def releasing(self) -> Iterator[str]:
        """Schedulable nodes with GPUs whole once stopping work has released them (free ones included),
        each once."""
        for by_count in self.buckets.values():
            for count, names in by_count.items():
                if count > 0:
                    for name in names:
                        if name not in self.holding_nodes:
                            yield name
        for count, names in self.holding_by_count.items():
            if count > 0:
                yield from names

    def largest_free_block(self) -> tuple[int, str | None]:
        """The most whole free GPUs of one model on one schedulable node (a pod's GPUs are of one model:
        placement.Placer._one_model), and that node."""
        best, where = 0, None
        for model, by_count in self.buckets.items():
            for count, names in by_count.items():
                if not names or count <= best:
                    continue
                if model != MIXED:
                    best, where = count, next(iter(names))
                    continue
                for name in names:
                    node = self.nodes[name]
                    per_model: dict[tuple[str, int], int] = {}
                    for i, free in enumerate(node.free):
                        if free >= 1.0 - EPSILON:
                            per_model[node.signature[i]] = per_model.get(node.signature[i], 0) + 1
                    most = max(per_model.values(), default=0)
                    if most > best:
                        best, where = most, name
        return best, where

    def free_gpus(self) -> float:
        return max(0.0, self.free_total)

    def held_gpus(self) -> float:
        return max(0.0, self.held_total)

    def whole_free(self, families: frozenset[str]) -> int:
        """Entirely free GPUs on schedulable nodes whose GPUs are of these families (any when empty)."""
        total = 0
        for model, by_count in self.buckets.items():
            if families and model not in families and model != MIXED:
                continue
            total += sum(count * len(names) for count, names in by_count.items())
        return total
