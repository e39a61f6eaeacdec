"""A cancelled service replica's SIGTERM waits while the head's proxy still has requests in flight to it
(control/observe.py `_drains`), at most its grace period."""

from __future__ import annotations

from gpupool.control.observe import DRAIN_MAX, Observation
from gpupool.store.models import Workload


def _observation(busy: set[int]) -> Observation:
    observation = Observation()
    observation.draining = lambda replica_id: replica_id in busy
    observation._drains_since = {}
    return observation


def _replica(workload_id: int, grace: float = 30.0) -> Workload:
    return Workload(id=workload_id, kind="service", spec={"grace_period": grace})


def test_a_replica_drains_while_busy_for_at_most_its_grace_period() -> None:
    busy = {1}
    observation = _observation(busy)
    assert observation._drains(_replica(1, grace=10.0), now=100.0)
    assert observation._drains(_replica(1, grace=10.0), now=109.0)
    assert not observation._drains(_replica(1, grace=10.0), now=110.0)  # its grace is spent: stop it now
    busy.clear()
    assert not observation._drains(_replica(1), now=111.0)  # nothing in flight: stop it at once
    assert observation._drains_since == {}


def test_replicas_that_ended_while_draining_are_forgotten() -> None:
    busy = {1, 2}
    observation = _observation(busy)
    assert observation._drains(_replica(1), now=100.0)  # then it exits by itself: never looked at again
    assert observation._drains(_replica(2), now=100.0 + 2 * DRAIN_MAX + 1)
    assert set(observation._drains_since) == {2}
