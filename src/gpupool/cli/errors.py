"""The command line's own error: what every command raises for a mistake the user can fix."""

from __future__ import annotations


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 1."""
