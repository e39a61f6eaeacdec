"""`--gpus` values: what each good one opens, and the one-line error each bad one gets."""

from __future__ import annotations

import pytest

from gpupool.gpu import GpuSelectorError, SimulatedProvider, describe, open_provider, parse_selector
from gpupool.gpu.nvml import nvml_available


@pytest.mark.parametrize(
    ("value", "canonical", "count"),
    [
        ("sim:8xH100", "sim:8xH100", 8),
        ("SIM:8XH100", "sim:8xH100", 8),
        ("  sim:4xA100-80GB ", "sim:4xA100-80GB", 4),
        ("sim:2xL4", "sim:2xL4", 2),
        ("sim:8xH200", "sim:8xH200", 8),
        ("sim:1xA100-40GB", "sim:1xA100-40GB", 1),
        ("sim:2 x a100_40gb", "sim:2xA100-40GB", 2),
        ("sim:4xH100,4xA100-80GB", "sim:4xH100,4xA100-80GB", 8),
        ("sim:4xA100", "sim:4xA100-80GB", 4),
    ],
)
def test_simulated_selectors_parse_to_a_canonical_spelling(value: str, canonical: str, count: int) -> None:
    parsed = parse_selector(value)
    assert parsed.kind == "sim"
    assert parsed.text == canonical
    assert parsed.gpu_count == count


@pytest.mark.parametrize("value", ["nvml", "auto", "none", "NVML", " Auto "])
def test_named_selectors_parse_to_their_kind(value: str) -> None:
    assert parse_selector(value).kind == value.strip().lower()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "empty value"),
        ("   ", "empty value"),
        ("gpu", "unknown GPU provider"),
        ("cuda:0", "unknown GPU provider"),
        ("nvml:0", "unknown GPU provider"),
        ("sim:", "no GPUs after 'sim:'"),
        ("sim:8", "is not <count>x<model>"),
        ("sim:H100", "is not <count>x<model>"),
        ("sim:xH100", "is not <count>x<model>"),
        ("sim:8*H100", "is not <count>x<model>"),
        ("sim:0xH100", "at least 1"),
        ("sim:-2xH100", "at least 1"),
        ("sim:8xH100,", "stray comma"),
        ("sim:65xH100", "at most 64"),
        ("sim:40xH100,40xL4", "at most 64"),
    ],
)
def test_bad_selectors_fail_with_one_line_naming_the_flag_the_value_and_examples(
    value: str, problem: str
) -> None:
    with pytest.raises(GpuSelectorError) as caught:
        parse_selector(value)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert "\n" not in message
    assert message.startswith("--gpus: ")
    assert repr(value) in message
    assert problem in message
    for example in ("sim:8xH100", "sim:4xA100-80GB", "nvml", "auto", "none"):
        assert example in message


def test_an_unknown_model_lists_the_known_models() -> None:
    with pytest.raises(GpuSelectorError) as caught:
        parse_selector("sim:8xH999")
    message = str(caught.value)
    assert "\n" not in message
    assert "--gpus" in message and "'H999'" in message and "'sim:8xH999'" in message
    for known in ("H100", "H200", "A100-80GB", "A100-40GB", "L4", "B200"):
        assert known in message


def test_open_provider_none_means_no_local_gpus() -> None:
    assert open_provider("none") is None
    assert describe(None).startswith("none")


def test_open_provider_sim_returns_a_simulated_provider() -> None:
    provider = open_provider("sim:2xL4", seed="test")
    assert isinstance(provider, SimulatedProvider)
    assert provider.kind == "sim"
    assert len(provider.devices()) == 2
    assert "sim:2xL4" in describe(provider)


def test_open_provider_rejects_a_bad_selector_before_opening_anything() -> None:
    with pytest.raises(ValueError, match="--gpus"):
        open_provider("sim:8xH999")


@pytest.mark.skipif(nvml_available(), reason="this machine has an NVIDIA driver")
def test_auto_without_a_driver_simulates_eight_h100_and_says_so() -> None:
    provider = open_provider("auto", seed="test")
    assert provider is not None and provider.kind == "sim"
    devices = provider.devices()
    assert [d.model for d in devices] == ["H100"] * 8
    assert "auto" in provider.description and "no NVIDIA driver" in provider.description
