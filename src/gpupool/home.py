"""Where gpupool keeps its files: `$GPUPOOL_HOME`, else `~/.gpupool`."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

DEFAULT_SERVER = "http://127.0.0.1:8470"
DEFAULT_PORT = 8470
log = logging.getLogger("gpupool.home")


def home_dir() -> Path:
    return Path(os.environ.get("GPUPOOL_HOME") or Path.home() / ".gpupool").expanduser()


def default_db_url() -> str:
    return os.environ.get("GPUPOOL_DB") or f"sqlite:///{home_dir() / 'gpupool.db'}"


def credentials_path() -> Path:
    return home_dir() / "credentials"


def make_private(home: Path) -> None:
    """Make a gpupool home (the server's, or an agent's state dir) its user's only, before anything is
    written in it: mode 0700, saying so in the log when it was open to others (`event=home_made_private`,
    as a home made by hand, 0755, was before 2026-12-07). Inside a 0700 home no other user reaches what
    is written there (the store with users' plain `env` values, the logs, the run dirs, an agent's node
    credential and fencing tokens), whatever their modes; the process's umask stays the operator's, which
    the work it starts inherits (a checkpoint shared with teammates stays readable)."""
    if not home.exists():
        home.mkdir(parents=True, mode=0o700)
        return
    try:
        mode = stat.S_IMODE(home.stat().st_mode)  # the home may be a symlink (to a bigger disk): its target
        if not mode & 0o077:
            return
        home.chmod(mode & 0o700)
    except OSError as exc:  # a read-only mount, a home of another user
        log.warning("event=home_not_private home=%s error=%r", home, str(exc))
        return
    log.warning(
        "event=home_made_private home=%s mode=%o->%o (it was open to other users of this machine)",
        home, mode, mode & 0o700,
    )  # fmt: skip
