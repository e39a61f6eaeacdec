"""`gpupool run` and `gpupool submit` with an option they do not have: Slurm's names get the name they
use instead (for `submit`, the spec's field where only `run` has the option); Slurm's -n is no name."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer.main

from gpupool.cli.submit import SLURM_OPTIONS, SPEC_FIELDS, _dependencies
from gpupool.main import app


def _gpupool(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"GPUPOOL_SERVER": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin"}  # refused before any request
    return subprocess.run(
        [sys.executable, "-m", "gpupool.main", *args], env=env, capture_output=True, text=True, timeout=60
    )


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return _gpupool("run", *args, "--", "python", "train.py")


@pytest.mark.parametrize(
    ("given", "told"),
    [
        (["--time=2:00:00"], "'--time' is not an option of gpupool run: use --max-duration 2h"),
        (["-t", "60"], "'-t' is not an option of gpupool run: use --max-duration 2h"),
        (["-pgpu"], "'-p' is not an option of gpupool run: use --queue NAME"),
        (["--gres=gpu:8"], "'--gres' is not an option of gpupool run: use --gpus H100:8 (per node)"),
        (["--mem", "64G"], "'--mem' is not an option of gpupool run: use --memory 64GB (per node)"),
        (["--frobnicate"], "'--frobnicate' is not an option of gpupool run (see gpupool run --help)"),
        # --dependency by its type: afterany is ended, not succeeded
        (
            ["--dependency=afterany:12"],
            "'--dependency' is not an option of gpupool run: use --after ended:12",
        ),
        (["-d", "afterok:12:13"], "'-d' is not an option of gpupool run: use --after 12 --after 13"),
        (["-d", "afternotok:12"], "'-d' is not an option of gpupool run: use --after failed:12"),
        (
            ["--dependency", "after:12"],
            "'--dependency' is not an option of gpupool run: use --after started:12",
        ),
        (["--dependency=singleton"], "use --after ID (once it succeeded: Slurm's afterok), --after ended:ID"),
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


def test_run_refuses_a_name_of_digits_as_slurms_ntasks() -> None:
    out = _run("--gpus", "0", "-n", "4")
    assert out.returncode == 1 and out.stderr.strip() == (
        "error: --name 4: a name of digits alone would be read as a workload id. Slurm's -n is --ntasks; "
        "here -n is --name (a gang of N nodes is -N N)"
    ), out.stderr


@pytest.mark.parametrize(
    ("given", "told"),
    [
        (["--time", "1h"], "'--time' is not an option of gpupool submit: use --max-duration 2h"),
        (["-t60"], "'-t' is not an option of gpupool submit: use --max-duration 2h"),
        (["-J", "x"], "'-J' is not an option of gpupool submit: use --name NAME"),
        (["-p", "gpu"], "'-p' is not an option of gpupool submit: use --queue NAME"),
        (["--qos=high"], "'--qos' is not an option of gpupool submit: use --priority"),
        (["-d", "afterany:3"], "'-d' is not an option of gpupool submit: use --after ended:3"),
        (
            ["--dependency=afternotok:3"],
            "'--dependency' is not an option of gpupool submit: use --after failed:3",
        ),
        (["--gres", "gpu:8"], "'--gres' is not an option of gpupool submit: set resources.gpu in the spec"),
        (["--gpus", "2"], "'--gpus' is not an option of gpupool submit: set resources.gpu in the spec"),
        (["--mem=64G"], "'--mem' is not an option of gpupool submit: set resources.memory in the spec"),
        (["-N", "2"], "'-N' is not an option of gpupool submit: set nodes in the spec"),
        (["--timeout", "1h", "--time", "1h"], "'--time' is not an option of gpupool submit: use --max-dur"),
    ],
)
def test_an_option_submit_lacks_is_refused_with_the_one_it_has(given: list[str], told: str) -> None:
    out = _gpupool("submit", "train.yaml", *given)
    assert out.returncode == 2 and told in out.stderr, out.stderr  # a usage error, as Click's own
    assert out.stderr.rstrip().endswith("(`gpupool submit --help`)") and "Possible options" not in out.stderr


def test_an_option_no_slurm_name_leads_to_keeps_clicks_error() -> None:
    out = _gpupool("submit", "train.yaml", "--frobnicate")
    assert out.returncode == 2 and "No such option: --frobnicate" in out.stderr, out.stderr


def test_submit_refuses_a_name_of_digits_before_reading_the_spec() -> None:
    out = _gpupool("submit", "missing.yaml", "-n", "4")
    assert out.returncode == 1 and "Slurm's -n is --ntasks; here -n is --name" in out.stderr, out.stderr


def test_submit_lacks_only_options_that_are_spec_fields() -> None:
    submit = typer.main.get_command(app).commands["submit"]  # type: ignore[attr-defined]
    taken = {opt for param in submit.params for opt in (*param.opts, *param.secondary_opts)}
    assert {"--queue", "--name", "--priority", "--max-duration", "--after"} <= taken
    assert not taken & set(SPEC_FIELDS)


@pytest.mark.parametrize(
    ("given", "entries"),
    [
        ("12", ["12"]),
        ("ended:12", ["ended:12"]),
        ("afterok:12", ["succeeded:12"]),
        ("afterany:12", ["ended:12"]),
        ("afternotok:12", ["failed:12"]),
        ("after:12", ["started:12"]),
        ("AfterOK:12:13", ["succeeded:12", "succeeded:13"]),
    ],
)
def test_after_takes_slurms_dependency_types(given: str, entries: list[str]) -> None:
    assert _dependencies(given) == entries
