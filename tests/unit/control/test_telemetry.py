"""The head's telemetry: one entry point for every node's samples, attribution, bounded history."""

from __future__ import annotations

import gc
import logging
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from gpupool.backends.agent_heartbeats import AgentHeartbeats
from gpupool.control.telemetry import Holder, TelemetryCache
from gpupool.control.telemetry_log import TelemetryLog
from gpupool.gpu.simulated import SimulatedProvider

TIERS = ((1.0, 60), (10.0, 60), (60.0, 60))


def test_samples_are_attributed_to_the_workload_holding_the_gpu() -> None:
    held = {("n1", 1): [Holder(7, "train", "nlp", "alice")]}
    cache = TelemetryCache(allocations=lambda: held)
    cache.put("n1", [s.to_dict() for s in SimulatedProvider("sim:2xH100", seed="t").sample(10.0)])
    assert cache.get("n1", 0)["workloads"] == ()  # type: ignore[index]
    assert cache.get("n1", 1)["workloads"] == (7,)  # type: ignore[index]
    assert cache.get("n1", 1)["holders"] == (  # type: ignore[index]
        {"workload": 7, "name": "train", "queue": "nlp", "user": "alice"},
    )


def test_rows_of_idle_gpus_are_not_tracked_by_the_garbage_collector() -> None:
    """Thousands of GPUs' rows replaced every second: untracked, they cost young collections nothing; a
    held GPU's rows share their attribution instead of new lists each second."""
    held = {("n1", 1): [Holder(7, "train", "nlp", "alice")]}
    cache = TelemetryCache(allocations=lambda: held)
    sample = {"index": 0, "uuid": "GPU-0", "at": 1.0, "xid_errors": [79], "throttle_reasons": []}
    cache.put("n1", [sample, {**sample, "index": 1}])
    first = cache.get("n1", 1)
    assert first is not None and first["xid_errors"] == (79,)
    quiet = {**sample, "xid_errors": [], "at": 2.0}  # what a healthy GPU reports second after second
    cache.put("n1", [quiet, {**quiet, "index": 1}])
    idle, busy = cache.get("n1", 0), cache.get("n1", 1)
    assert idle is not None and busy is not None
    assert idle["xid_errors"] == () and not gc.is_tracked(idle)
    assert busy["holders"] is first["holders"] and busy["workloads"] is first["workloads"]


def test_history_is_downsampled_into_coarser_tiers() -> None:
    cache = TelemetryCache(tiers=TIERS)
    for second in range(0, 1200):
        cache.put("n1", [{"index": 0, "uuid": "GPU-0", "at": float(second), "utilization_pct": second % 10}])
    fine = cache.history("n1", 0, 30, now=1199.0)
    coarse = cache.history("n1", 0, 3600, now=1199.0)
    assert fine["resolution"] == 1.0 and len(fine["points"]) == 30
    assert coarse["resolution"] == 60.0
    assert coarse["points"][0][1] == 4.5  # a minute of 0..9 utilizations averages 4.5


def test_history_stays_within_its_memory_bound_over_a_long_run() -> None:
    """A week of 1 Hz samples from 4 nodes of 8 GPUs: points and memory stop growing once tiers are full."""
    cache = TelemetryCache(tiers=TIERS, max_series=32)
    bound = 32 * sum(capacity for _, capacity in TIERS)
    rows = [{"index": i, "uuid": f"GPU-{i}", "utilization_pct": 50.0, "memory_used_bytes": 1 << 30,
             "temperature_c": 60.0, "power_w": 300.0} for i in range(8)]  # fmt: skip
    tracemalloc.start()
    try:
        for step in range(0, 7 * 86400, 300):  # every 5 minutes of a week, to keep the test fast
            for n in range(4):
                cache.put(f"n{n}", [{**r, "at": float(step)} for r in rows])
            if step == 86400:
                settled, _ = tracemalloc.get_traced_memory()
        final, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cache.series() == 32
    assert cache.points() <= bound
    assert final < settled * 1.1 + 64 * 1024  # no growth after the first day


def test_beyond_its_cap_on_gpus_the_least_recently_seen_series_goes() -> None:
    cache = TelemetryCache(tiers=TIERS, max_series=2)
    cache.put("old", [{"index": 0, "uuid": "a", "at": 1.0}])
    cache.put("n1", [{"index": 0, "uuid": "b", "at": 5.0}])
    cache.put("n2", [{"index": 0, "uuid": "c", "at": 6.0}])
    assert cache.series() == 2
    assert cache.get("old", 0) is None and cache.get("n2", 0) is not None


def _feed(cache: TelemetryCache, start: int, stop: int, step: int = 1, gpus: int = 1) -> None:
    for second in range(start, stop, step):
        cache.put("n1", [{"index": i, "uuid": f"GPU-{i}", "at": float(second), "utilization_pct": 40.0 + i}
                         for i in range(gpus)])  # fmt: skip


def test_the_coarser_tiers_are_saved_and_a_restarted_head_shows_them(tmp_path: Path) -> None:
    before = TelemetryCache(saved_from=10.0)
    history = TelemetryLog(tmp_path / "telemetry")
    _feed(before, 0, 1800)  # half an hour at 1 Hz
    saved = before.take_unsaved()
    assert {p.resolution for p in saved} == {10.0, 60.0} and before.take_unsaved() == []
    history.append(saved, now=1800.0)

    after = TelemetryCache(saved_from=10.0)
    _feed(after, 1900, 1960)  # the restarted head's first minute, taken in while it reads its log
    assert after.restore(history.load(now=1960.0)) == len(saved)
    hour = after.history("n1", 0, 3600, now=1960.0)
    assert hour["resolution"] == 10.0 and hour["points"][0][0] == 0.0 and hour["points"][0][1] == 40.0
    # The last 10 minutes: the 1 s tier since the restart, the 10 s points before it.
    recent = after.history("n1", 0, 600, now=1960.0)
    times = [p[0] for p in recent["points"]]
    assert times == sorted(times) and times[0] == 1360.0 and times[-1] == 1958.0
    assert 1780.0 in times and 1900.0 in times
    assert 1790.0 not in times  # the bucket still open when the head stopped is not saved


def test_the_history_on_disk_stays_within_its_size_cap_and_retention_over_a_long_run(tmp_path: Path) -> None:
    """Three simulated days of 8 GPUs: the log never passes its cap, keeps no point older than its
    retention (per resolution), and still holds the most recent history."""
    cap = 256 * 1024
    capped = TelemetryLog(tmp_path / "capped", max_bytes=cap)
    keep = {10.0: 2 * 3600.0, 60.0: 6 * 3600.0}
    dated = TelemetryLog(tmp_path / "dated", max_bytes=1 << 30, retention=keep)
    cache = TelemetryCache(saved_from=10.0, tiers=((10.0, 60), (60.0, 60)))
    largest = 0
    for block in range(0, 3 * 86400, 60):  # saved every minute (the head saves every 10 s) to run faster
        _feed(cache, block, block + 60, step=10, gpus=8)
        points = cache.take_unsaved()
        capped.append(points, now=block + 60.0)
        dated.append(points, now=block + 60.0)
        largest = max(largest, capped.size())
    end = 3 * 86400.0
    assert largest <= cap
    kept = list(capped.load(now=end))
    assert kept and max(p.point[0] for p in kept) >= end - 120
    for resolution, span in keep.items():
        times = [p.point[0] for p in dated.load(now=end) if p.resolution == resolution]
        assert min(times) >= end - span and max(times) >= end - 2 * resolution
        on_disk = [p for p in dated.segments() if p.name.startswith(f"history-{resolution:g}s-")]
        assert len(on_disk) <= 12 + 2  # a segment per twelfth of the retention


def test_a_line_torn_by_a_killed_head_costs_that_point_only(tmp_path: Path) -> None:
    history = TelemetryLog(tmp_path / "telemetry")
    cache = TelemetryCache(saved_from=10.0)
    _feed(cache, 0, 125)
    saved = cache.take_unsaved()
    history.append(saved, now=125.0)
    (segment,) = [p for p in history.segments() if p.name.startswith("history-10s-")]
    with open(segment, "a") as fh:
        fh.write('["n1",0,10.0,120.0,4')  # kill -9 in the middle of a write
    loaded = TelemetryLog(tmp_path / "telemetry").load(now=125.0)
    assert sorted(loaded) == sorted(saved) and len(saved) == 14  # twelve 10 s points, two 1 min points


def test_a_gpu_its_node_no_longer_lists_leaves_the_cache() -> None:
    cache = TelemetryCache(tiers=TIERS)
    cache.put("n1", [s.to_dict() for s in SimulatedProvider("sim:4xH100", seed="t").sample(10.0)])
    cache.put("n2", [s.to_dict() for s in SimulatedProvider("sim:2xH100", seed="u").sample(10.0)])
    assert cache.keep_listed({"n1": [0, 1, 2, 3], "n2": range(2)}) == 0
    assert cache.keep_listed({"n1": [0, 2], "n9": [0]}) == 2  # GPUs 1 and 3 gone; n2 not listed: kept
    assert [r["index"] for r in cache.node_samples("n1")] == [0, 2]
    assert sorted(cache.latest()) == [("n1", 0), ("n1", 2), ("n2", 0), ("n2", 1)]
    assert cache.get("n1", 3) is None and cache.history("n1", 3, 60.0, now=10.0)["points"] == []
    assert cache.series() == 4
    assert cache.keep_listed({"n2": []}) == 2 and cache.node_samples("n2") == []


NOW = 1_800_000_000.0  # the head's clock (epoch seconds) when a test starts


def _head(clock: list[float]) -> tuple[AgentHeartbeats, TelemetryCache]:
    """A head's agent heartbeats handing their samples to its telemetry, as the API's runtime wires them;
    `clock[0]` is its time (epoch seconds)."""
    cache = TelemetryCache(tiers=TIERS)
    heartbeats = AgentHeartbeats(on_telemetry=cache.put, clock=lambda: clock[0], wall_clock=lambda: clock[0])
    heartbeats.register("gpu-07", {"gpus": [["H100", 1]]}, "127.0.0.1")
    return heartbeats, cache


def _report(agent_now: float, utilization: float = 55.0) -> dict[str, Any]:
    """A heartbeat as an agent sends it: its samples and when it sent them, both on the agent's clock."""
    sample = {"index": 0, "uuid": "GPU-0", "at": agent_now - 0.2, "utilization_pct": utilization}
    return {"attempts": [], "logs": [], "telemetry": [sample], "sent_at": agent_now}


def test_samples_of_an_agent_whose_clock_is_off_are_kept_on_the_head_s_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An agent two hours behind: its samples land at the head's time, where the work they measure ran
    (they were kept two hours in the past, outside every attempt, and its jobs showed no GPU telemetry),
    and the head says once which node's clock is off, by how much."""
    clock = [NOW]
    heartbeats, cache = _head(clock)
    caplog.set_level(logging.WARNING, logger="gpupool.agents")
    for second in range(5):
        clock[0] = NOW + second
        heartbeats.heartbeat("gpu-07", _report(NOW - 7200 + second - 0.05))  # 0.05 s in transit
    latest = cache.get("gpu-07", 0)
    assert latest is not None and latest["at"] == NOW + 4 - 0.2, latest
    points = cache.points_after("gpu-07", 0, after=NOW - 5.0)  # the attempt's start, on the head's clock
    assert [p[0] for p in points] == [NOW - 1, NOW, NOW + 1, NOW + 2], points  # each second's, averaged
    assert all(p[1] == 55.0 for p in points), points
    warned = [r.getMessage() for r in caplog.records if "agent_clock_off" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "node=gpu-07" in warned[0] and "offset=7200" in warned[0] and "behind" in warned[0], warned


def test_an_agent_in_step_with_the_head_or_that_sends_no_send_time_keeps_its_sample_times() -> None:
    """Within a second the agent's own times stand (a report's time in transit is no clock error); an
    agent older than `sent_at` is taken as it was."""
    clock = [NOW]
    heartbeats, cache = _head(clock)
    heartbeats.heartbeat("gpu-07", _report(NOW - 0.8))  # 0.8 s in transit, or a clock 0.8 s behind
    assert cache.get("gpu-07", 0)["at"] == NOW - 1.0  # type: ignore[index]
    old = _report(NOW - 7200)
    del old["sent_at"]
    heartbeats.heartbeat("gpu-07", old)
    assert cache.get("gpu-07", 0)["at"] == NOW - 7200.2  # type: ignore[index]


def test_one_heartbeat_a_stalled_head_read_late_neither_moves_samples_nor_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A head that stood still reads a heartbeat sent 12 s before: the agent's clock is not off, the
    report waited (the smallest difference of the last heartbeats is the clocks' own)."""
    clock = [NOW]
    heartbeats, cache = _head(clock)
    caplog.set_level(logging.WARNING, logger="gpupool.agents")
    for second in range(3):
        clock[0] = NOW + second
        heartbeats.heartbeat("gpu-07", _report(NOW + second - 0.01))
    clock[0] = NOW + 15.0
    heartbeats.heartbeat("gpu-07", _report(NOW + 3.0))  # sent at NOW + 3, read 12 s later
    assert cache.get("gpu-07", 0)["at"] == NOW + 3.0 - 0.2  # type: ignore[index]
    assert not [r for r in caplog.records if "agent_clock_off" in r.getMessage()]


def test_put_moves_samples_by_the_offset_it_is_given() -> None:
    cache = TelemetryCache(tiers=TIERS)
    for at in (10.0, 11.0):
        cache.put("n1", [{"index": 0, "uuid": "GPU-0", "at": at, "utilization_pct": 50.0}], offset=7200.0)
    assert cache.get("n1", 0)["at"] == 7211.0  # type: ignore[index]
    assert cache.history("n1", 0, 60, now=7212.0)["points"] == [[7210.0, 50.0, 0.0, 0.0, 0.0]]
