"""Every bad spec is refused with one readable line naming the field, the bad value and a valid example."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest

from gpupool.spec import SpecError, parse_queue_spec, parse_workload_spec

OK = {"commands": ["python train.py"]}


def job(**fields: object) -> dict[str, object]:
    return {**OK, **fields}


# (input, expected field path, fragment of the message)
BAD_WORKLOADS: list[tuple[Any, str, str]] = [
    ({"comands": ["python train.py"]}, "comands", "did you mean 'commands'"),
    (job(resources={"gpuu": 1}), "resources.gpuu", "did you mean 'gpu'"),
    (job(retry={"max_restart": 3}), "retry.max_restart", "did you mean 'max_restarts'"),
    (job(checkpoint={"dirr": "x"}), "checkpoint.dirr", "did you mean 'dir'"),
    (job(zzzzzz=1), "zzzzzz", "its fields: kind, name"),
    ({}, "commands", "is required"),
    (job(commands=[]), "commands", "must not be empty"),
    (job(commands=["ok", "  "]), "commands[1]", "empty command"),
    (job(commands=[1]), "commands[0]", "is a number, not a command: quote it"),
    ("commands: [true]", "commands[0]", "is a boolean, not a command: quote it"),
    (job(commands=[None]), "commands[0]", "is not text"),
    (job(commands=None), "commands", "is not a list"),
    (job(kind="jobb"), "kind", "did you mean 'job'"),
    (job(name="Llama_Finetune"), "name", "is not a valid name"),
    (job(name="-x"), "name", "is not a valid name"),
    (job(name="a" * 64), "name", "is not a valid name"),
    (job(queue="NLP team"), "queue", "is not a valid name"),
    (job(priority="trian"), "priority", "did you mean 'train'"),
    (job(priority=5000), "priority", "at most 1000"),
    (job(priority=-1), "priority", "at least 0"),
    (job(priority=True), "priority", "true/false"),
    (job(priority_class="build", priority=5), "priority_class", "does not match"),
    (job(priority_class="gold"), "priority_class", "not a priority class"),
    (job(preemptible="maybe"), "preemptible", "true or false"),
    (job(nodes=0), "nodes", "at least 1"),
    (job(nodes=2000), "nodes", "at most 1024"),
    (job(nodes="two"), "nodes", "whole number"),
    (job(nodes=1.5), "nodes", "whole number"),
    (job(resources="H100:8"), "resources", "mapping"),
    (job(resources={"gpu": "H100:x"}), "resources.gpu", "the count after ':' must be a number"),
    (job(resources={"gpu": "H100:"}), "resources.gpu", "count after ':' is missing"),
    (job(resources={"gpu": ":4"}), "resources.gpu", "before ':'"),
    (job(resources={"gpu": -1}), "resources.gpu", "negative"),
    (job(resources={"gpu": 1.5}), "resources.gpu", "must be whole"),
    (job(resources={"gpu": "80XB:1"}), "resources.gpu", "neither a GPU model nor a memory size"),
    (job(resources={"gpu": True}), "resources.gpu", "not a GPU request"),
    (job(resources={"gpu": 5000}), "resources.gpu", "at most 4096"),
    (job(nodes=2, resources={"gpu": 0.5}), "resources.gpu", "single node"),
    (job(resources={"cpu": 0}), "resources.cpu", "greater than 0"),
    (job(resources={"cpu": float("nan")}), "resources.cpu", "finite"),
    (job(resources={"cpu": False}), "resources.cpu", "true/false"),
    (job(resources={"memory": "256XB"}), "resources.memory", "unknown unit"),
    (job(resources={"memory": "-1GB"}), "resources.memory", "negative"),
    (job(resources={"memory": 0}), "resources.memory", "above 0"),
    (job(env={"GPUPOOL_JOB_ID": "1"}), "env.GPUPOOL_JOB_ID", "reserved"),
    (job(env={"CUDA_VISIBLE_DEVICES": "0"}), "env.CUDA_VISIBLE_DEVICES", "reserved"),
    (job(env={"1X": "1"}), "env", "not an environment variable name"),
    (job(env={"X": None}), "env.X", "not a text, number or boolean"),
    (job(env={"X": [1]}), "env.X", "not a text, number or boolean"),
    (job(env=["X=1"]), "env", "not a mapping"),
    (job(workdir=""), "workdir", "must not be empty"),
    (job(workdir="   "), "workdir", "blank"),
    (job(checkpoint={"dir": ""}), "checkpoint.dir", "must not be empty"),
    (job(checkpoint={}), "checkpoint.dir", "is required"),
    (job(retry={"on": ["node_failure"]}), "retry.on[0]", "did you mean 'node-failure'"),
    (job(retry={"on": "preemption"}), "retry.on", "is not a list"),
    (job(retry={"max_restarts": 500}), "retry.max_restarts", "at most 100"),
    (job(retry={"max_restarts": -1}), "retry.max_restarts", "at least 0"),
    (job(max_duration="12x"), "max_duration", "unknown unit"),
    (job(max_duration="0s"), "max_duration", "longer than 0"),
    (job(max_duration=-5), "max_duration", "negative"),
    (job(max_duration=True), "max_duration", "not a duration"),
    (job(grace_period="2h"), "grace_period", "at most 1h"),
    (job(grace_period="-1s"), "grace_period", "negative"),
    ("commands: [x\n", "<yaml>", "line 2"),
    ("kind: job\n\tcommands: [x]\n", "<yaml>", "line 2, column 1"),
    ("kind: job\nkind: service\ncommands: [x]\n", "<yaml>", "given twice"),
    ("a: 1\n---\nb: 2\n", "<yaml>", "another document"),
    ("name: !!python/object:os.system x\n", "<yaml>", "constructor"),
    ("[" * 1500, "<yaml>", "nested too deeply"),
    ("- python train.py\n", "<spec>", "top level must be a mapping"),
    ("", "<spec>", "is empty"),
    ("just text", "<spec>", "top level must be a mapping"),
    (42, "<spec>", "top level must be a mapping"),
    ({1: "x", "commands": ["x"]}, "<spec>", "must be text"),
    (b"\xff\xfe", "<yaml>", "not UTF-8"),
    ("commands: [x]\nresources:\n  gpu: H100:x\n", "resources.gpu", "must be a number"),
    ("commands: [x]\nretry: {on: [preemption, nodefailure]}\n", "retry.on[1]", "did you mean 'node-failure'"),
]

BAD_QUEUES: list[tuple[object, str, str]] = [
    ({}, "name", "is required"),
    ({"name": "NLP"}, "name", "is not a valid name"),
    ({"name": "nlp", "parent": "nlp"}, "parent", "its own parent"),
    ({"name": "nlp", "parent": "Research"}, "parent", "is not a valid name"),
    ({"name": "nlp", "priority": 1001}, "priority", "at most 1000"),
    ({"name": "nlp", "resources": {"tpu": {"quota": 1}}}, "resources.tpu", "did you mean 'gpu'"),
    ({"name": "nlp", "resources": {"gpu": {"qouta": 1}}}, "resources.gpu.qouta", "did you mean 'quota'"),
    ({"name": "nlp", "resources": {"gpu": {"quota": -1}}}, "resources.gpu.quota", "at least 0"),
    (
        {"name": "nlp", "resources": {"gpu": {"quota": 8, "limit": 4}}},
        "resources.gpu.limit",
        "below the quota",
    ),
    ({"name": "nlp", "resources": {"gpu": {"limit": -1}}}, "resources.gpu.limit", "at least 0"),
    ({"name": "nlp", "resources": {"gpu": {"quota": "lots"}}}, "resources.gpu.quota", "not a number"),
    (
        {"name": "nlp", "resources": {"gpu": {"over_quota_weight": -1}}},
        "resources.gpu.over_quota_weight",
        "at least",
    ),
    ({"name": "nlp", "resources": {"memory": {"quota": "2XB"}}}, "resources.memory.quota", "unknown unit"),
    (
        {"name": "nlp", "resources": {"memory": {"quota": "2TB", "limit": "1TB"}}},
        "resources.memory.limit",
        "below the quota",
    ),
    ("name: nlp\nname: cv\n", "<yaml>", "given twice"),
    ("- nlp\n", "<spec>", "top level must be a mapping"),
]


def _assert_reports(err: SpecError, field: str, fragment: str) -> None:
    line = str(err)
    assert err.field == field, line
    assert fragment in err.message, line
    assert line.startswith(f"{field}: "), line
    assert "e.g. " in line and err.example, line
    assert "\n" not in line
    json.dumps(err.to_dict())  # an API can send it as it is


@pytest.mark.parametrize(("data", "field", "fragment"), BAD_WORKLOADS)
def test_bad_workload_spec_is_refused_naming_field_value_and_example(
    data: object, field: str, fragment: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_workload_spec(data)
    _assert_reports(caught.value, field, fragment)


@pytest.mark.parametrize(("data", "field", "fragment"), BAD_QUEUES)
def test_bad_queue_spec_is_refused_naming_field_value_and_example(
    data: object, field: str, fragment: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_queue_spec(data)
    _assert_reports(caught.value, field, fragment)


def test_there_are_at_least_thirty_bad_inputs_in_the_table() -> None:
    assert len(BAD_WORKLOADS) + len(BAD_QUEUES) >= 30


def test_the_error_shows_the_bad_value() -> None:
    with pytest.raises(SpecError) as caught:
        parse_workload_spec(job(resources={"gpu": "H100:x"}))
    assert caught.value.value == "H100:x"
    assert "'H100:x'" in str(caught.value)
    with pytest.raises(SpecError) as caught:
        parse_workload_spec(job(nodes=2000))
    assert caught.value.value == 2000
    assert " 2000 " in str(caught.value)


def test_a_misspelt_field_is_reported_before_the_missing_one() -> None:
    with pytest.raises(SpecError) as caught:
        parse_workload_spec({"comands": ["python train.py"]})
    assert str(caught.value) == (
        "comands: 'comands' is not a field of a workload spec (did you mean 'commands'?); "
        "e.g. commands: ['python train.py']"
    )


def test_a_missing_field_shows_no_value() -> None:
    with pytest.raises(SpecError) as caught:
        parse_workload_spec({})
    assert str(caught.value).startswith("commands: is required; e.g. ")
    assert caught.value.to_dict()["value"] is None


def test_yaml_syntax_error_names_the_line() -> None:
    text = "kind: job\ncommands:\n  - python train.py\nresources: {gpu: 8\n"
    with pytest.raises(SpecError) as caught:
        parse_workload_spec(text)
    assert caught.value.field == "<yaml>"
    assert "line 5" in caught.value.message


def test_spec_error_is_a_value_error_with_its_parts() -> None:
    err = SpecError("resources.gpu", "H100:x", "is not a GPU request", "'H100:8'")
    assert isinstance(err, ValueError)
    assert (err.field, err.value, err.message, err.example) == (
        "resources.gpu",
        "H100:x",
        "is not a GPU request",
        "'H100:8'",
    )
    assert err.to_dict() == {
        "field": "resources.gpu",
        "value": "H100:x",
        "message": "is not a GPU request",
        "example": "'H100:8'",
    }


def test_spec_error_survives_pickle_and_copy() -> None:
    err = SpecError("nodes", 0, "must be at least 1", "2")
    for clone in (pickle.loads(pickle.dumps(err)), copy.deepcopy(err)):
        assert isinstance(clone, SpecError)
        assert str(clone) == str(err)


def test_spec_error_to_dict_is_json_for_any_value() -> None:
    for value in (float("nan"), {"a": [1, 2]}, b"x", object(), "x" * 1000):
        body = SpecError("f", value, "is bad", "'ok'").to_dict()
        json.dumps(body, allow_nan=False)


def test_huge_values_print_short() -> None:
    bomb: list[object] = [1] * 9
    for _ in range(8):
        bomb = [bomb] * 9  # 9**9 leaves, shared: a YAML alias bomb
    err = SpecError("name", bomb, "is not a name", "'x'")
    assert len(str(err)) < 300
    assert len(json.dumps(err.to_dict())) < 400


def test_yaml_alias_bomb_is_refused_quickly() -> None:
    lines = ["a: &a [1,1,1,1,1,1,1,1,1]"]
    for prev, name in zip("abcdefg", "bcdefgh", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    lines.append("commands: [*h, *h]")
    with pytest.raises(SpecError) as caught:
        parse_workload_spec("\n".join(lines))
    assert len(str(caught.value)) < 400
