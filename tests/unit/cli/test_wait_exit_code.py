"""The exit code of `gpupool wait` and `run|submit --wait`: the highest of the failed ones', as Slurm's
`sbatch --wait` gives a job array's."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.cli.wait import exit_code


def _ended(state: str, code: int | None = None) -> dict[str, Any]:
    return {"state": state, "exit_code": code}


@pytest.mark.parametrize(
    ("workloads", "code"),
    [
        ([_ended("succeeded", 0)], 0),
        ([_ended("succeeded", 0), _ended("succeeded", 0)], 0),
        ([_ended("failed", 3)], 3),
        ([_ended("failed", 2), _ended("succeeded", 0), _ended("failed", 5), _ended("failed", 4)], 5),
        ([_ended("failed", 3), _ended("cancelled")], 3),
        ([_ended("cancelled"), _ended("succeeded", 0)], 1),
        ([_ended("failed"), _ended("cancelled")], 1),  # failed without a code (lost its node)
        ([_ended("failed", 300)], 1),  # no exit status: a shell could not tell it from 300 % 256
    ],
)
def test_the_highest_exit_code_of_those_that_failed_else_1(
    workloads: list[dict[str, Any]], code: int
) -> None:
    assert exit_code(workloads) == code
