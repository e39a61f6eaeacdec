"""Victim order: the key orders victims as the work they would lose does, without the clock, and the
nodes' order by first victim, which starts from the last cycle's, gives what sorting afresh gives."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.scheduler import Snapshot, WorkloadView
from gpupool.scheduler.cycle import _of_queue, _split_by_queue
from gpupool.scheduler.snapshot import GpuDemand, GpuView, NodeView, PodPlacement
from gpupool.scheduler.victims import Victims, _by_first

NAN = float("nan")

_VIEWS = st.builds(
    lambda i, units, priority, start, checkpoint: WorkloadView(
        i,
        "q",
        priority,
        0.0,
        gpus=GpuDemand(units),
        start_time=start,
        last_checkpoint_time=None if checkpoint is None or start is None else start + checkpoint,
        placement=(PodPlacement("n1", (0,)),),
    ),
    st.integers(1, 10_000),
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 8.0]),
    st.integers(0, 2),
    st.one_of(st.none(), st.integers(0, 50_000).map(float)),
    st.one_of(st.none(), st.integers(0, 20_000).map(float)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_VIEWS, min_size=1, max_size=12, unique_by=lambda v: v.id), st.integers(70_000, 200_000))
def test_victims_are_ordered_by_the_work_they_would_lose(views: list[WorkloadView], now: int) -> None:
    """Fewest GPUs, lowest priority, least work lost (GPUs times the time since the last checkpoint or
    start: integral times here, so no rounding ties), latest started, then the id, at any clock."""
    victims = Victims(Snapshot(nodes=(), pending=()), float(now))

    def by_loss(v: WorkloadView) -> tuple[float, ...]:
        started = v.start_time if v.start_time is not None else 0.0
        return (v.gpu_units, v.priority, victims._lost(v), -started, v.id)

    assert sorted(views, key=victims._victim_key) == sorted(views, key=by_loss)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_VIEWS, min_size=1, max_size=12, unique_by=lambda v: v.id),
    st.integers(70_000, 200_000),
    st.integers(70_000, 200_000),
)
def test_a_key_kept_on_a_view_is_its_key_at_any_clock(
    views: list[WorkloadView], first: int, second: int
) -> None:
    """A view keeps its victim key once asked (the simulator asks the same views cycle after cycle); one
    without a start or checkpoint time, whose key reads the clock, keeps none: asked again at another
    clock, every view gives what a copy that kept nothing gives."""
    for now in (first, second):
        victims = Victims(Snapshot(nodes=(), pending=()), float(now))
        afresh = [replace(v) for v in views]
        assert [victims._victim_key(v) for v in views] == [victims._victim_key(v) for v in afresh]
    assert all((v.victim_key is None) == (v.start_time is None) for v in views)


# Each node's first key is drawn from a pool of key objects, as the victim index reuses a node's key
# object while its victims stay the same: some keys tie (two nodes, one key value) or hold a NaN, which
# the remembered order must not paper over.
_KEYS = [(float(i % 4), 0.0, -float(i), 0.0, i) for i in range(20)]
_KEYS[7] = (1.0, 0.0, NAN, 0.0, 7)
_KEYS[11] = (*_KEYS[12][:-1], 12)  # a tie of value, not of object
_NAMES = [f"n{i}" for i in range(10)]
_CYCLES = st.lists(
    st.dictionaries(st.sampled_from(_NAMES), st.integers(0, len(_KEYS) - 1), max_size=10),
    min_size=1,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(_CYCLES)
def test_nodes_by_first_victim_are_what_sorting_gives_cycle_after_cycle(cycles: list[dict[str, int]]) -> None:
    carried: dict[str, int] = {}
    for drawn in cycles:
        picks = {**carried, **drawn}  # most nodes keep their first victim from one cycle to the next
        firsts = [(_KEYS[k], name) for name, k in picks.items()]
        expected = [name for _, name in sorted(firsts)]
        for _ in range(2):  # and again with nothing changed
            assert _by_first(list(firsts)) == expected
        carried = dict(list(picks.items())[1:])


def _on(node: str, i: int, units: float, start: float) -> WorkloadView:
    return WorkloadView(
        i, "q", 0, 0.0, gpus=GpuDemand(units), placement=(PodPlacement(node, (0,)),), start_time=start
    )


def test_a_node_whose_victims_changed_is_ordered_again() -> None:
    """A node's victim order is taken from the last cycle only for the very same victims: one finished and
    another started in its place (as many as before) are ordered again."""
    nodes = tuple(
        NodeView(name, True, tuple(GpuView(k, "H100", 80 * 10**9) for k in range(8))) for name in ("n1", "n2")
    )

    def index(running: list[WorkloadView]) -> list[tuple[str, list[int]]]:
        found = Victims(Snapshot(nodes, (), running=tuple(running)), 10_000.0)._victim_index()
        return [(node, [v.id for v in victims]) for node, victims in found.items()]

    early, late, big = _on("n1", 1, 1.0, 100.0), _on("n1", 2, 1.0, 5_000.0), _on("n1", 3, 2.0, 9_000.0)
    other = _on("n2", 4, 1.0, 9_900.0)
    # Fewest GPUs first, and of those the latest started (the least work lost); n2's first victim has
    # lost less than n1's, so n2 comes first.
    assert index([early, late, big, other]) == [("n2", [4]), ("n1", [2, 1, 3])]
    later = _on("n1", 5, 1.0, 9_950.0)  # 2 finished, 5 started: n1 has as many victims as before
    assert index([early, later, big, other]) == [("n1", [5, 1, 3]), ("n2", [4])]


def test_victims_whose_keys_read_the_clock_are_ordered_again_at_each_cycle() -> None:
    """A node's order is kept from one cycle to the next only where no victim's key reads the clock: work
    with no start or checkpoint time counts as checkpointed now, so beside work whose start the head's
    clock has not reached yet (an agent's clock ahead of it) it loses less at first and more later."""
    nodes = (NodeView("n1", True, tuple(GpuView(k, "H100", 80 * 10**9) for k in range(8))),)
    timeless = _on("n1", 1, 1.0, 5_000.0)
    no_time = WorkloadView(2, "q", 0, 0.0, gpus=GpuDemand(1.0), placement=(PodPlacement("n1", (1,)),))
    running = (timeless, no_time)

    def order(now: float) -> list[int]:
        found = Victims(Snapshot(nodes, (), running=running), now)._victim_index()
        return [v.id for v in found["n1"]]

    assert order(1_000.0) == [1, 2]  # 2 counts as checkpointed at 1,000; 1 as checkpointed at 5,000
    assert order(10_000.0) == [2, 1]  # now 2 as checkpointed at 10,000, later than 1
    assert order(1_000.0) == [1, 2]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["n1", "n2", "n3", "n4"]), st.sampled_from(["a", "b", "c"])),
        max_size=30,
    ),
    st.sampled_from(["a", "b", "c", "d"]),
)
def test_one_queues_victims_filtered_alone_are_those_of_the_split_of_all(
    pods: list[tuple[str, str]], queue: str
) -> None:
    """Preempt takes a queue's victims by node either filtered out alone (the first queues a cycle asks
    for) or from the split of every queue's at once: the same nodes and lists, in the same order."""
    by_node: dict[str, list[WorkloadView]] = {}
    for i, (node, owner) in enumerate(pods):
        view = WorkloadView(i + 1, owner, 0, 0.0, placement=(PodPlacement(node, (0,)),))
        by_node.setdefault(node, []).append(view)
    alone = _of_queue(by_node, queue)
    split = _split_by_queue(by_node).get(queue, {})
    assert list(alone.items()) == list(split.items())
    assert all(v.queue == queue for on_node in alone.values() for v in on_node)
    assert sum(len(on_node) for on_node in alone.values()) == sum(owner == queue for _, owner in pods)
