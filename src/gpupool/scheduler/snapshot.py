"""What the scheduler sees and what it decides: plain, immutable data.

The control loop (or the simulator) builds a `Snapshot`; `decide(snapshot, now)` returns `Decisions`.
Resources are counted in three units: GPUs (a fraction of one GPU counts as that fraction), CPU cores,
and memory bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

RESOURCES: Final = ("gpu", "cpu", "memory")


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU. `allocated` (0..1) is use the scheduler does not own (foreign jobs); placements of
    `Snapshot.running` workloads are added on top by the scheduler itself."""

    index: int
    model: str
    memory_bytes: int
    nvlink_island: int = 0
    allocated: float = 0.0

    @property
    def free(self) -> float:
        return 1.0 - self.allocated


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as placement sees it; only `schedulable` nodes take new work.

    `cpus_allocated` / `memory_allocated`, like `GpuView.allocated`, are use outside `Snapshot.running`.
    """

    name: str
    schedulable: bool
    gpus: tuple[GpuView, ...]
    cpus: float = 0.0
    memory_bytes: int = 0
    cpus_allocated: float = 0.0
    memory_allocated: int = 0
    state: str = "ready"
    labels: tuple[tuple[str, str], ...] = ()

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None


@dataclass(frozen=True, slots=True)
class Share:
    """A queue's entitlement in one resource."""

    quota: float = 0.0  # guaranteed ("deserved"); never reclaimed from the queue
    limit: float | None = None  # hard cap, borrowed capacity included; None = no cap
    weight: float = 1.0  # over-quota weight: share of capacity left after every quota is met


@dataclass(frozen=True, slots=True)
class QueueView:
    """A queue (team or project) in a hierarchy; leaves hold workloads, parents aggregate them."""

    name: str
    parent: str | None = None
    priority: int = 0  # higher tiers take over-quota leftovers first
    gpu: Share = field(default_factory=Share)
    cpu: Share = field(default_factory=Share)
    memory: Share = field(default_factory=Share)
    # Within the queue, after priority: "fifo", "attained", ... (see SchedulerConfig); None = the config's.
    ordering: str | None = None
    min_runtime_preempt: float | None = None  # seconds before preempt may take a workload; None = parent's
    min_runtime_reclaim: float | None = None  # likewise for reclaim; None = parent's (0 at the root)
    usage: float = 0.0  # decayed historical GPU-seconds (decayed by the caller); tilts the over-quota split

    def share(self, resource: str) -> Share:
        if resource == "gpu":
            return self.gpu
        if resource == "cpu":
            return self.cpu
        if resource == "memory":
            return self.memory
        share: Share = getattr(self, resource)  # not a resource: AttributeError, as getattr gives
        return share


@dataclass(frozen=True, slots=True)
class GpuDemand:
    """GPUs per pod: `count` whole GPUs, or a fraction (< 1) of one; optional model and memory constraints."""

    count: float = 0.0
    models: tuple[str, ...] = ()
    min_memory_bytes: int | None = None

    # Written out, as the dataclass would generate them, so that mypyc compiles them: placement looks
    # demands up by value in every cycle (the generated ones run interpreted).
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GpuDemand):
            return NotImplemented
        return (
            self.count == other.count
            and self.models == other.models
            and self.min_memory_bytes == other.min_memory_bytes
        )

    def __hash__(self) -> int:
        return hash((self.count, self.models, self.min_memory_bytes))

    @property
    def is_fractional(self) -> bool:
        return 0 < self.count < 1


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where one pod of a gang runs: GPU indices on a node, each giving `gpu_fraction` of itself."""

    node: str
    gpu_indices: tuple[int, ...] = ()
    gpu_fraction: float = 1.0


ANY_GPU: Final = GpuDemand()  # the default demand, no GPU (immutable, so one object serves every view)
# Any node: the empty `node_names` every view without a node list shares. Each `frozenset()` is a new object
# (CPython keeps no empty singleton), and the cycle compares node lists of workload after workload: two
# views that share this one compare by identity, where two empty sets of their own compare by value.
ANY_NODE: Final[frozenset[str]] = frozenset()


@dataclass(slots=True, unsafe_hash=True)
class WorkloadView:
    """A workload: pending when `placement` is empty, running otherwise.

    A gang has `nodes` pods, one per node (the job contract's NODE_RANK), each with the per-pod resources
    below. `stopping` work still holds its GPUs but no longer counts toward its queue's allocation (it will
    be pending again soon); it does count as demand for fair share.

    A value like the other views (equal and hashed by its fields; change one with `dataclasses.replace`),
    though not declared frozen: a frozen dataclass's generated `__init__` sets each of the 22 fields
    through `object.__setattr__`, interpreted even where this module runs compiled, and the simulator
    builds hundreds of thousands of views (2.0 us each, against 0.04 us for the `__init__` written out
    below, which mypyc compiles; docs/benchmarks.md "Simulator"). Nothing assigns to a view's fields."""

    id: int
    queue: str
    priority: int
    submit_time: float
    nodes: int = 1
    gpus: GpuDemand = ANY_GPU  # per pod
    cpus: float = 0.0  # per pod
    memory_bytes: int = 0  # per pod
    preemptible: bool = True
    topology: str | None = None  # node label (e.g. "rack") every pod must share
    topology_preferred: str | None = None  # node label the pods should share when they can
    node_names: frozenset[str] = ANY_NODE  # only these nodes (empty: any), like Slurm's --nodelist
    max_duration: float | None = None  # declared limit in seconds; lets backfill reason about end times
    attained_service: float = 0.0  # GPU-seconds received so far (Tiresias' attained service)
    duration_estimate: float | None = None  # seconds, from a predictor (or an oracle in simulation)
    # Running workloads only:
    placement: tuple[PodPlacement, ...] = ()
    start_time: float | None = None  # when the current attempt started
    last_checkpoint_time: float | None = None  # work since then is lost if evicted
    stopping: bool = False  # an eviction is under way: resources still held, soon released
    # Stopping work only: the pending workload its GPUs are for, if any: the one its eviction was for
    # (Eviction.for_workload), or one that a later cycle promised them to (Decisions.released_to).
    evicted_for: int | None = None
    # Pending work only: work stopping for it (its `evicted_for` was this workload) has stopped since the
    # last cycle, so the GPUs it released are free now: still this workload's room, served first.
    victims_stopped: bool = False
    # The replicas of one service share it (its id): each replica's pod prefers a node where no other
    # running replica of the group is, so that one node lost does not take them all. None: no group.
    spread_group: int | None = None
    # The id as one Python object, made once with the view, for the dicts a cycle keeps by workload (the
    # work left to place, the explanations) and asks hundreds of times a cycle: asked with the same object
    # they were filled with, they match it by identity. Compiled, each read of `id` makes a new int object,
    # which a dict must compare by value. Not a value of the view: not compared, hashed or shown.
    key: Any = field(init=False, repr=False, compare=False)
    # The view's victim key (`Victims._victim_key`), kept once first asked where it does not depend on the
    # clock: the simulator keeps a running view from cycle to cycle, and the cycles sort victims by it.
    # Not a value of the view either.
    victim_key: tuple[float, ...] | None = field(init=False, repr=False, compare=False)
    # GPUs the whole gang takes, in GPU units (fractions count as fractions): `gpus.count` times `nodes`,
    # worked out once with the view (a cycle asks it of each workload several times).
    gpu_units: float = field(init=False, repr=False, compare=False)

    def __init__(
        self, id: int, queue: str, priority: int, submit_time: float, nodes: int = 1,
        gpus: GpuDemand = ANY_GPU, cpus: float = 0.0, memory_bytes: int = 0, preemptible: bool = True,
        topology: str | None = None, topology_preferred: str | None = None,
        node_names: frozenset[str] = ANY_NODE, max_duration: float | None = None,
        attained_service: float = 0.0, duration_estimate: float | None = None,
        placement: tuple[PodPlacement, ...] = (), start_time: float | None = None,
        last_checkpoint_time: float | None = None, stopping: bool = False, evicted_for: int | None = None,
        victims_stopped: bool = False, spread_group: int | None = None,
    ) -> None:  # fmt: skip
        self.id = id
        self.queue = queue
        self.priority = priority
        self.submit_time = submit_time
        self.nodes = nodes
        self.gpus = gpus
        self.cpus = cpus
        self.memory_bytes = memory_bytes
        self.preemptible = preemptible
        self.topology = topology
        self.topology_preferred = topology_preferred
        self.node_names = node_names if node_names else ANY_NODE
        self.max_duration = max_duration
        self.attained_service = attained_service
        self.duration_estimate = duration_estimate
        self.placement = placement
        self.start_time = start_time
        self.last_checkpoint_time = last_checkpoint_time
        self.stopping = stopping
        self.evicted_for = evicted_for
        self.victims_stopped = victims_stopped
        self.spread_group = spread_group
        self.key = id
        self.victim_key = None
        self.gpu_units = gpus.count * nodes

    @property
    def running(self) -> bool:
        return bool(self.placement)

    def started(self, placement: tuple[PodPlacement, ...], start_time: float) -> WorkloadView:
        """This workload as running `placement` since `start_time`; the other fields as they are."""
        return self._copy(placement, start_time, self.victims_stopped)

    def with_victims_stopped(self) -> WorkloadView:
        """This pending workload with `victims_stopped` set; the other fields as they are (the simulator
        gives it for each workload whose victims stopped, cycle after cycle)."""
        return self._copy(self.placement, self.start_time, True)

    def _copy(
        self, placement: tuple[PodPlacement, ...], start_time: float | None, victims_stopped: bool
    ) -> WorkloadView:
        """This view with these three fields; the others as they are (a test checks that none is left out).
        Written out: `dataclasses.replace` costs several times more, and a cycle does this for each of its
        own binds."""
        return WorkloadView(
            id=self.id, queue=self.queue, priority=self.priority, submit_time=self.submit_time,
            nodes=self.nodes, gpus=self.gpus, cpus=self.cpus, memory_bytes=self.memory_bytes,
            preemptible=self.preemptible, topology=self.topology, topology_preferred=self.topology_preferred,
            node_names=self.node_names, max_duration=self.max_duration,
            attained_service=self.attained_service, duration_estimate=self.duration_estimate,
            placement=placement, start_time=start_time, last_checkpoint_time=self.last_checkpoint_time,
            stopping=self.stopping, evicted_for=self.evicted_for, victims_stopped=victims_stopped,
            spread_group=self.spread_group,
        )  # fmt: skip

    def demand(self, resource: str) -> float:
        if resource == "gpu":
            return self.gpu_units
        if resource == "cpu":
            return self.cpus * self.nodes
        return float(self.memory_bytes * self.nodes)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """A scheduling policy: which actions run, in what order, and how placement and ordering behave."""

    actions: tuple[str, ...] = ("stale_gang", "allocate", "consolidate", "reclaim", "preempt")
    placement: str = "binpack"  # "binpack" (fill nodes and GPUs) or "spread"
    # Default within-queue order: fifo | attained | las | estimate | sjf-oracle | srtf-oracle
    ordering: str = "fifo"
    blocking: str = "backfill"  # a blocked workload: "skip" others pass it; "strict" nothing passes;
    # "backfill" others pass unless they would delay its reservation (needs max_duration)
    fair_share: bool = True  # order queues by allocated / fair share; False = one FIFO over all queues
    usage_weight: float = 0.0  # 0 ignores history; 1 halves over-quota weight for a queue at twice its share
    max_consolidation_moves: int = 16
    # GPUs that work stopped by preempt, reclaim and consolidate may hold at once while it stops (None: no
    # limit): with that many being released, no more work is stopped until some are; the first eviction of
    # a cycle with nothing stopping always goes ahead, so work larger than the limit still gets its room
    max_stopping_gpus: float | None = None
    las_thresholds: tuple[float, ...] = ()  # discretized attained-service queues (GPU-seconds), for "las"
    # Read by whoever builds the snapshot, not by `decide`, which sees only their effect (gpupool/spec/
    # scheduling.py turns them into workload priorities and queue weights, for the server and the simulator):
    las_preempt: bool = False  # in "las" queues a workload's priority includes its las band, so preempt
    # lets new work evict work of its own queue that has had more GPU-time
    young_weights: tuple[tuple[float, float], ...] = ()  # (GPU-seconds, weight): a queue's over-quota
    # weight counts its young work


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    pending: tuple[WorkloadView, ...]
    queues: tuple[QueueView, ...] = ()
    running: tuple[WorkloadView, ...] = ()
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    # The room an earlier cycle left each of these pending workloads waiting for (its `Decisions.nominated`):
    # a workload served first for released GPUs (`victims_stopped`, or work stopping for it) takes this room
    # when it is free and still suits it, as Kubernetes tries a preemptor's nominated node first; otherwise
    # it is placed afresh.
    nominated: Mapping[int, tuple[PodPlacement, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Bind:
    """Start `workload_id` with one placement per pod."""

    workload_id: int
    pods: tuple[PodPlacement, ...]

    @property
    def node(self) -> str:
        return self.pods[0].node

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return self.pods[0].gpu_indices

    @property
    def gpu_fraction(self) -> float:
        return self.pods[0].gpu_fraction


@dataclass(frozen=True, slots=True)
class Eviction:
    """Stop a running workload (it gets a new attempt later). `code`: reclaim | preempt | consolidate |
    stale-gang; `reason` is one sentence for a person; `for_workload` is the pending workload that gains
    (set for reclaim, preempt and consolidate). The gainer is not bound in the same cycle: it waits with
    `waiting-for-release` until the victims have stopped; a consolidated workload is re-placed later too."""

    workload_id: int
    code: str
    reason: str
    for_workload: int | None = None


class Explanation:
    """Why a workload is still pending: a stable `code` for programs, a `message` for people.

    The sentence may be given, or written when first read: `render(*args)`. A cycle explains every
    workload it leaves pending, and a busy simulation reads none of the sentences; the control loop reads
    them all. Two explanations are equal when their codes and sentences are.
    """

    __slots__ = ("_args", "_message", "_render", "code")

    def __init__(
        self,
        code: str,
        message: str = "",
        render: Callable[..., str] | None = None,
        args: tuple[Any, ...] = (),
    ) -> None:
        self.code = code
        self._message = message
        self._render = render
        self._args = args

    @property
    def message(self) -> str:
        render = self._render
        if render is not None:
            self._message = render(*self._args)
            self._render = None
            self._args = ()
        return self._message

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Explanation):
            return NotImplemented
        return self.code == other.code and self.message == other.message

    def __hash__(self) -> int:
        return hash((self.code, self.message))

    def __repr__(self) -> str:
        return f"Explanation(code={self.code!r}, message={self.message!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Explanation, (self.code, self.message))


@dataclass(slots=True)
class Decisions:
    binds: list[Bind] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    explanations: dict[int, Explanation] = field(default_factory=dict)
    # Fair share per queue and resource, as computed this cycle (leaves and parents).
    fair_shares: dict[str, dict[str, float]] = field(default_factory=dict)
    # Stopping work whose GPUs this cycle promised to a workload it left waiting for them, where that work
    # was stopping for no pending workload (cancelled, drained, or its gainer gone or started): stopping
    # workload id -> the waiting workload. The caller keeps it as the stopping work's `evicted_for`, so
    # that the next cycle serves the waiting workload first, as it serves the gainers of evictions.
    released_to: dict[int, int] = field(default_factory=dict)
    # The room each workload left waiting for released GPUs (`waiting-for-release`) is to take once they are
    # released: pending workload id -> one placement per pod. Given back as the next snapshot's `nominated`,
    # it makes the workload land where its evictions made room, not on room that others' evictions freed.
    nominated: dict[int, tuple[PodPlacement, ...]] = field(default_factory=dict)

    def __init__(
        self,
        binds: list[Bind] | None = None,
        evictions: list[Eviction] | None = None,
        explanations: dict[int, Explanation] | None = None,
        fair_shares: dict[str, dict[str, float]] | None = None,
        released_to: dict[int, int] | None = None,
        nominated: dict[int, tuple[PodPlacement, ...]] | None = None,
    ) -> None:
        """Written out (the fields' defaults as given above, a new empty container each): the generated
        `__init__` of a dataclass with default factories runs interpreted even where this module is
        compiled, and every cycle makes one."""
        self.binds = [] if binds is None else binds
        self.evictions = [] if evictions is None else evictions
        self.explanations = {} if explanations is None else explanations
        self.fair_shares = {} if fair_shares is None else fair_shares
        self.released_to = {} if released_to is None else released_to
        self.nominated = {} if nominated is None else nominated
