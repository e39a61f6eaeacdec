from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import PostgresServer, find_bin
from tests.support.process import kill_attempts_under
from tests.support.server import ServerProcess


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(home=tmp_path / "home").start()
    try:
        yield proc
    finally:
        proc.stop()
        kill_attempts_under(
            tmp_path
        )  # work still running (a service never ends by itself) ends with the test


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    path = tmp_path / "jobs"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session. In CI it must exist: a missing server fails, never skips."""
    if not find_bin("initdb"):
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not installed; .ci/run installs Debian's postgresql package")
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
    base = Path(tempfile.mkdtemp(prefix="gpupool-pg-"))
    server = PostgresServer(base)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
