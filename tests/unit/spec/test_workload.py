"""The workload spec: the documented example, defaults, priority semantics, cross-field rules, round-trips."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from gpupool.spec import (
    PRIORITY_CLASSES,
    CheckpointSpec,
    GpuRequest,
    Resources,
    RetrySpec,
    ScalingSpec,
    SpecError,
    WorkloadSpec,
    parse_workload_spec,
)
from gpupool.spec.arrays import array_limit, parse_array
from gpupool.spec.document import example_for
from gpupool.spec.priority import NON_PREEMPTIBLE_BY_DEFAULT
from gpupool.spec.sections import IdleSpec
from gpupool.spec.workload import FIELD_EXAMPLES, RESERVED_ENV_NAMES

# The example spec of DESIGN.md, verbatim.
DESIGN_EXAMPLE = """\
kind: job
name: llama-finetune
queue: nlp
priority: train            # named classes (inference > build > interactive > train) or a number
preemptible: true
nodes: 2
resources: {gpu: "H100:8", cpu: 32, memory: 256GB}   # gpu also: 4, "A100|H100:2", "80GB:1", 0.5
commands:
  - torchrun --nnodes=$NNODES --node-rank=$NODE_RANK --nproc-per-node=$GPUPOOL_GPUS_PER_NODE
      --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT train.py
checkpoint: {dir: ./ckpt}
retry: {max_restarts: 3, on: [preemption, node-failure]}
max_duration: 12h
"""


def test_design_example_parses_with_the_expected_values() -> None:
    spec = parse_workload_spec(DESIGN_EXAMPLE)
    assert spec.kind == "job"
    assert spec.name == "llama-finetune"
    assert spec.queue == "nlp"
    assert spec.priority == 50
    assert spec.priority_class == "train"
    assert spec.preemptible is True
    assert spec.nodes == 2
    assert spec.resources.gpu == GpuRequest(8, ("H100",))
    assert spec.resources.cpu == 32.0
    assert spec.resources.memory == 256 * 10**9
    assert spec.commands == [
        "torchrun --nnodes=$NNODES --node-rank=$NODE_RANK --nproc-per-node=$GPUPOOL_GPUS_PER_NODE "
        "--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT train.py"
    ]
    assert spec.checkpoint == CheckpointSpec(dir="./ckpt")
    assert spec.retry == RetrySpec(max_restarts=3, on=["preemption", "node-failure"])
    assert spec.max_duration == 12 * 3600.0
    assert spec.grace_period == 30.0


def test_defaults_of_a_minimal_spec() -> None:
    spec = parse_workload_spec("commands: python train.py")
    assert spec.kind == "job"
    assert spec.name is None
    assert spec.queue == "default"
    assert (spec.priority, spec.priority_class, spec.preemptible) == (50, "train", True)
    assert spec.nodes == 1
    assert spec.resources == Resources()
    assert spec.resources.gpu == GpuRequest(0)
    assert (spec.resources.cpu, spec.resources.memory) == (None, None)
    assert spec.commands == ["python train.py"]
    assert spec.env == {}
    assert spec.workdir is None
    assert spec.checkpoint is None
    assert spec.retry.max_restarts == 0
    assert spec.retry.on == ["preemption", "node-failure"]
    assert spec.max_duration is None
    assert spec.grace_period == 30.0


def test_a_spec_built_in_code_gets_the_same_defaults() -> None:
    spec = WorkloadSpec(commands=["python train.py"])
    assert spec == parse_workload_spec({"commands": ["python train.py"]})
    assert (spec.priority, spec.priority_class, spec.preemptible) == (50, "train", True)


def test_priority_classes_are_ordered_inference_build_interactive_train() -> None:
    ordered = sorted(PRIORITY_CLASSES, key=PRIORITY_CLASSES.__getitem__, reverse=True)
    assert ordered == ["inference", "build", "interactive", "train"]
    assert all(0 <= value <= 1000 for value in PRIORITY_CLASSES.values())
    assert frozenset({"inference", "build", "interactive"}) == NON_PREEMPTIBLE_BY_DEFAULT


@pytest.mark.parametrize(
    ("priority", "number", "cls", "preemptible"),
    [
        ("inference", 125, "inference", False),
        ("build", 100, "build", False),
        ("interactive", 75, "interactive", False),
        ("train", 50, "train", True),
        ("Inference", 125, "inference", False),
        (" TRAIN ", 50, "train", True),
        (50, 50, None, True),
        (51, 51, None, False),
        (0, 0, None, True),
        (1000, 1000, None, False),
        (125, 125, None, False),
        ("100", 100, None, False),
    ],
)
def test_priority_class_sets_the_preemptible_default(
    priority: str | int, number: int, cls: str | None, preemptible: bool
) -> None:
    spec = parse_workload_spec({"commands": ["x"], "priority": priority})
    assert (spec.priority, spec.priority_class, spec.preemptible) == (number, cls, preemptible)


def test_preemptible_given_in_the_spec_overrides_the_default() -> None:
    assert parse_workload_spec({"commands": ["x"], "priority": "inference", "preemptible": True}).preemptible
    assert not parse_workload_spec({"commands": ["x"], "priority": "train", "preemptible": False}).preemptible
    assert (
        parse_workload_spec({"commands": ["x"], "priority": "build", "preemptible": None}).preemptible
        is False
    )


def test_priority_class_alone_sets_the_priority() -> None:
    spec = parse_workload_spec({"commands": ["x"], "priority_class": "Build"})
    assert (spec.priority, spec.priority_class, spec.preemptible) == (100, "build", False)


def test_priority_class_that_agrees_with_priority_is_accepted() -> None:
    spec = parse_workload_spec({"commands": ["x"], "priority": 125, "priority_class": "inference"})
    assert (spec.priority, spec.priority_class) == (125, "inference")


def test_fractional_gpu_needs_a_single_node() -> None:
    assert parse_workload_spec({"commands": ["x"], "resources": {"gpu": 0.5}}).resources.gpu.is_fractional
    with pytest.raises(SpecError) as caught:
        parse_workload_spec({"commands": ["x"], "nodes": 2, "resources": {"gpu": "H100:0.5"}})
    assert caught.value.field == "resources.gpu"
    assert "single node" in caught.value.message


def test_whole_gpus_per_node_may_span_many_nodes() -> None:
    spec = parse_workload_spec({"commands": ["x"], "nodes": 4, "resources": {"gpu": "A100|H100:8"}})
    assert spec.resources.gpu == GpuRequest(8, ("A100", "H100"))
    assert spec.nodes == 4


def test_cpu_only_jobs_may_span_many_nodes() -> None:
    assert parse_workload_spec({"commands": ["x"], "nodes": 3}).resources.gpu.count == 0


@pytest.mark.parametrize("gpu", [4, "4", "A100|H100:2", "80GB:1", 0.5, "0.5", "H100", "h100:8", 0])
def test_every_gpu_form_is_accepted_in_a_spec(gpu: object) -> None:
    spec = parse_workload_spec({"commands": ["x"], "resources": {"gpu": gpu}})
    assert isinstance(spec.resources.gpu, GpuRequest)


def test_resources_accept_size_text_and_numbers() -> None:
    resources = parse_workload_spec(
        {"commands": ["x"], "resources": {"cpu": "0.5", "memory": "64GiB"}}
    ).resources
    assert (resources.cpu, resources.memory) == (0.5, 64 * 2**30)
    assert parse_workload_spec({"commands": ["x"], "resources": {"memory": 4096}}).resources.memory == 4096


def test_env_values_become_text() -> None:
    spec = parse_workload_spec(
        {"commands": ["x"], "env": {"A": "text", "B": 3, "C": 0.5, "D": True, "E": False, "_F": ""}}
    )
    assert spec.env == {"A": "text", "B": "3", "C": "0.5", "D": "true", "E": "false", "_F": ""}


@pytest.mark.parametrize("name", ["GPUPOOL_ATTEMPT", "GPUPOOL_", *sorted(RESERVED_ENV_NAMES)])
def test_env_may_not_set_the_job_contract_names(name: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_workload_spec({"commands": ["x"], "env": {name: "1"}})
    assert caught.value.field == f"env.{name}"


@pytest.mark.parametrize(
    ("secrets", "field", "said"),
    [
        (["HF TOKEN"], "secrets[0]", "is not an environment variable name"),
        (["A", "A"], "secrets[1]", "is named twice"),
        (["OK", "GPUPOOL_X"], "secrets[1]", "is reserved"),
        (["TOKEN"], "secrets[0]", "is also set in env"),
        ([3], "secrets[0]", "is not an environment variable name"),
    ],
)
def test_secrets_are_names_of_environment_variables(secrets: list[Any], field: str, said: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_workload_spec({"commands": ["x"], "env": {"TOKEN": "1"}, "secrets": secrets})
    assert caught.value.field == field and said in str(caught.value)
    assert parse_workload_spec({"commands": ["x"], "secrets": "HF_TOKEN"}).secrets == ["HF_TOKEN"]


def test_yaml_is_read_with_yaml_1_2_scalars() -> None:
    spec = parse_workload_spec(
        "commands: [x]\n"
        "retry: {on: [failure]}\n"  # `on` is a key, not the boolean true of YAML 1.1
        "env: {A: no, B: off, C: yes, D: 1:30, E: 2024-01-01, F: true, G: 1e3}\n"
        "preemptible: false\n"
    )
    assert spec.retry.on == ["failure"]
    assert spec.env == {
        "A": "no",
        "B": "off",
        "C": "yes",
        "D": "1:30",
        "E": "2024-01-01",
        "F": "true",
        "G": "1000.0",
    }
    assert spec.preemptible is False


def test_a_spec_may_come_as_bytes_or_any_mapping() -> None:
    assert parse_workload_spec(b"commands: [x]\n").commands == ["x"]
    assert parse_workload_spec(types.MappingProxyType({"commands": ["x"]})).commands == ["x"]


def test_parsing_does_not_change_the_input() -> None:
    data: dict[str, Any] = {"commands": "x", "priority": "build", "env": {"A": 1}}
    before = json.dumps(data, sort_keys=True)
    parse_workload_spec(data)
    assert json.dumps(data, sort_keys=True) == before


def test_checkpoint_may_be_given_as_just_the_directory() -> None:
    spec = parse_workload_spec({"commands": ["x"], "checkpoint": "./ckpt"})
    assert spec.checkpoint == CheckpointSpec(dir="./ckpt")


def test_retry_reasons_are_kept_once_each() -> None:
    spec = parse_workload_spec({"commands": ["x"], "retry": {"on": ["failure", "failure", "preemption"]}})
    assert spec.retry.on == ["failure", "preemption"]


@pytest.mark.parametrize(
    ("value", "seconds"), [("12h", 43200.0), ("1h30m", 5400.0), (90, 90.0), ("90s", 90.0), (0.5, 0.5)]
)
def test_durations_are_seconds(value: object, seconds: float) -> None:
    spec = parse_workload_spec({"commands": ["x"], "max_duration": value, "grace_period": "0s"})
    assert spec.max_duration == seconds
    assert spec.grace_period == 0.0


def test_services_are_workloads_too() -> None:
    spec = parse_workload_spec({"kind": "service", "commands": ["serve"], "priority": "inference"})
    assert (spec.kind, spec.preemptible) == ("service", False)


def test_a_service_refuses_a_retry_policy_it_would_not_use() -> None:
    with pytest.raises(SpecError) as raised:
        parse_workload_spec({"kind": "service", "commands": ["serve"], "retry": {"max_restarts": 3}})
    assert raised.value.field == "retry"
    assert "applies to jobs only" in str(raised.value) and "kind: job" in str(raised.value)
    # the default, as a stored spec gives it back, is no retry policy at all
    stored = parse_workload_spec({"kind": "service", "commands": ["serve"]}).model_dump(mode="json")
    assert parse_workload_spec(stored).kind == "service"


def test_a_service_runs_1_to_64_replicas_and_a_job_refuses_them() -> None:
    assert parse_workload_spec({"kind": "service", "commands": ["serve"]}).replicas == 1
    assert parse_workload_spec({"kind": "service", "commands": ["serve"], "replicas": "3"}).replicas == 3
    for bad, words in ((0, "at least 1"), (65, "at most 64"), (True, "not a number"), (2.5, "whole number")):
        with pytest.raises(SpecError) as raised:
            parse_workload_spec({"kind": "service", "commands": ["serve"], "replicas": bad})
        assert raised.value.field == "replicas" and words in str(raised.value), str(raised.value)
    with pytest.raises(SpecError) as raised:
        parse_workload_spec({"commands": ["train"], "replicas": 2})
    assert raised.value.field == "replicas"
    assert "applies to services only" in str(raised.value) and "kind: service" in str(raised.value)


def test_a_range_of_replicas_with_scaling_starts_at_its_least_and_keeps_the_range() -> None:
    spec = parse_workload_spec(
        {"kind": "service", "commands": ["serve"], "replicas": " 2..5 ", "scaling": {"target": 10}}
    )
    assert spec.replicas == 2 and spec.scaling is not None
    assert (spec.scaling.min, spec.scaling.max, spec.scaling.metric) == (2, 5, "rps")
    assert (spec.scaling.window, spec.scaling.scale_up_delay, spec.scaling.scale_down_delay) == (60, 30, 300)
    # the same written with scaling's own bounds, and a start inside them
    same = parse_workload_spec(
        {"kind": "service", "commands": ["serve"], "scaling": {"min": 2, "max": 5, "target": 10}}
    )
    assert same == spec
    started = parse_workload_spec(
        {"kind": "service", "commands": ["serve"], "replicas": 3,
         "scaling": {"min": 2, "max": 5, "target": 1.5, "metric": "concurrency", "window": "10s"}}
    )  # fmt: skip
    assert started.replicas == 3 and started.scaling is not None and started.scaling.window == 10


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ({"replicas": "1..4"}, "scaling", "is required: replicas 1..4 is a range"),
        ({"replicas": 3, "scaling": {"target": 1}}, "replicas", "scaling needs a range"),
        ({"scaling": {"target": 1}}, "replicas", "scaling needs a range"),
        ({"replicas": "0..4", "scaling": {"target": 1}}, "replicas", "1 <= MIN <= MAX <= 64"),
        ({"replicas": "3..2", "scaling": {"target": 1}}, "replicas", "1 <= MIN <= MAX <= 64"),
        ({"replicas": "1..65", "scaling": {"target": 1}}, "replicas", "1 <= MIN <= MAX <= 64"),
        ({"replicas": "1..4", "scaling": {}}, "scaling.target", "is required"),
        ({"replicas": "1..4", "scaling": {"target": 0}}, "scaling.target", "greater than 0"),
        ({"replicas": "1..4", "scaling": {"target": True}}, "scaling.target", "not a number"),
        ({"replicas": "1..4", "scaling": {"target": 1, "metric": "qps"}}, "scaling.metric", "'rps'"),
        ({"replicas": "1..4", "scaling": {"target": 1, "min": 2}}, "scaling.min", "give the range once"),
        ({"replicas": "1..4", "scaling": {"target": 1, "window": "2h"}}, "scaling.window", "1s..1h"),
        (
            {"replicas": "1..4", "scaling": {"target": 1, "scale_down_delay": "2d"}},
            "scaling.scale_down_delay",
            "at most 24h",
        ),
        ({"replicas": "1..4", "scaling": {"target": 1, "cooldown": 5}}, "scaling.cooldown", ""),
        ({"scaling": {"min": 2, "target": 1}}, "scaling.max", "is required with scaling.min"),
        ({"scaling": {"min": 3, "max": 2, "target": 1}}, "scaling.max", "below scaling.min"),
        (
            {"replicas": 5, "scaling": {"min": 1, "max": 4, "target": 1}},
            "replicas",
            "outside scaling's range",
        ),
        ({"kind": "job", "scaling": {"min": 1, "max": 2, "target": 1}}, "scaling", "services only"),
    ],
)
def test_a_bad_range_or_scaling_names_its_field(extra: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_workload_spec({"kind": "service", "commands": ["serve"], **extra})
    assert raised.value.field == field and words in str(raised.value), str(raised.value)


def test_after_takes_ids_short_forms_and_mappings_and_stores_them_in_full() -> None:
    spec = parse_workload_spec(
        {
            "commands": ["true"],
            "after": [12, "13", " ended : 14 ", "Started:15", {"workload": 16, "when": "failed"}],
        }
    )
    assert [(d.workload, d.when) for d in spec.after] == [
        (12, "succeeded"), (13, "succeeded"), (14, "ended"), (15, "started"), (16, "failed"),
    ]  # fmt: skip
    assert parse_workload_spec({"commands": ["true"], "after": 7}).model_dump()["after"] == [
        {"workload": 7, "when": "succeeded"}
    ]
    assert parse_workload_spec({"commands": ["true"]}).after == []
    # Slurm's dependency types, as sbatch --dependency writes them
    slurm = parse_workload_spec(
        {
            "commands": ["true"],
            "after": [
                "afterok:21",
                "AfterAny:22",
                "afternotok:23",
                "after:24",
                {"workload": 25, "when": "afterany"},
            ],
        }
    )
    assert [(d.workload, d.when) for d in slurm.after] == [
        (21, "succeeded"), (22, "ended"), (23, "failed"), (24, "started"), (25, "ended"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("after", "field", "words"),
    [
        ([True], "after[0].workload", "not a workload id"),
        (["soon"], "after[0].workload", "WHEN:ID"),
        (["done:3"], "after[0].when", "is not one of 'succeeded', 'failed', 'ended', 'started'"),
        ([{"workload": 3, "when": "succeded"}], "after[0].when", "did you mean 'succeeded'"),
        ([0], "after[0].workload", "at least 1"),
        ([4, "ended:4"], "after[1]", "already listed at after[0]"),
        ([{"workload": 3, "wehn": "ended"}], "after[0].wehn", "did you mean 'when'"),
        ([{"when": "ended"}], "after[0].workload", "is required"),
        (list(range(1, 102)), "after", "at most 100"),
        (True, "after", "not a list"),
    ],
)
def test_a_bad_dependency_names_its_entry(after: Any, field: str, words: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_workload_spec({"commands": ["true"], "after": after})
    assert raised.value.field == field and words in str(raised.value), str(raised.value)


@pytest.mark.parametrize(
    ("given", "stored", "count", "limit"),
    [
        ("0-15%4", "0-15%4", 16, 4),
        ("1,3,5-9", "1,3,5-9", 7, None),
        ("0-20:10", "0,10,20", 3, None),
        (7, "7", 1, None),
        (" 3,1,2 % 2 ", "1-3%2", 3, 2),
        ("0-3,2-5", "0-5", 6, None),
    ],
)
def test_an_array_is_stored_in_one_canonical_form(
    given: object, stored: str, count: int, limit: int | None
) -> None:
    spec = parse_workload_spec({"commands": ["true"], "array": given})
    assert spec.array == stored
    parsed = parse_array(spec.array)
    assert (len(parsed.indices), parsed.limit) == (count, limit)
    assert parse_array(parsed.text()).indices == parsed.indices
    assert array_limit(stored) == limit


@pytest.mark.parametrize(
    ("array", "words"),
    [
        ("0-1000", "more than 1000 tasks"),
        ("0-999,1000", "more than 1000 tasks"),
        ("0-2000000", "index above 1000000"),
        ("5-2", "'5-2' is not a range N-M with N <= M"),
        ("0-9:0", "step >= 1"),
        ("a-b", "'a-b' is not N, N-M or N-M:STEP"),
        ("0-3,5-2", "'0-3,5-2' has '5-2', which is not a range N-M with N <= M"),
        ("0-3,a", "has 'a', which is not N, N-M or N-M:STEP"),
        ("0-3%0", "limit after %"),
        ("0-3%x", "limit after %"),
        (True, "not an array of task indices"),
        ([1, 2], "not an array of task indices"),
    ],
)
def test_a_bad_array_names_the_field(array: object, words: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_workload_spec({"commands": ["true"], "array": array})
    assert raised.value.field == "array" and words in str(raised.value), str(raised.value)


def test_an_array_is_for_jobs_only() -> None:
    with pytest.raises(SpecError) as raised:
        parse_workload_spec({"kind": "service", "commands": ["serve"], "array": "0-3"})
    assert raised.value.field == "array" and "jobs only" in str(raised.value)


# --- round-trip through the JSON the server stores -----------------------------------------------


def _reload(spec: WorkloadSpec) -> WorkloadSpec:
    return parse_workload_spec(json.loads(json.dumps(spec.model_dump(mode="json"))))


def test_idle_takes_a_duration_alone_or_in_full() -> None:
    short = parse_workload_spec({"commands": ["x"], "resources": {"gpu": 1}, "idle": "2h"}).idle
    assert short == IdleSpec(timeout=7200.0, action="hold", utilization=1.0)
    full = {"timeout": "30m", "action": "cancel", "utilization": 5}
    spec = parse_workload_spec({"commands": ["x"], "resources": {"gpu": 0.5}, "idle": full})
    assert spec.idle == IdleSpec(timeout=1800.0, action="cancel", utilization=5.0)


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ({"idle": "2h"}, "idle", "needs GPUs to watch"),
        ({"resources": {"gpu": 1}, "idle": "5s"}, "idle.timeout", "must be 10s..30d"),
        ({"resources": {"gpu": 1}, "idle": "31d"}, "idle.timeout", "must be 10s..30d"),
        (
            {"resources": {"gpu": 1}, "idle": {"timeout": "1h", "action": "stop"}},
            "idle.action",
            "'hold', 'cancel'",
        ),
        (
            {"resources": {"gpu": 1}, "idle": {"timeout": "1h", "utilization": 0}},
            "idle.utilization",
            "greater than 0",
        ),
        (
            {"resources": {"gpu": 1}, "idle": {"timeout": "1h", "utilization": True}},
            "idle.utilization",
            "true/false",
        ),
        ({"resources": {"gpu": 1}, "idle": {"after": "1h"}}, "idle.after", "not a field"),
        ({"resources": {"gpu": 1}, "idle": {"action": "hold"}}, "idle.timeout", "is required"),
    ],
)
def test_a_bad_idle_names_its_field(extra: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_workload_spec({"commands": ["x"], **extra})
    assert caught.value.field == field and words in str(caught.value)


def test_design_example_round_trips_through_json() -> None:
    spec = parse_workload_spec(DESIGN_EXAMPLE)
    dumped = spec.model_dump(mode="json")
    assert dumped["resources"] == {"gpu": "H100:8", "cpu": 32.0, "memory": 256 * 10**9}
    assert dumped["max_duration"] == 43200.0
    assert (dumped["priority"], dumped["priority_class"]) == (50, "train")
    assert _reload(spec) == spec
    assert parse_workload_spec(spec.model_dump()) == spec


def test_priority_given_as_a_number_reloads_without_a_class() -> None:
    spec = parse_workload_spec({"commands": ["x"], "priority": 100})
    reloaded = _reload(spec)
    assert (reloaded.priority, reloaded.priority_class, reloaded.preemptible) == (100, None, False)


_NAME = st.builds(
    lambda a, b: a + b,
    st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789"),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", max_size=10),
).filter(lambda name: not name.isdigit())  # digits alone: an id, never a name
_TEXT = st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != "")
_ENV_NAME = st.builds(
    lambda a, b: a + b,
    st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ_abc"),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_", max_size=8),
).filter(lambda k: not k.startswith("GPUPOOL_") and k not in RESERVED_ENV_NAMES)
_GPU = st.one_of(
    st.integers(min_value=0, max_value=16),
    st.floats(min_value=0.01, max_value=0.99),
    st.sampled_from(["H100:8", "a100|h100:2", "80GB:1", "0.25", "A100-80GB:4", "H100", "l4:0.5"]),
)
_DURATION = st.one_of(
    st.floats(min_value=1e-3, max_value=86400 * 365),
    st.sampled_from(["12h", "1h30m", "90s", "2d", "1.5h", "0.5s"]),
)


@st.composite
def workload_dicts(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"commands": draw(st.one_of(_TEXT, st.lists(_TEXT, min_size=1, max_size=3)))}
    optional: dict[str, st.SearchStrategy[Any]] = {
        "kind": st.sampled_from(["job", "service"]),
        "name": _NAME,
        "queue": _NAME,
        "priority": st.one_of(
            st.sampled_from([*PRIORITY_CLASSES, "Train", "INFERENCE"]),
            st.integers(min_value=0, max_value=1000),
        ),
        "preemptible": st.booleans(),
        "nodes": st.integers(min_value=1, max_value=1024),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "gpu": _GPU,
                "cpu": st.floats(min_value=0.001, max_value=1e4),
                "memory": st.one_of(
                    st.integers(min_value=1, max_value=2**50), st.sampled_from(["256GB", "1.5TiB"])
                ),
            },
        ),
        "env": st.dictionaries(
            _ENV_NAME,
            st.one_of(
                st.text(max_size=10),
                st.integers(),
                st.booleans(),
                st.floats(allow_nan=False, allow_infinity=False),
            ),
            max_size=4,
        ),
        "workdir": _TEXT,
        "checkpoint": st.one_of(_TEXT, st.fixed_dictionaries({"dir": _TEXT})),
        "retry": st.fixed_dictionaries(
            {},
            optional={
                "max_restarts": st.integers(min_value=0, max_value=100),
                "on": st.lists(st.sampled_from(["failure", "preemption", "node-failure"]), max_size=3),
            },
        ),
        "max_duration": _DURATION,
        "replicas": st.integers(min_value=1, max_value=64),
        "array": st.sampled_from(["0-3", "1,3,5-9%2", 7, "0-99:10", "2-4%1"]),
        "after": st.lists(st.integers(min_value=1, max_value=10**9), max_size=4, unique=True).flatmap(
            lambda ids: st.tuples(
                *(st.sampled_from([i, str(i), f"ended:{i}", {"workload": i, "when": "started"}]) for i in ids)
            ).map(list)
        ),
        "grace_period": st.one_of(
            st.floats(min_value=0, max_value=3600), st.sampled_from(["0s", "1m", "1h"])
        ),
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            spec[key] = draw(strategy)
    if spec.get("kind") == "service":
        spec.pop("retry", None)  # a service restarts whenever it stops: retry is refused
        spec.pop("array", None)  # a service has replicas, not array tasks
        if draw(st.booleans()):  # a range of replicas, followed by load
            low = draw(st.integers(min_value=1, max_value=64))
            high = draw(st.integers(min_value=low, max_value=64))
            spec["replicas"] = f"{low}..{high}"
            spec["scaling"] = draw(
                st.fixed_dictionaries(
                    {"target": st.floats(min_value=0.001, max_value=1e6)},
                    optional={
                        "metric": st.sampled_from(["rps", "concurrency"]),
                        "window": st.sampled_from(["1s", "10s", 60, "1h"]),
                        "scale_up_delay": st.sampled_from(["0s", 30, "1m"]),
                        "scale_down_delay": st.sampled_from(["0s", "5m", "24h"]),
                    },
                )
            )
    elif spec.get("replicas", 1) != 1:
        spec.pop("replicas")  # a job runs once: replicas are refused
    gpu = spec.get("resources", {}).get("gpu")
    count = (
        0.0
        if gpu is None
        else parse_workload_spec({"commands": ["x"], "resources": {"gpu": gpu}}).resources.gpu.count
    )
    if 0 < count < 1:
        spec["nodes"] = 1
    if count > 0 and draw(st.booleans()):  # idle needs GPUs to watch
        spec["idle"] = draw(
            st.one_of(
                st.sampled_from(["10s", "2h", 1800, "30d"]),
                st.fixed_dictionaries(
                    {"timeout": st.floats(min_value=10, max_value=30 * 86400)},
                    optional={
                        "action": st.sampled_from(["hold", "cancel"]),
                        "utilization": st.floats(min_value=0.01, max_value=100),
                    },
                ),
            )
        )
    return spec


@settings(max_examples=200)
@given(workload_dicts())
def test_every_valid_spec_round_trips_through_its_json_dump(data: dict[str, Any]) -> None:
    spec = parse_workload_spec(data)
    assert _reload(spec) == spec
    assert parse_workload_spec(spec.model_dump()) == spec
    assert _reload(spec).model_dump(mode="json") == spec.model_dump(mode="json")


# --- the types explain themselves -------------------------------------------------------------------


def _models() -> list[type[BaseModel]]:
    return [WorkloadSpec, Resources, CheckpointSpec, RetrySpec, ScalingSpec, IdleSpec]


@pytest.mark.parametrize("model", _models())
def test_every_field_says_what_it_means_and_its_default(model: type[BaseModel]) -> None:
    for name, info in model.model_fields.items():
        assert info.description, f"{model.__name__}.{name} has no description"
        assert "\n" not in info.description
        assert "default" in info.description or "required" in info.description, f"{model.__name__}.{name}"


def test_every_field_path_has_its_own_example() -> None:
    paths = list(WorkloadSpec.model_fields)
    paths += [f"resources.{n}" for n in Resources.model_fields]
    paths += [f"checkpoint.{n}" for n in CheckpointSpec.model_fields]
    paths += [f"retry.{n}" for n in RetrySpec.model_fields]
    missing = [p for p in paths if p not in FIELD_EXAMPLES]
    assert not missing
    assert example_for("retry.on[3]", FIELD_EXAMPLES) == FIELD_EXAMPLES["retry.on"]
    assert example_for("env.HF_HOME", FIELD_EXAMPLES) == FIELD_EXAMPLES["env"]


@pytest.mark.parametrize("mode", ["validation", "serialization"])
def test_json_schema_describes_inputs_and_outputs(mode: Any) -> None:
    schema = WorkloadSpec.model_json_schema(mode=mode)
    gpu = schema["$defs"]["Resources"]["properties"]["gpu"]
    assert gpu["default"] == "0"
    if mode == "serialization":
        assert gpu["type"] == "string"
        assert schema["properties"]["priority"]["type"] == "integer"
    else:
        assert {"type": "string"} in gpu["anyOf"]
        assert any("enum" in choice for choice in schema["properties"]["priority"]["anyOf"])


def test_placement_names_nodes_and_a_topology_domain() -> None:
    spec = parse_workload_spec(
        {"commands": ["x"], "nodes": 2, "placement": {"nodes": ["node-3", "node-4"], "topology": "rack"}}
    )
    assert spec.placement.nodes == ["node-3", "node-4"] and spec.placement.topology == "rack"
    assert parse_workload_spec({"commands": ["x"]}).placement.nodes == []


@pytest.mark.parametrize(
    "placement,nodes,field,words",
    [
        ({"nodes": ["node-3"]}, 2, "placement.nodes", "gang needs 2"),
        ({"nodes": ["node 3"]}, 1, "placement.nodes[0]", "not a node name"),
        ({"nodes": ["a", "a"]}, 1, "placement.nodes", "more than once"),
        ({"topology": " "}, 1, "placement.topology", "not a node label"),
        ({"rack": "r1"}, 1, "placement.rack", "not a field"),
    ],
)
def test_bad_placement_names_the_field(placement: dict[str, Any], nodes: int, field: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_workload_spec({"commands": ["x"], "nodes": nodes, "placement": placement})
    assert caught.value.field == field
    assert words in caught.value.message


@pytest.mark.parametrize("name", ["4", "0", "0042"])
def test_a_name_of_digits_alone_is_refused_as_the_command_line_reads_it_as_an_id(name: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_workload_spec({"commands": ["x"], "name": name})
    assert caught.value.field == "name" and "digits alone" in str(caught.value), caught.value
    assert parse_workload_spec({"commands": ["x"], "name": f"{name}a"}).name == f"{name}a"
