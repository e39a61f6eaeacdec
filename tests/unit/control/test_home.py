"""The server's home is its user's only: a home left open to other users of the machine (the store holds
users' plain `env` values, the logs their output) is closed at the server's start, saying so; inside it no
other user reaches what the server writes."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from gpupool.home import make_private


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_home_left_open_is_closed_at_the_start_saying_so_and_only_then(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    (home / "gpupool.db").write_text("")
    home.chmod(0o755)
    (home / "gpupool.db").chmod(0o644)

    with caplog.at_level(logging.WARNING, logger="gpupool.home"):
        make_private(home)
    assert _mode(home) == 0o700  # inside it no other user reaches the store or the logs
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "event=home_made_private" in warned[0] and "mode=755->700" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpupool.home"):
        make_private(home)  # every later start: nothing to say
    assert caplog.records == []


def test_the_umask_stays_the_operators_which_jobs_inherit(tmp_path: Path) -> None:
    before = os.umask(0o022)
    try:
        make_private(tmp_path / "home")
        assert os.umask(0o022) == 0o022  # a checkpoint a job writes stays readable to its teammates
    finally:
        os.umask(before)


def test_a_new_home_is_made_private(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    home = tmp_path / "new" / "home"
    with caplog.at_level(logging.WARNING, logger="gpupool.home"):
        make_private(home)
    assert _mode(home) == 0o700 and caplog.records == []
