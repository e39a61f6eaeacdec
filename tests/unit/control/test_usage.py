"""Decayed usage per queue: the history that tilts fair share (control/usage.py)."""

from __future__ import annotations

import pytest

from gpupool.control.usage import attempt_gpus, decayed_gpu_seconds, queue_usage

HOUR = 3600.0


def test_usage_that_just_ended_counts_almost_fully_and_halves_each_half_life() -> None:
    fresh = decayed_gpu_seconds(4.0, 0.0, 60.0, now=60.0, half_life=7 * 24 * HOUR)
    assert fresh == pytest.approx(240.0, rel=1e-4)
    one = decayed_gpu_seconds(4.0, 0.0, 60.0, now=60.0 + 2 * HOUR, half_life=2 * HOUR)
    two = decayed_gpu_seconds(4.0, 0.0, 60.0, now=60.0 + 4 * HOUR, half_life=2 * HOUR)
    assert one == pytest.approx(fresh / 2, rel=1e-2)
    assert two == pytest.approx(one / 2, rel=1e-9)


def test_the_closed_form_matches_a_sum_over_seconds() -> None:
    half_life, now = 600.0, 2000.0
    summed = sum(2.0 * 2.0 ** (-(now - (t + 0.5)) / half_life) for t in range(100, 1600))
    assert decayed_gpu_seconds(2.0, 100.0, 1600.0, now, half_life) == pytest.approx(summed, rel=1e-5)


def test_running_work_counts_up_to_now_and_nothing_counts_twice() -> None:
    assert decayed_gpu_seconds(1.0, 0.0, 500.0, now=100.0, half_life=HOUR) == pytest.approx(
        decayed_gpu_seconds(1.0, 0.0, 100.0, now=100.0, half_life=HOUR)
    )
    assert decayed_gpu_seconds(1.0, 50.0, 50.0, now=100.0, half_life=HOUR) == 0.0
    assert decayed_gpu_seconds(0.0, 0.0, 50.0, now=100.0, half_life=HOUR) == 0.0


def test_a_parent_queue_counts_its_children() -> None:
    parents = {"nlp": "research", "vision": "research", "research": None, "ops": None}
    usage = queue_usage(
        [("nlp", 2.0, 0.0, 100.0), ("vision", 1.0, 0.0, 100.0), ("ops", 8.0, 0.0, 10.0)],
        parents,
        now=100.0,
        half_life=1e12,
    )
    assert usage["research"] == pytest.approx(usage["nlp"] + usage["vision"])
    assert usage["nlp"] == pytest.approx(200.0) and usage["ops"] == pytest.approx(80.0)


def test_an_attempt_counts_the_gpus_of_every_pod() -> None:
    pods = [{"node": "a", "gpu_indices": [0, 1]}, {"node": "b", "gpu_indices": [0, 1], "gpu_fraction": 1.0}]
    assert attempt_gpus([0, 1], 1.0, pods) == 4.0  # a 2-node gang of 2 GPUs each, not its first pod's 2
    assert attempt_gpus([3], 0.5, []) == 0.5  # attempts recorded before pods: their one pod
    assert attempt_gpus(None, None, None) == 0.0
