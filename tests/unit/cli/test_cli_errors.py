"""What the CLI says of input it cannot use before it asks a server anything: one `error:` line that names
what was wrong and the fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpupool import __version__


def test_a_server_address_without_http_is_refused_with_the_fix() -> None:
    env = {"GPUPOOL_SERVER": "127.0.0.1:8470", "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.main", "ps"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "error: GPUPOOL_SERVER 127.0.0.1:8470: not an http:// or https:// address; e.g. http://127.0.0.1:8470"
    )


@pytest.mark.parametrize(
    ("argv", "said", "command"),
    [
        (["queue", "create", "cv", "--gpu-quota", "two"], "Invalid value for '--gpu-quota'", "queue create"),
        (["ps", "--bogus"], "No such option: --bogus", "ps"),
        (["show"], "Missing argument 'workload'.", "show"),
        (["logs", "1", "--attempt", "-1"], "Invalid value for '--attempt': Input should be greater", "logs"),
        (
            ["update", "1", "--time", "2h"],
            "'--time' is not an option of gpupool update: use --max-duration",
            "update",
        ),
        (["submit", "x.yaml", "-J", "a"], "'-J' is not an option of gpupool submit:", "submit"),
    ],
)
def test_a_flag_a_command_cannot_take_is_one_error_line_naming_its_help(
    argv: list[str], said: str, command: str
) -> None:
    """Click's usage errors (a bad value, an unknown option, a missing argument) as the CLI's own: one line,
    exit 2 (as argparse's), before anything is asked of a server."""
    env = {"GPUPOOL_SERVER": "http://127.0.0.1:1", "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.main", *argv], env=env, capture_output=True, text=True, timeout=60
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"error: {said}") and lines[0].endswith(f"(`gpupool {command} --help`)")


def test_version_and_the_short_help_flag() -> None:
    env = {
        "GPUPOOL_SERVER": "http://127.0.0.1:1",
        "PATH": "/usr/bin:/bin",
        "HOME": "/nonexistent",
        "COLUMNS": "100",
    }
    version = subprocess.run(
        [sys.executable, "-m", "gpupool.main", "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (version.returncode, version.stdout.strip()) == (0, f"gpupool {__version__}")
    for argv in (["-h"], ["queue", "create", "-h"]):
        shown = subprocess.run(
            [sys.executable, "-m", "gpupool.main", *argv], env=env, capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0 and f"Usage: gpupool {' '.join(argv[:-1])}".strip() in shown.stdout


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--gpu-quota", "nan"], "error: --gpu-quota nan is not a finite number"),
        (["--gpu-weight", "inf"], "error: --gpu-weight inf is not a finite number"),
        (["--gpu-limit", "nan"], "error: --gpu-limit nan is not a finite number"),
        (["--budget", "inf/day"], "error: --budget inf is not a finite number"),
    ],
)
def test_a_number_that_is_not_finite_is_refused_before_a_queue_changes(argv: list[str], said: str) -> None:
    """JSON cannot carry nan or inf: `queue update` printed a traceback where `queue create` refused."""
    env = {"GPUPOOL_SERVER": "http://127.0.0.1:1", "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.main", "queue", "update", "nlp", *argv],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith(said) and "Traceback" not in out.stderr, out.stderr
    assert "give a number such as 16, or none to remove it" in out.stderr
