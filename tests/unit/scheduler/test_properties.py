"""Scheduler invariants over random small clusters (hypothesis): what no cycle may ever do."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.scheduler import Scheduler, decide
from gpupool.scheduler import fairshare as scheduler_fairshare
from gpupool.scheduler import ordering as scheduler_ordering
from gpupool.scheduler import prepare as scheduler_prepare
from gpupool.scheduler import state as scheduler_state
from gpupool.scheduler import victims as scheduler_victims
from gpupool.scheduler.cycle import Cycle
from gpupool.scheduler.prepare import Prepared
from gpupool.scheduler.snapshot import Decisions, Snapshot, WorkloadView
from gpupool.scheduler.state import ClusterState
from tests.unit.scheduler.invariants import check_decisions, reclaim_problems
from tests.unit.scheduler.scenario_loader import parse_scenario
from tests.unit.scheduler.strategies import NOW, ReclaimCase, reclaim_cases, snapshots

# GPUPOOL_SCHEDULER_EXAMPLES=2000 searches deeper (minutes); the default keeps the file under ~30 s. The
# suite draws the same examples each run; GPUPOOL_HYPOTHESIS=explore draws new ones (tests/conftest.py).
BOUNDED = settings(
    max_examples=int(os.environ.get("GPUPOOL_SCHEDULER_EXAMPLES", "100")),
    deadline=None,
    database=None,  # nothing written into the checkout; a failure prints its reproduction
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _show(snapshot: Snapshot, decisions: Decisions) -> str:
    return f"\nsnapshot: {snapshot}\ndecisions: {decisions}"


@BOUNDED
@given(snapshots())
def test_decisions_never_break_an_invariant(snapshot: Snapshot) -> None:
    """No GPU, CPU or limit over-committed; gangs whole; evictions sane; every unbound workload explained."""
    decisions = decide(snapshot, NOW)
    problems = check_decisions(snapshot, NOW, decisions)
    assert not problems, "\n".join(problems) + _show(snapshot, decisions)


@BOUNDED
@given(snapshots(stopping=False))
def test_reclaim_never_takes_a_queue_below_its_fair_share(snapshot: Snapshot) -> None:
    decisions = decide(snapshot, NOW)
    problems = reclaim_problems(snapshot, decisions)
    assert not problems, "\n".join(problems) + _show(snapshot, decisions)


def test_a_queue_preempting_its_own_work_after_reclaim_is_not_reclaims_doing() -> None:
    """Reclaim takes 1 of queue a's 5.5 GPUs (its fair share is 4.5) for b's gang; then a's own 102
    (priority 50) preempts a's 4-GPU job 2 for one GPU. a ends at 1.5, by its own preemption: the
    invariant judges reclaim by what it took (a hunt found the check blaming reclaim)."""
    scenario = parse_scenario(
        {
            "description": "preempt after reclaim",
            "now": NOW,
            "config": {"blocking": "skip"},
            "nodes": [
                {"name": "n2", "gpus": 2, "labels": {"rack": "r2"}, "foreign": {1: 1.0}},
                {"name": "n4", "gpus": 7, "labels": {"rack": "r2"}, "foreign": {5: 0.5, 6: 1.0}},
            ],
            "queues": [{"name": "a"}, {"name": "b"}],
            "running": [
                {"id": 1, "queue": "a", "gpus": 1, "on": {"n4": [0]}, "priority": 10, "start": 0},
                {"id": 2, "queue": "a", "gpus": 4, "on": {"n4": "1-4"}, "priority": 10, "start": 0},
            ],
            "pending": [
                {"id": 100, "queue": "a", "gpus": 0.25, "priority": 10},
                {"id": 101, "queue": "a", "gpus": 0.25, "priority": 10},
                {"id": 102, "queue": "a", "gpus": 1, "priority": 50},
                {"id": 103, "queue": "b", "gpus": 1, "nodes": 2, "topology": "rack", "priority": 10},
            ],
            "expect": {"evictions": {1: "reclaim for 103", 2: "preempt for 102"}},
        },
        "preempt_after_reclaim",
    )
    decisions = decide(scenario.snapshot, scenario.now)
    assert [(e.workload_id, e.code) for e in decisions.evictions] == [(1, "reclaim"), (2, "preempt")]
    assert reclaim_problems(scenario.snapshot, decisions) == []


@BOUNDED
@given(reclaim_cases())
def test_a_queue_whose_demand_reaches_its_quota_gets_it_within_one_cycle(case: ReclaimCase) -> None:
    """Binds on free GPUs plus evictions in its favour serve the hungry queue's whole quota; with several
    other queues, rounding their fair shares may hold back at most one GPU per extra queue."""
    snapshot = case.snapshot
    decisions = decide(snapshot, NOW)
    hungry = {w.id for w in snapshot.pending}
    bound = {b.workload_id for b in decisions.binds} & hungry
    helped = {e.for_workload for e in decisions.evictions if e.code == "reclaim"} & hungry
    served = len(bound | helped)
    expected = case.quota - (case.others - 1)
    assert served >= expected, (
        f"hungry queue (quota {case.quota}, {case.free} GPUs free, {case.others} other queue(s)) got "
        f"{len(bound)} binds and evictions for {len(helped)} more; expected {expected}"
        + _show(snapshot, decisions)
    )
    assert not check_decisions(snapshot, NOW, decisions)
    assert not reclaim_problems(snapshot, decisions)


@BOUNDED
@given(reclaim_cases(), st.sampled_from([1.0, 2.0, 4.0]))
def test_max_stopping_gpus_bounds_what_one_cycle_stops(case: ReclaimCase, limit: float) -> None:
    """Under `max_stopping_gpus`, the work a cycle stops keeps within the limit (the invariants check each
    gainer's evictions in turn), but the first gainer's always go ahead; a gainer left without room for the
    limit's sake is told so."""
    unlimited = decide(case.snapshot, NOW)
    snapshot = replace(case.snapshot, config=replace(case.snapshot.config, max_stopping_gpus=limit))
    decisions = decide(snapshot, NOW)
    problems = check_decisions(snapshot, NOW, decisions)
    assert not problems, "\n".join(problems) + _show(snapshot, decisions)
    assert bool(decisions.evictions) == bool(unlimited.evictions), _show(snapshot, decisions)
    if len(decisions.evictions) < len(unlimited.evictions):
        codes = {e.code for e in decisions.explanations.values()}
        assert "stopping-limit" in codes, _show(snapshot, decisions)


@BOUNDED
@given(snapshots(pending=False, stopping=False, failures=False))
def test_a_steady_state_evicts_nothing(snapshot: Snapshot) -> None:
    """Healthy nodes, nothing pending, nothing stopping: every queue runs within its fair share."""
    decisions = decide(snapshot, NOW)
    assert not decisions.evictions, _show(snapshot, decisions)


@BOUNDED
@given(snapshots())
def test_a_second_cycle_on_applied_decisions_evicts_nothing_and_binds_nothing(snapshot: Snapshot) -> None:
    """No ping-pong: once binds run and evicted work is stopping, the same state (same clock) gives no
    further evictions. And a cycle does all it can: nothing it left pending starts in the next one, but
    for work that a backfill reservation held back. A reservation is made each cycle for the first
    blocked workload in that cycle's order, and the first cycle's binds may change the queues' order:
    the next cycle may reserve for another workload, or for none, and what the first one held may start
    (a Hypothesis search found it: one queue's work reserved n2, another's was held off it, and once the
    first queue's other work had started the second queue came first). Nor, when the first cycle served
    work whose victims had just stopped (`victims_stopped`, given for that cycle only) ahead of its queue's
    order: what it took room from may start in the next."""
    first = decide(snapshot, NOW)
    applied = apply(snapshot, first)
    second = decide(applied, NOW)
    problems = check_decisions(applied, NOW, second)
    assert not problems, "\n".join(problems) + _show(applied, second)
    assert not second.evictions, f"first cycle: {first}" + _show(applied, second)
    if any(w.victims_stopped for w in snapshot.pending):
        return
    held = {i for i, e in first.explanations.items() if e.code == "reserved"}
    started = [b.workload_id for b in second.binds if b.workload_id not in held]
    assert not started, f"first cycle: {first}" + _show(applied, second)


# Workload 1 of queue x stops for no one: cancelled (stopping in the snapshot), or a gang this very cycle
# evicts because its node n9 was lost (a Hypothesis search found that gap: a gainer of other work, served
# first in the next cycle, took the free GPUs of the waiting workload's room, and reclaim took them back).
STOPS_FOR_NO_ONE = {
    "cancelled": ({"gpus": 2, "on": {"n1": [0, 1]}, "stopping": True}, []),
    "stale gang": ({"gpus": 2, "nodes": 2, "on": {"n1": [0, 1], "n9": [0, 1]}}, [(1, "stale-gang")]),
}


@pytest.mark.parametrize("how", sorted(STOPS_FOR_NO_ONE))
def test_work_waiting_for_the_gpus_of_work_that_stops_for_no_one_keeps_its_room_in_the_next_cycle(
    how: str,
) -> None:
    """b's 10 fits on n1 once 1's GPUs are released, and waits for them there; n1's two free GPUs are
    part of its room, so d's 20 finds none (b's 30 starts on n2). The next cycle, with 30 running, puts
    queue d before b: without the promise of 1's GPUs to 10 (kept as 1's `evicted_for`, as the server
    does), 20 would start on n1's free GPUs and 10 would have lost its room."""
    stopping, evictions = STOPS_FOR_NO_ONE[how]
    first = parse_scenario(
        {
            "description": f"a promise of the GPUs of {how} work",
            "now": NOW,
            "nodes": [
                {"name": "n1", "gpus": 4},
                {"name": "n2", "gpus": 4},
                {"name": "n9", "gpus": 2, "state": "lost"},
            ],
            "queues": [{"name": "b", "gpu": 4}, {"name": "d", "gpu": 4}, {"name": "x", "gpu": 0}],
            "running": [
                {"id": 1, "queue": "x", **stopping},
                {"id": 5, "queue": "x", "gpus": 3, "on": {"n2": [0, 1, 2]}, "preemptible": False},
            ],
            "pending": [
                {"id": 10, "queue": "b", "gpus": 4, "submit": 0},
                {"id": 30, "queue": "b", "gpus": 1, "submit": 1},
                {"id": 20, "queue": "d", "gpus": 2, "submit": 0},
            ],
            "expect": {"released_to": {1: 10}},
        },
        "first",
    )
    decisions = decide(first.snapshot, NOW)
    assert [(e.workload_id, e.code) for e in decisions.evictions] == evictions
    assert [b.workload_id for b in decisions.binds] == [30]
    assert decisions.explanations[10].code == "waiting-for-release"
    assert decisions.released_to == {1: 10}
    second = decide(apply(first.snapshot, decisions), NOW)
    assert not second.binds and not second.evictions
    assert second.explanations[10].message.endswith("(workload 1 stops for it)")
    assert second.released_to == {}  # 1's GPUs are 10's already


def test_room_a_bind_taken_back_leaves_is_walked_again_in_the_same_cycle() -> None:
    """10's victims stopped last cycle, so it is served first and bound on n1's three free GPUs; 20
    (priority 50) then finds none, and 30, over the queue's fair share (10's bind counts), is left too.
    Preempt takes 10's bind back for 20, which needs only two: one GPU is free again and the queue holds
    less. The cycle walks its pending work again, and 30 starts now, not a cycle later."""
    first = parse_scenario(
        {
            "description": "a bind taken back leaves room",
            "now": NOW,
            "config": {"blocking": "skip"},
            "nodes": [{"name": "n1", "gpus": 4}],
            "running": [{"id": 1, "priority": 100, "gpus": 1, "on": {"n1": [0]}, "preemptible": False}],
            "pending": [
                {"id": 10, "priority": 10, "gpus": 3, "submit": 0, "victims_stopped": True},
                {"id": 20, "priority": 50, "gpus": 2, "submit": 0},
                {"id": 30, "priority": 10, "gpus": 1, "submit": 1},
            ],
            "expect": {"binds": {20: None, 30: None}},
        },
        "first",
    )
    decisions = decide(first.snapshot, NOW)
    assert sorted(b.workload_id for b in decisions.binds) == [20, 30]
    assert not decisions.evictions
    assert decisions.explanations[10].code == "no-capacity"
    second = decide(apply(first.snapshot, decisions), NOW)
    assert not second.binds and not second.evictions


def test_released_gpus_are_not_promised_past_work_of_the_queue_ranked_higher() -> None:
    """A Hypothesis search found it. 107 (priority 100) preempts 1, taking back this cycle's binds on the
    way; 100 to 102, ahead of 103 in queue a's line, are left with no room, while 103 waits for cancelled
    4's quarter GPU. Promised that quarter, 103 would be served first in the next cycle and start ahead of
    them (and before the retried binds took their turn in the phase, 106, priority 50, then preempted
    102). No promise is made while work ahead of the waiting workload in its queue is still pending: the
    next cycle starts the head of the line, 100."""
    pending = [{"id": 100 + i, "gpus": 0.25, "priority": 10, "submit": 0} for i in range(6)]
    first = parse_scenario(
        {
            "description": "no promise past the line",
            "now": NOW,
            "nodes": [
                {"name": "n1", "gpus": 3, "labels": {"rack": "r1"}},
                {"name": "n2", "gpus": 1, "labels": {"rack": "r2"}},
            ],
            "running": [
                {"id": 1, "priority": 10, "gpus": 0.25, "on": {"n1": [0]}},
                {"id": 2, "priority": 10, "gpus": 0.5, "on": {"n1": [0]}},
                {"id": 3, "priority": 10, "gpus": 2, "on": {"n1": [1, 2]}},
                {"id": 4, "priority": 10, "gpus": 0.25, "on": {"n2": [0]}, "stopping": True},
            ],
            "pending": [
                *pending,
                {"id": 106, "gpus": 0.25, "priority": 50, "submit": 0},
                {
                    "id": 107,
                    "gpus": 0.5,
                    "nodes": 2,
                    "priority": 100,
                    "topology_preferred": "rack",
                    "submit": 0,
                },
            ],
            "expect": {"evictions": {1: "preempt for 107"}},
        },
        "first",
    )
    decisions = decide(first.snapshot, NOW)
    assert [(e.workload_id, e.for_workload) for e in decisions.evictions] == [(1, 107)]
    assert decisions.explanations[103].code == "waiting-for-release"
    assert decisions.released_to == {}
    second = decide(apply(first.snapshot, decisions), NOW)
    assert not second.evictions
    assert [b.workload_id for b in second.binds] == [100]


@BOUNDED
@given(snapshots())
def test_decide_is_deterministic(snapshot: Snapshot) -> None:
    assert decide(snapshot, NOW) == decide(snapshot, NOW)


@BOUNDED
@given(snapshots(), st.lists(st.integers(0, 60_000), min_size=1, max_size=5))
def test_a_remembered_answer_is_the_answer_decide_gives(snapshot: Snapshot, steps: list[int]) -> None:
    """The control loop's Scheduler answers an unchanged snapshot from memory until something
    time-dependent (a minimum runtime, a backfill window) could change: never a stale answer."""
    scheduler = Scheduler()
    for step in sorted(steps):
        now = NOW + step
        assert scheduler.decide(snapshot, now) == decide(snapshot, now), f"at NOW + {step}"


@BOUNDED
@given(snapshots(), st.lists(st.integers(0, 60_000), min_size=2, max_size=4), st.data())
def test_a_cycle_decides_as_a_first_cycle_would(
    snapshot: Snapshot, steps: list[int], data: st.DataObject
) -> None:
    """What cycles remember for the next (nodes they left unchanged, loaded nodes, victim and pending
    orders, fair shares, what can never fit) changes no answer: cycle after cycle, each snapshot the last
    one with its decisions applied, some running work finished and the clock moved on, as in a replay,
    decides as it does with nothing remembered."""
    current = snapshot
    for step in sorted(steps):
        now = NOW + step
        remembered = decide(current, now)
        _forget()
        assert remembered == decide(current, now), f"at NOW + {step}"
        current = apply(current, remembered, now)
        finished = data.draw(st.sets(st.sampled_from([w.id for w in current.running] or [0])))
        current = replace(current, running=tuple(w for w in current.running if w.id not in finished))


def _forget() -> None:
    scheduler_state._LOADED.clear()
    scheduler_state._POOL.take()
    scheduler_victims._ORDERS.clear()
    scheduler_victims._QUEUE_ORDERS.clear()
    scheduler_victims._by_first([])  # an empty order remembered: the next is made afresh
    scheduler_ordering._LAST.clear()
    scheduler_fairshare._LAST.clear()
    scheduler_fairshare._TREE.clear()
    scheduler_prepare._NODE_ANSWERS.nodes = None
    scheduler_prepare._LAST_PENDING.views = ()


def apply(snapshot: Snapshot, decisions: Decisions, now: float = NOW) -> Snapshot:
    """The next snapshot: bound work runs from `now`; evicted work is stopping (it still holds its GPUs),
    and says which workload its eviction was for, as the server tells the scheduler; stopping work whose
    GPUs were promised to a waiting workload says that one. No victims stopped since (the server gives
    `victims_stopped` for one cycle)."""
    bound = {b.workload_id: b for b in decisions.binds}
    evicted = {e.workload_id: e.for_workload for e in decisions.evictions}
    promised = decisions.released_to
    # work evicted for no one (a stale gang) may have its GPUs promised in the same cycle, as the server
    # records the promise on the attempt it has just asked to stop
    gainer = {wid: promised.get(wid) if gainer is None else gainer for wid, gainer in evicted.items()}
    running = [
        replace(w, stopping=True, evicted_for=gainer[w.id])
        if w.id in evicted
        else replace(w, evicted_for=promised[w.id])
        if w.id in promised
        else w
        for w in snapshot.running
    ]
    running += [
        replace(w, placement=bound[w.id].pods, start_time=now) for w in snapshot.pending if w.id in bound
    ]
    pending = tuple(
        replace(w, victims_stopped=False) if w.victims_stopped else w
        for w in snapshot.pending
        if w.id not in bound
    )
    return replace(snapshot, running=tuple(running), pending=pending)


def _loaded(snapshot: Snapshot) -> object:
    """Everything a cycle's state holds once the snapshot's running work is loaded, orders included."""
    return _contents(Prepared(snapshot, NOW).state)


def _contents(state: ClusterState) -> object:
    nodes = [
        (name, n.free, n.held, n.cpus_free, n.memory_free, n.whole, n.partial, n.free_sum, n.held_sum,
         n.holding, n.released)
        for name, n in state.nodes.items()
    ]  # fmt: skip
    buckets = [
        (model, [(count, list(names)) for count, names in by.items()]) for model, by in state.buckets.items()
    ]
    holding = [(count, list(names)) for count, names in state.holding_by_count.items()]
    return (nodes, buckets, list(state.partial_nodes), holding, list(state.holding_nodes), state.free_total,
            state.held_total, state.alloc, state.alloc_np)  # fmt: skip


@BOUNDED
@given(snapshots(), st.data())
def test_a_node_loaded_from_memory_is_the_node_loaded_afresh(snapshot: Snapshot, data: st.DataObject) -> None:
    """A node whose view and running work are those of the last cycle takes its loaded state from memory
    (the simulator passes the same view objects cycle after cycle). The next snapshot as a replay builds
    it: each running workload kept (the same object), gone, stopping, or its GPUs taken by other work."""
    _loaded(snapshot)  # remembered
    running = []
    for w in snapshot.running:
        fate = data.draw(st.sampled_from(["kept", "gone", "stopping", "other work"]))
        if fate == "kept":
            running.append(w)
        elif fate == "stopping":
            running.append(replace(w, stopping=True))
        elif fate == "other work":
            running.append(replace(w, id=w.id + 1000, cpus=w.cpus + 1, stopping=False))
    later = replace(snapshot, running=tuple(running))
    remembered = _loaded(later)
    scheduler_state._LOADED.clear()
    assert remembered == _loaded(later)


@BOUNDED
@given(snapshots())
def test_nodes_indexed_once_loaded_are_the_nodes_indexed_then_loaded_one_by_one(snapshot: Snapshot) -> None:
    """A cycle's state puts each node in the placement indexes once, after loading its running work; the
    indexes (their orders included) and totals are those of indexing every node as its view gives it and
    then taking each node with work out, loading it and putting it back, in the order work reaches it."""
    scheduler_state._LOADED.clear()
    prepared = Prepared(snapshot, NOW)
    queues = list(prepared.queues.values())
    by_node: dict[str, list[WorkloadView]] = {}
    for w in snapshot.running:
        for pod in w.placement:
            by_node.setdefault(pod.node, []).append(w)
    state = ClusterState(snapshot.nodes, queues, snapshot.running)  # every node as its view gives it
    touched = []
    for name, on_node in by_node.items():
        node = state.nodes.get(name)
        if node is not None:
            touched.append(node)
            state._unindex(node)
            scheduler_state._load(node, on_node)
            node.recount()
    for node in touched:
        state._index(node)
    assert _contents(prepared.state) == _contents(state)


@BOUNDED
@given(snapshots(), st.booleans())
def test_victims_taken_in_the_first_pass_are_those_a_walk_of_the_running_work_finds(
    snapshot: Snapshot, evict_first: bool
) -> None:
    """`Prepared` groups the evictable single-pod work by node, and counts each queue's lowest priority
    among it, in its one pass over the snapshot; the victims a cycle takes from there (with nothing evicted
    yet) and their lowest priorities are those that walking the running work when first asked gives: the
    single-pod work, preemptible, not stopping nor evicted, on schedulable nodes, the nodes in the order
    that work first reaches them, then the cycle's own binds."""
    cycle = Cycle(snapshot, NOW)
    cycle.stale_gang()
    if evict_first:  # then the pass's groups may not serve: the walk is made
        for w in snapshot.running:
            if w.preemptible and not w.stopping:
                cycle._evict(w, "preempt", "a test")
                break
    cycle.allocate()  # binds so far are victims too
    walked: dict[str, list[WorkloadView]] = {}
    for v in snapshot.running:
        if len(v.placement) != 1 or not cycle._evictable(v):
            continue
        node = cycle.state.nodes.get(v.placement[0].node)
        if node is not None and node.schedulable:
            walked.setdefault(node.name, []).append(v)
    binds = cycle._binds_as_victims(gangs=False)
    for v in binds:
        walked.setdefault(v.placement[0].node, []).append(v)
    groups = cycle._victim_groups()
    assert list(groups) == list(walked)
    assert {name: [v.id for v in vs] for name, vs in groups.items()} == {
        name: [v.id for v in vs] for name, vs in walked.items()
    }
    lowest: dict[str, int] = {}
    for vs in walked.values():
        for v in vs:
            lowest[v.queue] = min(lowest.get(v.queue, v.priority), v.priority)
    assert cycle._lowest_victims() == lowest


def test_each_queues_lowest_victim_priority_is_the_lowest_of_all_its_victims() -> None:
    """The pass counts the lowest priority whatever order the work comes in (higher first here), and only
    over the work that may be evicted (not the non-preemptible work at priority 1, nor stopping work)."""
    scenario = parse_scenario(
        {
            "description": "lowest victims",
            "nodes": [{"name": "n1", "gpus": 4}, {"name": "n2", "gpus": 4}],
            "queues": [{"name": "a", "gpu": 4}, {"name": "b", "gpu": 4}],
            "running": [
                {"id": 1, "queue": "a", "gpus": 1, "on": {"n1": [0]}, "priority": 50, "start": 0},
                {"id": 2, "queue": "a", "gpus": 1, "on": {"n2": [0]}, "priority": 10, "start": 0},
                {"id": 3, "queue": "a", "gpus": 1, "on": {"n1": [1]}, "priority": 100, "start": 0},
                {"id": 4, "queue": "b", "gpus": 1, "on": {"n2": [1]}, "priority": 1, "preemptible": False},
                {"id": 5, "queue": "b", "gpus": 1, "on": {"n1": [2]}, "priority": 70, "start": 0},
                {"id": 6, "queue": "b", "gpus": 1, "on": {"n2": [2]}, "priority": 60, "start": 0},
            ],
            "pending": [],
            "expect": {"binds": {}, "evictions": {}},
        },
        "lowest_victims",
    )
    cycle = Cycle(scenario.snapshot, scenario.now)
    assert cycle._lowest_victims() == {"a": 10, "b": 60}
    assert {name: [v.id for v in vs] for name, vs in cycle._victim_groups().items()} == {
        "n1": [1, 3, 5],
        "n2": [2, 6],
    }


def test_a_gang_missing_a_pod_on_a_healthy_pool_is_restarted_whole() -> None:
    """With every node known and ready, stale-gang cleanup looks only at the gangs the pass found lacking
    pods: a two-pod gang that has one placed is evicted whole; work beside it stays."""
    scenario = parse_scenario(
        {
            "description": "missing pod",
            "nodes": [{"name": "n1", "gpus": 8}, {"name": "n2", "gpus": 8}],
            "running": [
                {"id": 1, "on": {"n1": "0-3", "n2": "0-3"}},
                {"id": 2, "gpus": 1, "on": {"n2": [7]}},
            ],
            "expect": {"binds": {}, "evictions": {}},
        },
        "missing_pod",
    )
    gang, single = scenario.snapshot.running
    snapshot = replace(scenario.snapshot, running=(replace(gang, placement=gang.placement[:1]), single))
    decisions = decide(snapshot, scenario.now)
    assert [(e.workload_id, e.code) for e in decisions.evictions] == [(1, "stale-gang")]
    assert "a missing pod" in decisions.evictions[0].reason
