"""The command line's own error: what every command raises for a mistake the user can fix."""

from __future__ import annotations

import typer


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 1."""


def click_class(name: str) -> type[Exception]:
    """Click's exception class `name`, whichever Click this Typer uses (its own copy since Typer 0.26)."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)
