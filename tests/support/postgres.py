"""Start a throwaway PostgreSQL server on loopback for the tests (Debian's `postgresql` package)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest


def find_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """initdb + pg_ctl in a temp dir; runs as the `postgres` user when we are root (postgres refuses root)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.data = base / "data"
        self.port = _free_port()
        self.initdb = find_bin("initdb")
        self.pg_ctl = find_bin("pg_ctl")
        if not self.initdb or not self.pg_ctl:
            raise RuntimeError("PostgreSQL server binaries not found: apt-get install postgresql")
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(base, user="postgres")
            self._as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *argv: str) -> None:
        subprocess.run([*self._as_user, *argv], check=True, capture_output=True, timeout=120)

    def start(self) -> str:
        self._run(self.initdb, "-D", str(self.data), "-U", "gpupool", "--auth=trust", "-E", "UTF8")
        return self.resume()

    def resume(self) -> str:
        """Start the server on its data directory (after `stop`) and wait until it takes connections."""
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.base} "
            "-c fsync=off -c max_connections=200"
        )
        self._run(
            self.pg_ctl, "-D", str(self.data), "-o", options, "-l", str(self.base / "log"), "-w", "start"
        )
        url = f"postgresql://gpupool@127.0.0.1:{self.port}/postgres"
        deadline = time.time() + 30
        import psycopg

        while True:
            try:
                with psycopg.connect(url.replace("postgresql://", "postgresql://", 1), connect_timeout=2):
                    break
            except psycopg.OperationalError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        return url

    def new_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(f"postgresql://gpupool@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://gpupool@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(self.pg_ctl, "-D", str(self.data), "-m", "immediate", "stop")


def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database for a fixture parametrized over "sqlite" and "postgres": a SQLite file in
    `tmp_path`, or a new database on the session's PostgreSQL server (the `postgres` fixture)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    pg: PostgresServer = request.getfixturevalue("postgres")
    return pg.new_database(f"t_{uuid.uuid4().hex[:12]}")
