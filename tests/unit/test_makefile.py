"""The Makefile's choice of interpreter for the .venv: the system's Python where it can make a venv and
compile the scheduler (3.11+, venv, Python.h), else `python3` on the PATH."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def chosen(*overrides: str) -> str:
    """The interpreter `make` would make the .venv from, with these variable overrides."""
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT), *overrides, "--eval", "chosen: ; @echo $(PYTHON)", "chosen"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout.strip()


def test_a_system_python_that_is_missing_falls_back_to_python3_on_the_path() -> None:
    assert chosen("SYSTEM_PYTHON=/nonexistent/python3") == "python3"


def test_a_system_python_that_can_make_a_venv_and_compile_is_chosen() -> None:
    fits = Path(sysconfig.get_paths()["include"], "Python.h").exists() and sys.version_info >= (3, 11)
    if not fits:
        pytest.skip("this interpreter has no Python.h to compile against")
    assert chosen(f"SYSTEM_PYTHON={sys.executable}") == sys.executable
