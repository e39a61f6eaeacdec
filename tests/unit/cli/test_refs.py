"""A range of an array's tasks in one argument, as Slurm's scancel takes `12_[1-3]`."""

from __future__ import annotations

import pytest

from gpupool.cli.errors import CliError
from gpupool.cli.refs import MAX_TASKS, _tasks


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("sweep[1-3,7]", ["sweep[1]", "sweep[2]", "sweep[3]", "sweep[7]"]),
        ("sweep[2..4]", ["sweep[2]", "sweep[3]", "sweep[4]"]),  # as `gpupool ps` shows pending tasks
        ("12_[1,4]", ["12_1", "12_4"]),
        ("12_[3]", ["12_3"]),
        ("my_[0-1]", ["my_[0]", "my_[1]"]),  # a name ending in "_", not Slurm's ID_[...]
        ("sweep[1-3,2]", ["sweep[1]", "sweep[2]", "sweep[3]"]),  # each task once
        ("sweep[3]", ["sweep[3]"]),
        ("12_3", ["12_3"]),
        ("train", ["train"]),
    ],
)
def test_a_range_stands_for_each_task(ref: str, expected: list[str]) -> None:
    assert _tasks(ref) == expected


def test_a_bad_range_is_refused_naming_the_part_and_the_form() -> None:
    with pytest.raises(
        CliError, match=r"sweep\[3-1\]: '3-1' is not a task index or range; e\.g\. sweep\[1-3,7\]"
    ):
        _tasks("sweep[3-1]")
    with pytest.raises(CliError, match="'1-' is not a task index or range"):
        _tasks("sweep[1-]")
    with pytest.raises(CliError, match=f"more than {MAX_TASKS:,} tasks; name the array whole"):
        _tasks("sweep[0-5000]")
    with pytest.raises(CliError, match=f"more than {MAX_TASKS:,} tasks"):  # refused before any is listed
        _tasks("sweep[0-99999999999999999999]")


@pytest.mark.parametrize("ref", ["hx[a-b]", "hx[-1]", "hx[1-3", "15_[1-3", "hx[1-3]x"])
def test_anything_else_in_brackets_is_refused_not_looked_up_as_a_name(ref: str) -> None:
    with pytest.raises(CliError, match="not a task"):
        _tasks(ref)
