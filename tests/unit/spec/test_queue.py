"""The queue spec: quota, limit and over-quota weight per resource, in a hierarchy."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from gpupool.spec import QueueResources, QueueSpec, ResourceShare, SpecError, parse_queue_spec
from gpupool.spec.queue import QUEUE_FIELD_EXAMPLES

EXAMPLE = """\
name: nlp
parent: research
priority: 10
description: NLP team
resources:
  gpu: {quota: 16, limit: 32, over_quota_weight: 2}
  cpu: {quota: 256}
  memory: {quota: 2TB, limit: 4TiB}
"""


def test_example_queue_parses_with_the_expected_values() -> None:
    queue = parse_queue_spec(EXAMPLE)
    assert (queue.name, queue.parent, queue.priority, queue.description) == (
        "nlp",
        "research",
        10,
        "NLP team",
    )
    assert queue.resources.gpu == ResourceShare(quota=16, limit=32, over_quota_weight=2)
    assert queue.resources.cpu == ResourceShare(quota=256)
    assert queue.resources.memory == ResourceShare(quota=2e12, limit=4.0 * 2**40)


def test_defaults_of_a_minimal_queue() -> None:
    queue = parse_queue_spec("name: nlp")
    assert (queue.parent, queue.priority, queue.description) == (None, 0, "")
    assert queue.resources == QueueResources()
    for share in (queue.resources.gpu, queue.resources.cpu, queue.resources.memory):
        assert (share.quota, share.limit, share.over_quota_weight) == (0.0, None, 1.0)


def test_limit_equal_to_quota_is_allowed() -> None:
    assert (
        parse_queue_spec({"name": "a", "resources": {"gpu": {"quota": 8, "limit": 8}}}).resources.gpu.limit
        == 8
    )


def test_limit_below_quota_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        parse_queue_spec({"name": "a", "resources": {"gpu": {"quota": 8, "limit": 4}}})
    assert caught.value.field == "resources.gpu.limit"


def test_memory_quota_accepts_size_text_but_gpu_quota_does_not() -> None:
    assert (
        parse_queue_spec({"name": "a", "resources": {"memory": {"quota": "1GiB"}}}).resources.memory.quota
        == 2**30
    )
    with pytest.raises(SpecError) as caught:
        parse_queue_spec({"name": "a", "resources": {"gpu": {"quota": "1GiB"}}})
    assert caught.value.field == "resources.gpu.quota"


def test_fractional_gpu_quota_is_allowed() -> None:
    assert parse_queue_spec({"name": "a", "resources": {"gpu": {"quota": 0.5}}}).resources.gpu.quota == 0.5


_SHARE = st.fixed_dictionaries(
    {},
    optional={
        "quota": st.floats(min_value=0, max_value=1e6),
        "over_quota_weight": st.floats(min_value=0, max_value=100),
    },
)


@given(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["nlp", "cv", "team-a", "q1"])},
        optional={
            "parent": st.sampled_from(["research", "dept-2"]),
            "priority": st.integers(min_value=0, max_value=1000),
            "description": st.text(max_size=30),
            "resources": st.fixed_dictionaries({}, optional={"gpu": _SHARE, "cpu": _SHARE, "memory": _SHARE}),
        },
    ),
    st.floats(min_value=0, max_value=1e6),
)
def test_every_valid_queue_round_trips_through_its_json_dump(data: dict[str, Any], headroom: float) -> None:
    gpu = data.get("resources", {}).get("gpu")
    if gpu is not None:
        gpu["limit"] = gpu.get("quota", 0.0) + headroom
    queue = parse_queue_spec(data)
    assert parse_queue_spec(json.loads(json.dumps(queue.model_dump(mode="json")))) == queue


@pytest.mark.parametrize("model", [QueueSpec, QueueResources, ResourceShare])
def test_every_queue_field_says_what_it_means_and_its_default(model: type[BaseModel]) -> None:
    for name, info in model.model_fields.items():
        assert info.description, f"{model.__name__}.{name}"
        assert "default" in info.description or "required" in info.description, f"{model.__name__}.{name}"


def test_every_queue_field_path_has_its_own_example() -> None:
    paths = list(QueueSpec.model_fields)
    for kind in QueueResources.model_fields:
        paths += [f"resources.{kind}"] + [f"resources.{kind}.{n}" for n in ResourceShare.model_fields]
    assert [p for p in paths if p not in QUEUE_FIELD_EXAMPLES] == []


def test_queue_json_schema_builds() -> None:
    assert QueueSpec.model_json_schema()["required"] == ["name"]
