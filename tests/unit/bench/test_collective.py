"""The nccl-tests conventions: byte counts, bus-bandwidth factors and the table layout (no torch needed)."""

from __future__ import annotations

import pytest

from gpupool.bench.collective import (
    DTYPES,
    OPS,
    Cell,
    Row,
    avg_busbw,
    cell,
    float_str,
    footer_lines,
    header_lines,
    parse_dtype,
    parse_ops,
    parse_size,
    plan_sizes,
    row_line,
    size_steps,
)
from gpupool.bench.errors import BenchError


@pytest.mark.parametrize(
    "op,n,factor",
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 4, 1.5),
        ("all_reduce", 8, 1.75),
        ("all_gather", 4, 0.75),
        ("reduce_scatter", 8, 0.875),
        ("alltoall", 2, 0.5),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("sendrecv", 8, 1.0),
    ],
)
def test_busbw_is_algbw_times_the_nccl_tests_factor(op: str, n: int, factor: float) -> None:
    c = cell(OPS[op], size=1_000_000, nranks=n, time_us=100.0, wrong=0)
    assert c.algbw == pytest.approx(10.0)  # 1e6 B / 100 us = 1e10 B/s = 10 GB/s
    assert c.busbw == pytest.approx(10.0 * factor)


def test_size_column_is_the_total_across_ranks_and_count_the_nccl_argument() -> None:
    f = DTYPES["float"]
    # all_gather at 1 MiB on 4 ranks: each rank sends 64Ki floats and receives 256Ki; count = 64Ki.
    (plan,), _ = plan_sizes(OPS["all_gather"], f, 4, [1 << 20])
    assert (plan.size, plan.counts.send, plan.counts.recv, plan.counts.param) == (
        1 << 20,
        65536,
        262144,
        65536,
    )
    (plan,), _ = plan_sizes(OPS["reduce_scatter"], f, 4, [1 << 20])
    assert (plan.size, plan.counts.send, plan.counts.recv, plan.counts.param) == (
        1 << 20,
        262144,
        65536,
        65536,
    )
    (plan,), _ = plan_sizes(OPS["alltoall"], f, 4, [1 << 20])
    assert (plan.size, plan.counts.param) == (1 << 20, 65536)
    (plan,), _ = plan_sizes(OPS["all_reduce"], f, 4, [1 << 20])
    assert (plan.size, plan.counts.param) == (1 << 20, 262144)


def test_sizes_under_one_element_per_rank_are_skipped_and_uneven_sizes_round_down() -> None:
    plans, skipped = plan_sizes(OPS["all_gather"], DTYPES["float"], 4, [8, 16, 40])
    assert skipped == [8]
    assert [(p.size, p.counts.param) for p in plans] == [(16, 1), (32, 2)]


def test_sizes_are_read_like_nccl_tests_with_powers_of_1024() -> None:
    assert parse_size("8", "-b") == 8
    assert parse_size("1K", "-b") == 1024
    assert parse_size("128M", "-e") == 128 << 20
    assert parse_size("1g", "-e") == 1 << 30
    assert list(size_steps(8, 128, 2)) == [8, 16, 32, 64, 128]
    assert list(size_steps(1024, 64 << 20, 4))[-1] == 64 << 20


@pytest.mark.parametrize(
    "call,flag",
    [
        (lambda: parse_size("12X", "-b/--minbytes"), "-b/--minbytes"),
        (lambda: list(size_steps(1024, 8, 2)), "-e/--maxbytes"),
        (lambda: list(size_steps(8, 1024, 1)), "-f/--stepfactor"),
        (lambda: parse_ops("allreduce"), "--op"),
        (lambda: parse_dtype("int8"), "--dtype"),
    ],
)
def test_bad_input_names_the_flag(call: object, flag: str) -> None:
    with pytest.raises(BenchError, match=flag):
        call()  # type: ignore[operator]


def test_ops_accept_all_and_comma_lists() -> None:
    assert [o.name for o in parse_ops("all")] == list(OPS)
    assert [o.name for o in parse_ops("all-reduce, sendrecv")] == ["all_reduce", "sendrecv"]
    assert parse_dtype("bfloat16").name == "bfloat16" and parse_dtype("fp16").name == "half"


def test_float_str_keeps_the_column_width_like_get_float_str() -> None:
    assert float_str(0.0, 6) == "  0.00"
    assert float_str(12.345, 7) == "  12.35"
    assert float_str(12345.6, 7) == "12345.6"
    assert float_str(123456.0, 7) == " 123456"
    assert len(float_str(123456789.0, 7)) == 7


def test_row_and_header_columns_line_up_as_in_nccl_tests() -> None:
    row = Row(1048576, 262144, "float", "sum", -1, None, Cell(1234.5, 0.849, 1.27, 0))
    line = row_line(row)
    assert line == (
        "     1048576        262144     float     sum      -1      N/A     N/A     N/A     N/A"
        "  1234.50    0.85    1.27       0"
    )
    header = header_lines(
        OPS["all_reduce"], nranks=2, min_bytes=8, max_bytes=1024, factor=2, warmup=5, iters=20,
        blocking=False, backend="gloo", devices=["#  Rank  0 ..."],
    )  # fmt: skip
    titles = next(h for h in header if "size" in h and "count" in h)
    # Every column title ends where its values end.
    for title, value in (("count", "262144"), ("redop", "sum"), ("time", "N/A")):
        assert titles.index(title) + len(title) == line.index(value) + len(value)
    assert len(titles) == len(line)  # the last #wrong column too
    names = "# size count type redop root time algbw busbw #wrong time algbw busbw #wrong"
    assert titles.split() == names.split(" ")
    assert any(h.startswith("# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor)") for h in header)
    assert any("N/A columns: out-of-place" in h for h in header)


def test_a_one_rank_table_says_what_its_bus_bandwidth_means() -> None:
    # One GPU: busbw is 0 for all-reduce (factor 2(n-1)/n) and a no-op's GB/s for broadcast (factor 1);
    # the table says so, in a comment line that nccl-tests parsers skip.
    def said(op: str, nranks: int) -> list[str]:
        header = header_lines(
            OPS[op], nranks=nranks, min_bytes=8, max_bytes=1024, factor=2, warmup=5, iters=20,
            blocking=False, backend="nccl", devices=[],
        )  # fmt: skip
        return [h for h in header if h.startswith("# One rank")]

    assert "busbw is 0 by definition" in said("all_reduce", 1)[0]
    assert "busbw equals algbw" in said("broadcast", 1)[0]
    assert said("all_reduce", 2) == [] and said("broadcast", 8) == []


def test_footer_has_the_average_bus_bandwidth_of_every_measured_cell() -> None:
    rows = [
        Row(8, 2, "float", "none", -1, Cell(1, 1, 1.0, 0), Cell(1, 1, 2.0, 0)),
        Row(16, 4, "float", "none", -1, Cell(1, 1, 3.0, 0), None),
    ]
    assert avg_busbw(rows) == pytest.approx(2.0)
    footer = footer_lines(OPS["all_gather"], rows, skipped=[4])
    assert "# Avg bus bandwidth    : 2 " in footer
    assert "# Out of bounds values : 0 OK" in footer
    assert footer[0] == "# Skipped sizes (B) smaller than one element per rank: 4"
    assert footer[-1] == "# Collective test concluded: all_gather_perf"


def test_a_list_with_an_empty_item_is_refused_not_read_as_shorter() -> None:
    from gpupool.bench.gemm import parse_shapes
    from gpupool.bench.gpt import count_text

    with pytest.raises(BenchError, match="--op 'all_reduce,,'"):
        parse_ops("all_reduce,,")
    with pytest.raises(BenchError, match="--sizes '128,,': an empty item"):
        parse_shapes("128,,")
    assert parse_shapes("128, 4096x4096x1024") == [(128, 128, 128), (4096, 4096, 1024)]
    assert [count_text(n) for n in (17_408, 124_439_808, 512)] == ["17.4K", "124M", "512"]
