"""Idle work (control/idle.py): the looks at a running attempt's GPUs through the head's real telemetry
cache, what makes a verdict, and which running attempts are watched (on a real SQLite store)."""

from __future__ import annotations

from gpupool.control import changes
from gpupool.control.idle import STALE, Idle, IdleWatch, Watched
from gpupool.control.telemetry import TelemetryCache
from gpupool.spec.sections import IdleSpec
from gpupool.store.db import Store
from tests.support.store import submit_running

T0 = 1_000_000.0  # the head's clock
SKEW = -5_000.0  # the node's clock runs behind: verdicts must not depend on the two agreeing


def _spec(timeout: float = 60.0, **fields: object) -> IdleSpec:
    return IdleSpec.model_validate({"timeout": timeout, **fields})


def _samples(cache: TelemetryCache, node: str, at: float, util: dict[int, float]) -> None:
    cache.put(node, [{"index": i, "at": at + SKEW, "utilization_pct": u} for i, u in util.items()])


def _verdicts(
    watch: IdleWatch, cache: TelemetryCache, watched: list[Watched], util: dict[int, float], until: float,
    start: float = T0,
) -> list[Idle]:  # fmt: skip
    """Samples every second and a look every 5 s from `start` to `until`: the first verdicts."""
    t = start
    while t <= until:
        _samples(cache, "n", t, util)
        if (t - start) % 5 == 0:
            found = watch.look(watched, t)
            if found:
                return found
        t += 1
    return []


def _run(
    watch: IdleWatch, cache: TelemetryCache, watched: list[Watched], util: dict[int, float], until: float,
    start: float = T0,
) -> list[int]:  # fmt: skip
    """The ids of the first verdicts (see _verdicts)."""
    return [v.workload_id for v in _verdicts(watch, cache, watched, util, until, start)]


def test_an_attempt_whose_gpus_stay_idle_is_idle_after_its_timeout_counted_from_the_first_look() -> None:
    cache = TelemetryCache()
    watch = IdleWatch(cache)
    job = Watched(1, 10, None, _spec(60), (("n", 0), ("n", 1)))
    assert _run(watch, cache, [job], {0: 0.0, 1: 0.4}, until=T0 + 55) == []
    verdicts = watch.look([job], T0 + 60)
    assert [(v.workload_id, v.action) for v in verdicts] == [(10, "hold")]
    assert verdicts[0].reason == "idle: its GPUs below 1% utilization for 1m"


def test_one_busy_gpu_starts_the_clock_again_and_the_threshold_is_the_specs() -> None:
    cache = TelemetryCache()
    watch = IdleWatch(cache)
    job = Watched(1, 10, None, _spec(60), (("n", 0), ("n", 1)))
    assert _run(watch, cache, [job], {0: 0.0, 1: 0.0}, until=T0 + 40) == []
    _samples(cache, "n", T0 + 41, {0: 0.0, 1: 35.0})  # one busy second on one GPU
    assert _run(watch, cache, [job], {0: 0.0, 1: 0.0}, start=T0 + 45, until=T0 + 100) == []
    assert _run(watch, cache, [job], {0: 0.0, 1: 0.0}, start=T0 + 105, until=T0 + 105) == [10]
    lenient = IdleWatch(cache)  # below 50% counts as idle here: the same samples leave it idle
    relaxed = Watched(2, 20, None, _spec(60, utilization=50, action="cancel"), (("n", 1),))
    assert _run(lenient, cache, [relaxed], {1: 35.0}, start=T0 + 200, until=T0 + 260) == [20]


def test_no_verdict_without_fresh_samples() -> None:
    cache = TelemetryCache()
    watch = IdleWatch(cache)
    never_sampled = Watched(1, 10, None, _spec(60), (("slurm-node", 0),))
    assert watch.look([never_sampled], T0) == [] and watch.look([never_sampled], T0 + 3600) == []
    quiet = Watched(2, 20, None, _spec(60), (("n", 0),))
    assert _run(watch, cache, [quiet], {0: 0.0}, until=T0 + 30) == []
    # its node went quiet at T0 + 30: past the timeout, but with nothing new for longer than STALE
    assert watch.look([quiet], T0 + 30 + STALE + 5) == []
    assert watch.look([quiet], T0 + 3600) == []


def test_a_service_is_idle_only_when_every_replica_is_and_then_once_by_its_id() -> None:
    cache = TelemetryCache()
    watch = IdleWatch(cache)
    spec = _spec(60, action="cancel")
    replicas = [Watched(1, 7, 7, spec, (("n", 0),)), Watched(2, 8, 7, spec, (("n", 1),))]
    assert _run(watch, cache, replicas, {0: 0.0, 1: 20.0}, until=T0 + 200) == []  # replica 8 serves
    found = _verdicts(watch, cache, replicas, {0: 0.0, 1: 0.0}, start=T0 + 205, until=T0 + 300)
    assert [(v.workload_id, v.action) for v in found] == [(7, "cancel")]
    assert found[0].reason == "idle: all 2 replicas' GPUs below 1% utilization for 1m: cancelling it"


def test_watched_attempts_are_those_running_that_declare_idle_and_nobody_stopped(store: Store) -> None:
    def running(spec: dict[str, object]) -> int:
        return submit_running(store, {"commands": ["x"], **spec}, node="n", gpu_indices=[3], pods=[])

    watched = running({"resources": {"gpu": 1}, "idle": "30m"})
    running({"resources": {"gpu": 1}})  # declares no idle
    held = running({"resources": {"gpu": 1}, "idle": "30m"})
    cancelled = running({"resources": {"gpu": 1}, "idle": "30m"})
    changes.hold(store, held)
    changes.cancel(store, cancelled)
    watch = IdleWatch(TelemetryCache())
    with store.read() as s:
        found = watch.watched(s)
    assert [(w.workload_id, w.gpus, w.spec.timeout) for w in found] == [(watched, (("n", 3),), 1800.0)]
