"""Where gpupool keeps its files: `$GPUPOOL_HOME`, else `~/.gpupool`."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_SERVER = "http://127.0.0.1:8470"
DEFAULT_PORT = 8470


def home_dir() -> Path:
    return Path(os.environ.get("GPUPOOL_HOME") or Path.home() / ".gpupool").expanduser()


def default_db_url() -> str:
    return os.environ.get("GPUPOOL_DB") or f"sqlite:///{home_dir() / 'gpupool.db'}"


def credentials_path() -> Path:
    return home_dir() / "credentials"
