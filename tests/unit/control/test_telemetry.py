"""The head's telemetry: one entry point for every node's samples, attribution, bounded history."""

from __future__ import annotations

import tracemalloc

from gpupool.control.telemetry import Holder, TelemetryCache
from gpupool.gpu.simulated import SimulatedProvider

TIERS = ((1.0, 60), (10.0, 60), (60.0, 60))


def test_samples_are_attributed_to_the_workload_holding_the_gpu() -> None:
    held = {("n1", 1): [Holder(7, "train", "nlp", "alice")]}
    cache = TelemetryCache(allocations=lambda: held)
    cache.put("n1", [s.to_dict() for s in SimulatedProvider("sim:2xH100", seed="t").sample(10.0)])
    assert cache.get("n1", 0)["workloads"] == []  # type: ignore[index]
    assert cache.get("n1", 1)["holders"] == [  # type: ignore[index]
        {"workload": 7, "name": "train", "queue": "nlp", "user": "alice"}
    ]


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
