"""What a bench command raises when the input or the machine cannot give a result."""

from __future__ import annotations


class BenchError(Exception):
    """A benchmark could not run as asked; the message names the flag and the fix."""
