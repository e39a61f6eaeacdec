"""GPU requests, sizes and durations: every accepted form, the refusals, and exact round-trips."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.spec import (
    GpuRequest,
    SpecError,
    format_duration,
    format_gpu_indices,
    format_size,
    parse_duration,
    parse_gpu_request,
    parse_size,
)

# --- GPU requests -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (8, GpuRequest(8)),
        ("8", GpuRequest(8)),
        (" 8 ", GpuRequest(8)),
        (0, GpuRequest(0)),
        ("0", GpuRequest(0)),
        (0.5, GpuRequest(0.5)),
        ("0.5", GpuRequest(0.5)),
        (".25", GpuRequest(0.25)),
        (2.0, GpuRequest(2)),
        ("2.0", GpuRequest(2)),
        ("H100:8", GpuRequest(8, ("H100",))),
        ("h100:8", GpuRequest(8, ("H100",))),
        ("H100 : 8", GpuRequest(8, ("H100",))),
        ("H100", GpuRequest(1, ("H100",))),
        ("A100|H100:2", GpuRequest(2, ("A100", "H100"))),
        ("H100|a100:2", GpuRequest(2, ("A100", "H100"))),
        ("H100|H100:2", GpuRequest(2, ("H100",))),
        ("80GB:1", GpuRequest(1, min_memory_bytes=80 * 10**9)),
        ("80GiB:1", GpuRequest(1, min_memory_bytes=80 * 2**30)),
        ("80GB", GpuRequest(1, min_memory_bytes=80 * 10**9)),
        ("A100-80GB:4", GpuRequest(4, ("A100-80GB",))),
        ("H100:0.5", GpuRequest(0.5, ("H100",))),
        ("4096", GpuRequest(4096)),
    ],
)
def test_gpu_request_accepts_every_documented_form(value: str | int | float, expected: GpuRequest) -> None:
    assert parse_gpu_request(value) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (-1, "must not be negative"),
        ("-1", "must not be negative"),
        ("H100:-1", "must not be negative"),
        (1.5, "must be whole"),
        ("1.5", "must be whole"),
        ("H100:2.5", "must be whole"),
        (math.nan, "finite"),
        (math.inf, "finite"),
        ("nan", "finite"),
        ("inf", "finite"),
        ("", "empty"),
        ("   ", "empty"),
        ("H100:", "count after ':' is missing"),
        (":4", "no GPU model or memory before ':'"),
        ("H100:x", "the count after ':' must be a number"),
        ("H100:8:2", "more than one ':'"),
        ("80XB:1", "neither a GPU model nor a memory size"),
        ("80:1", "neither a GPU model nor a memory size"),
        ("0GB:1", "must be above 0"),
        ("80GB|H100:1", "cannot be combined"),
        ("A100||H100:1", "empty GPU model"),
        ("H 100:1", "not a GPU model name"),
        (4097, "at most 4096"),
        (10**400, "at most 4096"),
        (True, "is not a GPU request"),
        (False, "is not a GPU request"),
        (None, "is not a GPU request"),
        ([8], "is not a GPU request"),
    ],
)
def test_gpu_request_refusals_name_the_field_value_and_an_example(value: object, fragment: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_gpu_request(value, "resources.gpu")  # type: ignore[arg-type]
    err = caught.value
    assert err.field == "resources.gpu"
    assert fragment in err.message
    assert err.value is value or err.value == value
    assert "e.g." in str(err)


def test_gpu_request_error_reads_as_one_line() -> None:
    with pytest.raises(SpecError) as caught:
        parse_gpu_request("H100:x")
    assert str(caught.value) == (
        "resources.gpu: 'H100:x' is not a GPU request: the count after ':' must be a number; e.g. 'H100:8'"
    )


def test_gpu_request_error_uses_the_given_field_name() -> None:
    with pytest.raises(SpecError) as caught:
        parse_gpu_request("x:y", field="gpus")
    assert caught.value.field == "gpus"


@pytest.mark.parametrize(
    ("request_", "text"),
    [
        (GpuRequest(8), "8"),
        (GpuRequest(0), "0"),
        (GpuRequest(0.5), "0.5"),
        (GpuRequest(8, ("H100",)), "H100:8"),
        (GpuRequest(2, ("H100", "A100")), "A100|H100:2"),
        (GpuRequest(1, min_memory_bytes=80 * 10**9), "80GB:1"),
        (GpuRequest(1e-05), "0.00001"),
    ],
)
def test_gpu_request_prints_its_canonical_text(request_: GpuRequest, text: str) -> None:
    assert str(request_) == text
    assert parse_gpu_request(text) == request_


def test_fractional_means_a_share_of_one_gpu() -> None:
    assert GpuRequest(0.5).is_fractional
    assert not GpuRequest(0).is_fractional
    assert not GpuRequest(1).is_fractional
    assert not GpuRequest(8, ("H100",)).is_fractional


def test_gpu_request_built_in_code_is_normalised_and_checked() -> None:
    assert GpuRequest(2, ("h100", "a100")).models == ("A100", "H100")
    assert isinstance(GpuRequest(2).count, float)
    bad: list[tuple[float, object, object]] = [
        (1.5, (), None),
        (-1, (), None),
        (1, ("H100",), 80 * 10**9),
        (1, "H100", None),
        (1, (), 0),
    ]
    for count, models, memory in bad:
        with pytest.raises(SpecError):
            GpuRequest(count, models, memory)  # type: ignore[arg-type]


def test_gpu_request_is_hashable_and_immutable() -> None:
    request = parse_gpu_request("H100:8")
    assert {request: 1}[parse_gpu_request("h100:8")] == 1
    with pytest.raises(AttributeError):
        request.count = 2  # type: ignore[misc]


# --- sizes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("256GB", 256 * 10**9),
        ("256G", 256 * 10**9),
        ("256gb", 256 * 10**9),
        ("256 GB", 256 * 10**9),
        ("512MiB", 512 * 2**20),
        ("512Mi", 512 * 2**20),
        ("64GiB", 64 * 2**30),
        ("1.5TB", 1_500_000_000_000),
        ("100M", 100 * 10**6),
        ("1KB", 1000),
        ("1KiB", 1024),
        ("2PiB", 2 * 2**50),
        ("1PB", 10**15),
        ("1024", 1024),
        ("1024B", 1024),
        (1024, 1024),
        (0, 0),
        ("0", 0),
        (2048.0, 2048),
        ("0.5KiB", 512),
        ("1.0001KB", 1000),  # a fraction of a byte rounds to the nearest byte
    ],
)
def test_size_accepts_decimal_and_binary_units(value: str | int, expected: int) -> None:
    assert parse_size(value, "memory") == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("-1GB", "negative"),
        (-5, "negative"),
        ("", "empty"),
        ("GB", "number and a unit"),
        ("256XB", "unknown unit"),
        ("256 gigs", "unknown unit"),
        ("1.2.3GB", "number and a unit"),
        (True, "is not a size"),
        (None, "is not a size"),
        (1.5, "a fraction needs a unit"),
        (math.nan, "a fraction needs a unit"),
        ("99999999EB", "unknown unit"),
        ("99999999PB", "too large"),
    ],
)
def test_size_refusals(value: object, fragment: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_size(value, "resources.memory")  # type: ignore[arg-type]
    assert caught.value.field == "resources.memory"
    assert fragment in caught.value.message
    assert "e.g." in str(caught.value)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (256 * 10**9, "256GB"),
        (512 * 2**20, "512MiB"),
        (1_500_000_000_000, "1500GB"),
        (1000, "1KB"),
        (1024, "1KiB"),
        (0, "0B"),
        (1234567, "1234567B"),
    ],
)
def test_size_formats_in_the_largest_exact_unit(n: int, text: str) -> None:
    assert format_size(n) == text


def test_format_size_refuses_what_is_not_bytes() -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            format_size(bad)  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_size_round_trips_through_its_text(n: int) -> None:
    assert parse_size(format_size(n), "memory") == n


@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["", "B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"]),
)
def test_size_text_round_trips_through_bytes(number: int, unit: str) -> None:
    n = parse_size(f"{number}{unit}", "memory")
    assert parse_size(format_size(n), "memory") == n


# --- durations ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("90s", 90.0),
        ("30m", 1800.0),
        ("12h", 43200.0),
        ("2d", 172800.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1d2h3m4s", 93784.0),
        ("1.5h", 5400.0),
        ("0.1s", 0.1),
        ("12H", 43200.0),
        ("90", 90.0),
        ("2.5", 2.5),
        (90, 90.0),
        (2.5, 2.5),
        (0, 0.0),
        ("0s", 0.0),
    ],
)
def test_duration_accepts_units_and_plain_seconds(value: str | int | float, expected: float) -> None:
    assert parse_duration(value, "max_duration") == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "empty"),
        ("12x", "unknown unit"),
        ("12 hours", "unknown unit"),
        ("-5m", "negative"),
        (-1, "negative"),
        ("30m1h", "largest first"),
        ("1h1h", "largest first"),
        ("h", "write numbers with units"),
        ("1h30", "write numbers with units"),
        (math.inf, "finite"),
        (math.nan, "finite"),
        ("nan", "finite"),
        (True, "is not a duration"),
        (None, "is not a duration"),
        ("4000d", "too long"),
    ],
)
def test_duration_refusals(value: object, fragment: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_duration(value, "max_duration")  # type: ignore[arg-type]
    assert caught.value.field == "max_duration"
    assert fragment in caught.value.message
    assert "e.g." in str(caught.value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5400, "1h30m"),
        (90, "1m30s"),
        (0, "0s"),
        (172800, "2d"),
        (43200.0, "12h"),
        (1.5, "1.5s"),
        (3600.5, "3600.5s"),
    ],
)
def test_duration_formats_as_units(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_duration_refuses_what_is_not_seconds() -> None:
    for bad in (-1, math.inf, math.nan, True):
        with pytest.raises(ValueError):
            format_duration(bad)


@given(st.floats(min_value=0, max_value=3650 * 86400, allow_nan=False))
def test_duration_round_trips_through_its_text(seconds: float) -> None:
    assert parse_duration(format_duration(seconds), "max_duration") == seconds


@given(st.integers(min_value=0, max_value=3650 * 86400))
def test_whole_seconds_round_trip(seconds: int) -> None:
    assert parse_duration(format_duration(seconds), "max_duration") == seconds


# --- GPU requests, property -------------------------------------------------------------------------

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_MODEL_NAMES = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(_LETTERS),
    st.text(alphabet=_LETTERS + "0123456789._-", max_size=12),
)
_MODELS = st.lists(_MODEL_NAMES, min_size=1, max_size=4).map(tuple)
_COUNTS = st.one_of(
    st.integers(min_value=0, max_value=4096).map(float),
    st.floats(min_value=0, max_value=1, exclude_min=True, exclude_max=True),
)


@st.composite
def gpu_requests(draw: st.DrawFn) -> GpuRequest:
    count = draw(_COUNTS)
    choice = draw(st.sampled_from(["any", "models", "memory"]))
    if choice == "models":
        return GpuRequest(count, draw(_MODELS))
    if choice == "memory":
        return GpuRequest(count, min_memory_bytes=draw(st.integers(min_value=1, max_value=2**63 - 1)))
    return GpuRequest(count)


@given(gpu_requests())
def test_gpu_request_round_trips_through_its_text(request_: GpuRequest) -> None:
    assert parse_gpu_request(str(request_)) == request_


@given(gpu_requests())
def test_gpu_request_text_is_canonical(request_: GpuRequest) -> None:
    assert str(parse_gpu_request(str(request_).lower())) == str(request_)


@pytest.mark.parametrize(
    ("indices", "text"), [((), "no GPU"), ((4,), "GPU 4"), ((0, 1), "GPUs 0,1"), ([2, 3, 5], "GPUs 2,3,5")]
)
def test_gpu_indices_read_as_indices_not_a_count(indices: tuple[int, ...], text: str) -> None:
    assert format_gpu_indices(indices) == text


def test_a_figure_is_never_written_in_scientific_notation() -> None:
    from gpupool.spec import format_figure

    assert [format_figure(x) for x in (0.3333, 12.5, 999.4, 999.5, 1024.0, 123456.7)] == [
        "0.333", "12.5", "999", "1,000", "1,024", "123,457",
    ]  # fmt: skip
