"""The autoscaler's measure of load (requests per second, requests in flight) and its rule for changing a
service's replica count (target tracking, with the delays and the look-back of control/autoscale.py)."""

from __future__ import annotations

import pytest

from gpupool.control import service_replicas, submission, workloads
from gpupool.control.autoscale import MAX_IDS, Autoscaler, Load, Tracker, wanted
from gpupool.spec import ScalingSpec, parse_workload_spec
from gpupool.store.db import Store
from gpupool.store.models import Workload


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _scaling(**given: object) -> ScalingSpec:
    return ScalingSpec.model_validate({"min": 1, "max": 4, "target": 10, **given})


def test_requests_per_second_are_counted_over_the_window_by_any_replica_id() -> None:
    clock = Clock()
    load = Load(clock)
    clock.now += 100  # the measure is older than the window
    for second in range(10):
        for _ in range(5):
            load.began(7 if second % 2 else 8)  # the service's id, or a replica's
            load.ended(7 if second % 2 else 8)
        clock.now += 1
    assert load.measure([7, 8], "rps", window=10) == pytest.approx(5.0)
    assert load.measure([7], "rps", window=10) == pytest.approx(2.5)
    assert load.measure([7, 7, 8], "rps", window=10) == pytest.approx(5.0)  # an id counted once
    assert load.measure([9], "rps", window=10) == 0.0
    clock.now += 30
    assert load.measure([7, 8], "rps", window=10) == 0.0  # all of it older than the window


def test_a_young_measure_divides_by_the_time_it_has_watched_not_the_whole_window() -> None:
    clock = Clock()
    load = Load(clock)
    for _ in range(20):
        load.began(3)
    clock.now += 2
    # 20 requests in the 2 s since the head started: 10/s, not 20/60
    assert load.measure([3], "rps", window=60) == pytest.approx(10.0, rel=0.35)


def test_concurrency_is_the_time_average_of_requests_in_flight() -> None:
    clock = Clock()
    load = Load(clock)
    clock.now += 100
    for _ in range(3):
        load.began(5)  # three long requests in flight for the whole window
    clock.now += 10
    assert load.measure([5], "concurrency", window=10) == pytest.approx(3.0, rel=0.1)
    load.ended(5)
    load.ended(5)
    load.ended(5)
    load.ended(5)  # one more end than begins changes nothing
    clock.now += 10
    assert load.measure([5], "concurrency", window=10) == pytest.approx(0.0, abs=0.35)
    assert load.measure([5], "concurrency", window=20) == pytest.approx(1.5, rel=0.1)


def test_a_service_wants_its_load_over_the_target_rounded_up_within_its_range() -> None:
    scaling = _scaling(min=2, max=5, target=10)
    assert [wanted(x, scaling) for x in (0, 10, 20, 20.001, 31, 45, 500)] == [2, 2, 2, 3, 4, 5, 5]


def test_replicas_are_added_at_once_and_again_only_after_the_up_delay() -> None:
    scaling = _scaling(scale_up_delay=30, scale_down_delay=300)
    tracker = Tracker(now=0)
    assert tracker.next_count(scaling, current=1, load=25, now=0) == 3  # nothing changed before: at once
    tracker.changed = 0
    assert tracker.next_count(scaling, current=3, load=40, now=10) == 3  # 10 s since the change
    assert tracker.next_count(scaling, current=3, load=40, now=30) == 4


def test_replicas_are_removed_only_down_to_the_most_wanted_in_the_down_delay() -> None:
    scaling = _scaling(scale_up_delay=0, scale_down_delay=60)
    tracker = Tracker(now=0)
    tracker.changed = 0
    assert tracker.next_count(scaling, current=4, load=35, now=0) == 4
    # the load falls: nothing goes while a want within the look-back was higher, and then only down to
    # the most wanted in it
    assert tracker.next_count(scaling, current=4, load=5, now=30) == 4
    assert tracker.next_count(scaling, current=4, load=25, now=50) == 4
    assert tracker.next_count(scaling, current=4, load=5, now=70) == 4  # the 35 (4) of t=0 still counts
    assert tracker.next_count(scaling, current=4, load=5, now=100) == 3  # the 25 (3) of t=50 does
    tracker.changed = 100
    assert tracker.next_count(scaling, current=3, load=0, now=120) == 3  # the 25 (3) of t=50 still counts
    assert tracker.next_count(scaling, current=3, load=0, now=130) == 1  # since t=70 it wanted 1


def test_after_a_restart_nothing_is_removed_until_a_whole_down_delay_was_watched() -> None:
    scaling = _scaling(scale_down_delay=60)
    tracker = Tracker(now=500)  # a new head: the count changed long ago, the load before is unknown
    assert tracker.next_count(scaling, current=4, load=0, now=501) == 4
    assert tracker.next_count(scaling, current=4, load=0, now=559) == 4
    assert tracker.next_count(scaling, current=4, load=0, now=561) == 1


def test_a_count_outside_the_range_is_brought_into_it() -> None:
    scaling = _scaling(min=2, max=3)
    tracker = Tracker(now=0)
    tracker.changed = 0
    assert tracker.next_count(scaling, current=1, load=0, now=1) == 2
    assert tracker.next_count(scaling, current=5, load=100, now=1) == 3


def _autoscaled(store: Store, name: str, **scaling: object) -> int:
    spec = parse_workload_spec(
        {"kind": "service", "name": name, "commands": ["serve"], "replicas": "1..4",
         "scaling": {"target": 10, "scale_up_delay": 0, "scale_down_delay": 60, **scaling}}
    )  # fmt: skip
    return int(submission.submit(store, spec)["id"])


def test_the_autoscaler_changes_each_service_by_its_own_load_and_says_why(store: Store) -> None:
    clock = Clock()
    load = Load(clock)
    woken: list[bool] = []
    autoscaler = Autoscaler(store, load, lambda: woken.append(True), clock)
    busy, quiet = _autoscaled(store, "busy", window=10), _autoscaled(store, "quiet", window=10)
    fixed = submission.submit(store, parse_workload_spec({"kind": "service", "commands": ["serve"]}))["id"]
    clock.now += 100
    for _ in range(250):  # 25 requests a second over 10 s to the busy one
        load.began(busy)
        load.ended(busy)
    clock.now += 10
    autoscaler.step()
    assert workloads.get_workload(store, busy)["replicas"] == 3 and woken == [True]
    assert workloads.get_workload(store, quiet)["replicas"] == 1
    assert set(autoscaler.words) == {busy, quiet} and fixed not in autoscaler.words
    word = autoscaler.words[busy]
    assert (word.wanted, word.replicas, word.metric) == (3, 3, "rps") and word.load == pytest.approx(25)
    added = workloads.get_workload(store, busy)["replica_list"][2]["id"]
    events = workloads.get_workload(store, added)["events"]
    assert events[0]["actor"] == "autoscaler"
    assert events[0]["reason"] == (
        "scaled to 3 replicas by the autoscaler: 25 requests/s over 10 s, target 10 per replica, range 1..4: "
        "replica 2"
    )


def test_whoever_reads_a_new_count_reads_the_load_that_made_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API reads a service's count from the store, then the autoscaler's word: the word of a change is
    shown before the change is stored (else `gpupool show` could give the new count beside the last
    pass's load, which asked for no change)."""
    clock = Clock()
    load = Load(clock)
    autoscaler = Autoscaler(store, load, lambda: None, clock)
    busy = _autoscaled(store, "busy", window=10)
    clock.now += 100
    autoscaler.step()
    assert autoscaler.words[busy].wanted == 1
    shown: list[tuple[int, int, float]] = []
    scale = service_replicas.scale

    def watched(*args: object, **kwargs: object) -> None:
        word = autoscaler.words[busy]
        shown.append((word.wanted, word.replicas, word.load))
        scale(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(service_replicas, "scale", watched)
    for _ in range(250):
        load.began(busy)
        load.ended(busy)
    clock.now += 10
    autoscaler.step()
    assert shown == [(3, 3, pytest.approx(25))]
    assert workloads.get_workload(store, busy)["replicas"] == 3 and autoscaler.words[busy].replicas == 3


def test_one_service_the_autoscaler_cannot_read_leaves_the_others_scaling(store: Store) -> None:
    clock = Clock()
    load = Load(clock)
    autoscaler = Autoscaler(store, load, lambda: None, clock)
    broken, busy = _autoscaled(store, "broken"), _autoscaled(store, "busy", window=10)
    with store.session() as s:  # a stored spec this code cannot read (as an older or newer server's might)
        row = s.get(Workload, broken)
        assert row is not None
        row.spec = {**row.spec, "scaling": {**row.spec["scaling"], "metric": "latency"}}
    clock.now += 100
    for _ in range(400):
        load.began(busy)
    clock.now += 10
    autoscaler.step()
    assert workloads.get_workload(store, busy)["replicas"] == 4
    assert set(autoscaler.words) == {busy}


@pytest.mark.parametrize("window", [3.0, 10.0])
@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.9])
def test_one_client_always_waiting_is_one_request_in_flight_at_any_instant(
    window: float, fraction: float
) -> None:
    """The window is exactly as long as it says, wherever in a second it ends: one client that always has a
    request waiting is 1 request in flight (so a target of 1 gives it one replica, not two)."""
    clock = Clock(1000.0 + fraction)
    load = Load(clock)
    clock.now += 100
    load.began(5)
    for _ in range(80):  # one request after another, each 0.25 s, for longer than the window
        clock.now += 0.25
        load.ended(5)
        load.began(5)
    measured = load.measure([5], "concurrency", window=window)
    assert measured == pytest.approx(1.0, abs=1e-9)
    assert wanted(measured, _scaling(min=1, max=4, target=1)) == 1


def test_a_load_within_ten_percent_of_what_the_count_carries_changes_nothing() -> None:
    """Kubernetes' HPA tolerance: 6.02 in flight at 2 each is 3.01 replicas' worth: three stay three."""
    scaling = _scaling(metric="concurrency", target=2, max=6)
    assert wanted(6.02, scaling, current=3) == 3
    assert wanted(6.02, scaling) == 4  # without a current count: the plain rule
    assert wanted(6.6, scaling, current=3) == 3  # 1.1 of it: still within
    assert wanted(6.8, scaling, current=3) == 4  # past it
    assert wanted(5.5, scaling, current=3) == 3  # 0.92 of it
    assert wanted(5.2, scaling, current=3) == 3  # 0.87: ceil(2.6) is 3 anyway
    assert wanted(3.8, scaling, current=3) == 2
    tracker = Tracker(now=0.0)
    rps = _scaling(target=10, scale_up_delay=0, scale_down_delay=0)
    assert tracker.next_count(rps, current=2, load=21.0, now=1.0) == 2
    assert tracker.next_count(rps, current=2, load=23.0, now=2.0) == 3


def test_a_replica_drains_while_the_proxy_has_requests_in_flight_to_it_and_a_moment_after() -> None:
    clock = Clock()
    load = Load(clock)
    assert not load.draining(5)
    load.sent(5)
    load.sent(5)
    load.answered(5)
    assert load.draining(5)
    load.answered(5)
    assert load.draining(5)  # just sent one: the proxy may still send it more from its last read
    clock.now += 1.0
    assert not load.draining(5)
    assert not load.draining(6)


def test_replicas_that_ended_without_draining_are_forgotten_so_memory_stays_bounded() -> None:
    clock = Clock()
    load = Load(clock)
    for replica in range(MAX_IDS):  # each served once, then ended (a crash): never asked `draining`
        load.sent(replica)
        load.answered(replica)
    clock.now += 2.0
    load.sent(MAX_IDS)
    load.sent(MAX_IDS + 1)
    assert len(load._sent) == 2
    assert load.draining(MAX_IDS) and not load.draining(0)
