"""The price list (spec/prices.py): how a model finds its price, and what a bad file is told."""

from __future__ import annotations

import pytest

from gpupool.spec import SpecError
from gpupool.spec.prices import parse_prices_spec


def test_models_match_without_case_and_default_prices_the_rest() -> None:
    prices = parse_prices_spec("gpu_hour: {H100: 2.49, A100: 1.29, default: 0.5}")
    assert prices.currency == "USD"
    assert (prices.of("h100"), prices.of("A100"), prices.of("L4")) == (2.49, 1.29, 0.5)
    assert parse_prices_spec("currency: EUR\ngpu_hour: {H100: 2}").of("L4") is None


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("gpu_hour: {H100: -1}", "gpu_hour.H100", "at least 0"),
        ("gpu_hour: {H100: true}", "gpu_hour.H100", "true/false"),
        ("gpu_hour: {H100: cheap}", "gpu_hour.H100", "not a number"),
        ("gpu_hour: {H100: .inf}", "gpu_hour.H100", "finite"),
        ("gpu_hour: {H100: 1, h100: 2}", "gpu_hour.h100", "same model as gpu_hour.H100"),
        ("gpu_hour: {}", "gpu_hour", "must not be empty"),
        ("currency: USD", "gpu_hour", "is required"),
        ("curency: USD\ngpu_hour: {H100: 1}", "curency", "did you mean 'currency'"),
        ("currency: US-D\ngpu_hour: {H100: 1}", "currency", "pattern"),
        ("gpu_hour: [2.49]", "gpu_hour", "not a mapping"),
    ],
)
def test_a_bad_price_list_names_the_field(text: str, field: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_prices_spec(text)
    assert caught.value.field == field and words in str(caught.value)
