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
    """Make the server's home its user's only, before the server writes in it: the home 0700, and what a
    server before 2026-12-07 left open to other users at its top (gpupool.db, logs/, runs/, ...) closed to
    them; each change is logged (`event=home_made_private`). Inside a 0700 home no other user reaches what
    the server writes (the store with users' plain `env` values, the logs, the run dirs), whatever its
    mode; the process's umask stays the operator's, which the work it starts inherits (a checkpoint shared
    with teammates stays readable to them)."""
    if not home.exists():
        home.mkdir(parents=True, mode=0o700)
        return
    _close(home, home)  # the home may be a symlink (to a bigger disk): its target is the home
    for entry in sorted(home.iterdir()):  # not deeper: inside a 0700 home no other user reaches them
        _close(entry, home)


def _close(path: Path, home: Path) -> None:
    """Take away the group's and others' access to `path` (inside the home: not following a symlink, which
    may lead anywhere), saying so."""
    try:
        info = path.stat() if path == home else path.lstat()
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISLNK(info.st_mode) or not mode & 0o077:
            return
        path.chmod(mode & 0o700)
    except OSError as exc:  # a read-only mount (a Kubernetes Secret), a file of another user
        log.warning("event=home_not_private home=%s path=%s error=%r", home, path.name, str(exc))
        return
    log.warning(
        "event=home_made_private home=%s path=%s mode=%o->%o (it was open to other users of this machine)",
        home, path.relative_to(home) if path != home else ".", mode, mode & 0o700,
    )  # fmt: skip
