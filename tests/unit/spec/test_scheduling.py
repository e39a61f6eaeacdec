"""The scheduling policy: one default for the server and the simulator, the functions that apply its bands
and young-work weights (spec/scheduling.py), and the operator's file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.scheduler import QueueView, SchedulerConfig, Share
from gpupool.sim.policies import BY_NAME
from gpupool.spec import SpecError
from gpupool.spec.scheduling import (
    DEFAULT_POLICY,
    SchedulingSpec,
    band_text,
    changed_fields,
    effective_priority,
    parse_scheduling_spec,
    priority_parts,
    scheduling_fields,
    service_band,
    weighted_by_young,
    young_weight,
)

MINUTE, HOUR = 60.0, 3600.0
SERVICE = (0.0, 119.0, 120.0, 3599.0, 3600.0, 16 * HOUR - 1, 16 * HOUR, 100 * HOUR)


def test_the_simulators_gpupool_policy_is_the_servers_default() -> None:
    assert BY_NAME["gpupool"].config is DEFAULT_POLICY
    assert DEFAULT_POLICY.ordering == "las" and DEFAULT_POLICY.las_preempt
    assert DEFAULT_POLICY.las_thresholds == (2 * MINUTE, 16 * HOUR)
    assert parse_scheduling_spec("").config() == DEFAULT_POLICY  # an empty file changes nothing
    assert parse_scheduling_spec("# las_preempt: false\n\n").config() == DEFAULT_POLICY  # nor comments alone


def test_bands_follow_the_las_ordering_less_service_is_a_higher_band() -> None:
    thresholds = DEFAULT_POLICY.las_thresholds
    bands = [service_band(a, thresholds) for a in SERVICE]
    assert bands == [2, 2, 1, 1, 1, 1, 0, 0]
    assert bands == sorted(bands, reverse=True)


def test_user_priority_dominates_the_band() -> None:
    for low in (0, 50, 99):
        worst_high = effective_priority(low + 1, 100 * HOUR, DEFAULT_POLICY, None)
        best_low = effective_priority(low, 0.0, DEFAULT_POLICY, None)
        assert worst_high > best_low


def test_among_equal_user_priorities_less_service_outranks_more() -> None:
    ranks = [effective_priority(50, a, DEFAULT_POLICY, "las") for a in SERVICE]
    assert ranks == sorted(ranks, reverse=True) and ranks[0] > ranks[2] > ranks[-1]
    for attained, rank in zip(SERVICE, ranks, strict=True):
        assert priority_parts(rank, DEFAULT_POLICY) == (
            50,
            service_band(attained, DEFAULT_POLICY.las_thresholds),
        )


def test_a_queue_that_does_not_order_by_las_has_no_bands() -> None:
    ranks = {effective_priority(50, a, DEFAULT_POLICY, "fifo") for a in SERVICE}
    assert len(ranks) == 1  # all in the top band: nothing preempts inside the queue by service
    assert effective_priority(51, 0.0, DEFAULT_POLICY, "fifo") > effective_priority(
        50, 0.0, DEFAULT_POLICY, "las"
    )


def test_without_las_preempt_the_priority_is_the_users() -> None:
    config = SchedulerConfig(ordering="las", las_thresholds=(120.0,))
    assert {effective_priority(50, a, config, None) for a in SERVICE} == {50}
    assert priority_parts(50, config) == (50, None)


def test_young_work_counts_5_under_2_gpu_minutes_and_1_under_1_gpu_hour() -> None:
    young = DEFAULT_POLICY.young_weights
    assert [young_weight(a, young) for a in (0.0, 119.0, 120.0, 3599.0, 3600.0)] == [5, 5, 1, 1, 0]


def test_a_queues_over_quota_weight_is_its_spec_weight_times_its_young_work() -> None:
    queues = (
        QueueView("a", gpu=Share(4, None, 2.0)),
        QueueView("b", gpu=Share(4, None, 1.0)),
        QueueView("idle", gpu=Share(4, None, 1.0)),
    )
    weighted = weighted_by_young(queues, {"a": 5.0, "b": 1.0})
    assert [q.gpu.weight for q in weighted] == [10.0, 1.0, 0.0]
    assert weighted[1] is queues[1]  # unchanged weight: the same view, so an unchanged pass stays equal
    assert [q.gpu.quota for q in weighted] == [4, 4, 4]  # quotas are never touched


def test_a_parent_queue_counts_the_young_work_below_it() -> None:
    queues = (
        QueueView("research", gpu=Share(0, None, 1.0)),
        QueueView("nlp", parent="research"),
        QueueView("vision", parent="research"),
        QueueView("ops"),
    )
    weighted = {
        q.name: q.gpu.weight for q in weighted_by_young(queues, {"nlp": 5.0, "vision": 1.0, "ops": 2.0})
    }
    assert weighted == {"research": 6.0, "nlp": 5.0, "vision": 1.0, "ops": 2.0}


def test_bands_are_said_in_gpu_time() -> None:
    thresholds = DEFAULT_POLICY.las_thresholds
    assert band_text(thresholds, 2) == "under 2 GPU-minutes"
    assert band_text(thresholds, 1) == "at least 2 GPU-minutes"
    assert band_text(thresholds, 0) == "at least 16 GPU-hours"


def test_an_operator_can_turn_bands_and_weights_off_or_change_them() -> None:
    off = parse_scheduling_spec("ordering: fifo\nblocking: backfill\nlas_preempt: false\nyoung_weights: []\n")
    assert off.config() == SchedulerConfig(
        ordering="fifo", blocking="backfill", las_thresholds=(120.0, 57600.0)
    )
    changed = parse_scheduling_spec(
        {"las_thresholds": ["5m", "4h", "16h"], "young_weights": [{"below": "1h", "weight": 2}]}
    )
    assert changed.config(usage_weight=1.0).las_thresholds == (300.0, 4 * HOUR, 16 * HOUR)
    assert changed.config().young_weights == ((HOUR, 2.0),)
    assert changed.config(usage_weight=1.0).usage_weight == 1.0
    assert changed.config().max_stopping_gpus is None  # no limit unless the file sets one
    assert parse_scheduling_spec("max_stopping_gpus: 64").config().max_stopping_gpus == 64.0


@pytest.mark.parametrize(
    ("text", "field", "fix"),
    [
        ("ordering: lsa", "ordering", "did you mean 'las'"),
        ("las_thresholds: [16h, 2m]", "las_thresholds[1]", "increasing order"),
        ("las_thresholds: [0]", "las_thresholds[0]", "above 0"),
        ("las_thresholds: [2m, soon]", "las_thresholds[1]", "is not a duration"),
        ("las_thresholds: []", "las_preempt", "las_preempt: false"),
        ("las_preempt: yes", "las_preempt", "true or false"),
        ("young_weights: [{below: 2m}]", "young_weights[0].weight", "required"),
        ("young_weights: [{below: 2m, weight: -1}]", "young_weights[0].weight", "greater than 0"),
        ("young_weights: [{below: 2m, weight: 1}, {below: 120, weight: 1}]", "young_weights", "once"),
        ("bands: [2m]", "bands", "its fields"),
        ("blocking: fifo", "blocking", "one of"),
        ("max_stopping_gpus: 0", "max_stopping_gpus", "greater than 0"),
        ("max_stopping_gpus: many", "max_stopping_gpus", "not a number"),
    ],
)
def test_a_bad_policy_names_the_field_and_the_fix(text: str, field: str, fix: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_scheduling_spec(text)
    assert caught.value.field == field
    assert fix in str(caught.value)


def test_every_field_of_scheduling_yaml_is_in_docs_scheduler_md() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "scheduler.md").read_text()
    for name in SchedulingSpec.model_fields:
        assert f"| `{name}` |" in text, f"docs/scheduler.md lacks scheduling.yaml's {name}"


@pytest.mark.parametrize(
    "config",
    [
        DEFAULT_POLICY,
        replace(DEFAULT_POLICY, placement="spread", max_stopping_gpus=64, las_thresholds=(60.0, 8 * HOUR)),
        replace(DEFAULT_POLICY, ordering="fifo", blocking="backfill", las_preempt=False, young_weights=()),
    ],
)
def test_the_fields_the_api_shows_give_the_same_policy_back(config: SchedulerConfig) -> None:
    assert parse_scheduling_spec(scheduling_fields(config)).config() == config


def test_what_a_policy_changes_of_the_default_is_said_in_the_files_words() -> None:
    assert changed_fields(DEFAULT_POLICY) == []
    tuned = replace(
        DEFAULT_POLICY, placement="spread", las_thresholds=(90.0, 16 * HOUR), young_weights=((HOUR, 2.0),)
    )
    assert changed_fields(tuned) == [
        "placement spread", "las_thresholds [1m30s, 16h]", "young_weights [{below: 1h, weight: 2}]"
    ]  # fmt: skip
