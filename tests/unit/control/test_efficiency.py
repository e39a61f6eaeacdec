"""GPU efficiency of attempts (control/efficiency.py): the time-weighted mean and the peak, counted from the
telemetry history of the GPUs an attempt holds, written every FLUSH_INTERVAL and at the attempt's end, and
resumed from the store by a restarted head."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from gpupool.control.efficiency import (
    FLUSH_INTERVAL,
    Efficiency,
    EfficiencyWatch,
    Tracked,
    write,
)
from gpupool.control.telemetry import TelemetryCache
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Workload

START = 1_000_000.0
GIB = 1 << 30


def _sample(index: int, at: float, util: float, memory: float = 0.0) -> dict[str, object]:
    return {"index": index, "at": at, "utilization_pct": util, "memory_used_bytes": memory,
            "memory_total_bytes": 80 * GIB, "temperature_c": 40.0, "power_w": 100.0}  # fmt: skip


def _feed(
    cache: TelemetryCache, index: int, start: float, end: float, util: float, memory: float = 0.0
) -> None:
    """One sample a second from `start` to `end` (exclusive)."""
    at = start
    while at < end:
        cache.put("n1", [_sample(index, at, util, memory)])
        at += 1.0


def test_the_mean_is_weighted_by_time_and_the_peak_is_the_highest_point() -> None:
    figures = Efficiency()
    figures.add(100.0, 2 * GIB, 3.0)  # 3 s busy
    figures.add(0.0, 5 * GIB, 1.0)  # 1 s idle, the peak
    figures.add(250.0, GIB, 0.0)  # no weight (and clamped to 100%): the mean does not move
    assert figures.mean_pct == pytest.approx(75.0)
    assert figures.gpu_seconds == pytest.approx(4.0)
    assert figures.peak_memory_bytes == 5 * GIB
    assert Efficiency().mean_pct is None  # nothing counted: no figure, never 0%
    assert Efficiency().columns()["gpu_utilization_pct"] is None


def test_a_resumed_mean_goes_on_with_the_weight_it_had() -> None:
    resumed = Efficiency.resumed(30.0, 40.0, 3 * GIB, 80 * GIB)
    resumed.add(100.0, GIB, 10.0)
    assert resumed.mean_pct == pytest.approx((30 * 40 + 10 * 100) / 40)
    assert resumed.peak_memory_bytes == 3 * GIB
    assert Efficiency.resumed(None, None, None, None).mean_pct is None


def test_points_before_the_attempt_and_long_silences_do_not_count() -> None:
    cache = TelemetryCache()
    _feed(cache, 0, START - 20, START, 100.0)  # the previous holder kept the GPU busy
    _feed(cache, 0, START, START + 10, 20.0, GIB)
    _feed(cache, 0, START + 300, START + 302, 80.0, 2 * GIB)  # after a 5-minute silence
    cache.put("n1", [_sample(0, START + 400, 0.0)])  # closes the last 1 s bucket (its own is still open)
    watch = EfficiencyWatch(cache)
    tracked = Tracked(1, START, (("n1", 0),), Efficiency())
    watch.look([tracked], {}, START + 400)
    figures = watch._tallies[1].figures
    # 10 points at 20% (the first counts from the start: 0 s), then 80% for 1 s: the first point after the
    # silence (longer than MAX_GAP) stands for no time, neither 291 s nor MAX_GAP of it.
    assert figures.gpu_seconds == pytest.approx(9 + 1)
    expected = (9 * 20 + 1 * 80) / figures.gpu_seconds
    assert figures.mean_pct == pytest.approx(expected)
    assert figures.peak_memory_bytes == 2 * GIB and figures.memory_total_bytes == 80 * GIB


def test_figures_are_written_every_flush_interval_and_at_the_end_only() -> None:
    cache = TelemetryCache()
    watch = EfficiencyWatch(cache)
    tracked = Tracked(7, START, (("n1", 0), ("n1", 1)), Efficiency())
    quiet = Tracked(8, START, (("n1", 5),), Efficiency())  # a GPU no sample came from
    _feed(cache, 0, START, START + 6, 100.0)
    _feed(cache, 1, START, START + 6, 0.0)
    first = watch.look([tracked, quiet], {}, START + 6)
    assert set(first) == {7}  # the first look writes (the flush clock starts at 0); the quiet one never
    assert first[7]["gpu_utilization_pct"] == pytest.approx(50.0)
    _feed(cache, 0, START + 6, START + 12, 100.0)
    _feed(cache, 1, START + 6, START + 12, 100.0)
    # 7 counted, not written: not yet due; a new attempt (a requeued job's next) gets its first figures at
    # once, not up to FLUSH_INTERVAL later ("no GPU telemetry" meanwhile)
    new = Tracked(9, START + 6, (("n1", 2),), Efficiency())
    _feed(cache, 2, START + 6, START + 12, 80.0)
    assert set(watch.look([tracked, quiet, new], {}, START + 12)) == {9}
    assert watch.look([tracked, quiet, new], {}, START + 13) == {}
    due = watch.look([tracked, quiet], {}, START + 6 + FLUSH_INTERVAL)
    assert due[7]["gpu_utilization_pct"] > 50.0
    _feed(cache, 0, START + 12, START + 20, 0.0)
    _feed(cache, 1, START + 12, START + 20, 0.0)
    ended = watch.look(
        [quiet], {7: START + 15, 8: None}, START + 20
    )  # ended at +15: later points are not its
    assert set(ended) == {7}
    assert ended[7]["gpu_seconds_sampled"] == pytest.approx(2 * 15)  # +0..+15 on 2 GPUs, the first of 0 s
    assert 7 not in watch._tallies and watch.look([], {}, START + 200) == {}


def test_a_restarted_head_resumes_the_stored_figures(store: Store) -> None:
    with store.session() as s:
        workload = Workload(name="train", queue="default", spec={}, state="running", version=1)
        s.add(workload)
        s.flush()
        started = datetime.fromtimestamp(START, UTC)
        s.add(Attempt(workload_id=workload.id, queue=workload.queue, number=0, state="running",
                      node_name="n1", gpu_indices=[0],
                      started_at=started))  # fmt: skip
    cache = TelemetryCache()
    _feed(cache, 0, START, START + 11, 100.0, GIB)
    before = EfficiencyWatch(cache)
    with store.read() as s:
        running = before.running(s)
    with store.session() as s:
        write(s, before.look(running, {}, START + 11))
    with store.read() as s:
        row = s.scalar(select(Attempt))
        assert row is not None and row.gpu_utilization_pct == pytest.approx(100.0)
        assert row.gpu_seconds_sampled == pytest.approx(9.0)

    after = EfficiencyWatch(TelemetryCache(), began=START + 100)  # a new head: its history starts empty
    _feed(after.telemetry, 0, START + 100, START + 110, 0.0)
    with store.read() as s:
        running = after.running(s)
        assert running[0].stored.mean_pct == pytest.approx(100.0)
    with store.session() as s:
        write(s, after.look(running, {}, START + 110))
    with store.read() as s:
        row = s.scalar(select(Attempt))
        assert row is not None and row.gpu_memory_peak_bytes == GIB  # the peak before the restart stays
        # 9 s at 100% resumed, then 8 s at 0%: the first point the new head has stands for no time.
        assert row.gpu_utilization_pct == pytest.approx(100 * 9 / (9 + 8), abs=1e-3)
        assert row.gpu_seconds_sampled == pytest.approx(9 + 8)


@pytest.mark.parametrize("history_kept", [False, True], ids=["history-lost", "history-kept"])
def test_a_head_killed_and_restarted_counts_neither_its_outage_nor_a_point_twice(
    store: Store, history_kept: bool
) -> None:
    """A busy attempt; the head is killed 38 s in (its figures last written at 20 s) and is back at 45 s;
    the first sample after the restart reads 0% (a simulated GPU's first reading). The attempt never has
    more GPU-seconds than it held, and its mean stays that of a busy GPU. `history_kept`: the new head's
    history still holds the points from before the kill (its finest history is not saved, but a point
    counted must never be counted again)."""
    with store.session() as s:
        workload = Workload(name="busy", queue="default", spec={}, state="running", version=1)
        s.add(workload)
        s.flush()
        started = datetime.fromtimestamp(START, UTC)
        s.add(Attempt(workload_id=workload.id, queue=workload.queue, number=0, state="running",
                      node_name="n1", gpu_indices=[0], started_at=started))  # fmt: skip
    killed = EfficiencyWatch(TelemetryCache(), began=START - 100)
    _feed(killed.telemetry, 0, START, START + 22, 100.0)
    with store.read() as s:
        running = killed.running(s)
    with store.session() as s:
        write(s, killed.look(running, {}, START + 22))  # points +0..+20: 20 s written
    _feed(killed.telemetry, 0, START + 22, START + 38, 100.0)
    killed.look(running, {}, START + 35)  # counted, never written: lost with the kill

    restarted = EfficiencyWatch(TelemetryCache(), began=START + 45)
    if history_kept:
        _feed(restarted.telemetry, 0, START, START + 39, 100.0)
    _feed(restarted.telemetry, 0, START + 46, START + 47, 0.0)
    _feed(restarted.telemetry, 0, START + 47, START + 82, 100.0)  # points +46..+80
    with store.read() as s:
        running = restarted.running(s)
    with store.session() as s:
        write(s, restarted.look(running, {}, START + 82))
    with store.read() as s:
        row = s.scalar(select(Attempt))
        assert row is not None and row.gpu_seconds_sampled is not None
        assert row.gpu_seconds_sampled <= 81  # never more than the attempt held
        # 20 s stored, the outage and the first point after it nothing (1 s at 0% where the kept history
        # has a point just before the restart), then 34 s at 100%.
        assert row.gpu_seconds_sampled == pytest.approx(20 + 34 + (1 if history_kept else 0))
        assert row.gpu_utilization_pct == pytest.approx(100 * 54 / row.gpu_seconds_sampled, abs=1e-3)
