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


def test_a_home_left_open_is_closed_at_the_start_saying_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    (home / "logs" / "1").mkdir(parents=True)
    (home / "runs").mkdir()
    (home / "gpupool.db").write_text("")
    (home / "logs" / "1" / "attempt-0.log").write_text("output")
    outside = tmp_path / "elsewhere"
    outside.write_text("")
    (home / "link").symlink_to(outside)
    for path, mode in ((home, 0o755), (home / "logs", 0o755), (home / "gpupool.db", 0o644), (outside, 0o644)):
        path.chmod(mode)
    (home / "credentials").write_text("")
    (home / "credentials").chmod(0o600)

    with caplog.at_level(logging.WARNING, logger="gpupool.home"):
        make_private(home)
    assert _mode(home) == 0o700
    assert _mode(home / "logs") == _mode(home / "runs") == 0o700 and _mode(home / "gpupool.db") == 0o600
    assert _mode(outside) == 0o644, "a symlink in the home is not followed"
    warned = [r.getMessage() for r in caplog.records]
    assert any("event=home_made_private" in w and "path=. mode=755->700" in w for w in warned), warned
    assert any("path=gpupool.db mode=644->600" in w for w in warned), warned
    assert not any("credentials" in w for w in warned), "what was private already is not mentioned"


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
