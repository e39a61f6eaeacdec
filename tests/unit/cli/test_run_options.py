"""`gpupool run` with an option it does not have: Slurm's names get the name `run` uses instead."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer.main

from gpupool.cli.submit import SLURM_OPTIONS
from gpupool.main import app


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"GPUPOOL_SERVER": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin"}  # refused before any request
    return subprocess.run(
        [sys.executable, "-m", "gpupool.main", "run", *args, "--", "python", "train.py"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("given", "told"),
    [
        (["--time=2:00:00"], "'--time' is not an option of gpupool run: use --max-duration 2h"),
        (["-t", "60"], "'-t' is not an option of gpupool run: use --max-duration 2h"),
        (["-pgpu"], "'-p' is not an option of gpupool run: use --queue NAME"),
        (["--gres=gpu:8"], "'--gres' is not an option of gpupool run: use --gpus H100:8 (per node)"),
        (["--mem", "64G"], "'--mem' is not an option of gpupool run: use --memory 64GB (per node)"),
        (["--frobnicate"], "'--frobnicate' is not an option of gpupool run (see gpupool run --help)"),
    ],
)
def test_an_option_run_lacks_is_refused_with_the_one_it_has(given: list[str], told: str) -> None:
    out = _run(*given)
    assert out.returncode == 1 and told in out.stderr, out.stderr


def test_the_slurm_names_are_not_options_of_run_already() -> None:
    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    taken = {opt for param in run.params for opt in (*param.opts, *param.secondary_opts)}
    assert not taken & set(SLURM_OPTIONS)
    named = {"--queue", "--max-duration", "--memory", "--cpus", "--name", "--node", "--after", "--env"}
    assert named <= taken
