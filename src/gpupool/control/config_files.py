"""The operator's files in $GPUPOOL_HOME (scheduling.yaml, prices.yaml): read, parsed, and refused with the
file's path, the field and the fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gpupool.spec import SpecError

T = TypeVar("T")


def parse_file(path: Path, parse: Callable[[str], T], error: type[ValueError]) -> T:
    """`parse` of the file's text; `error` naming the path when it cannot be read or parsed."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc})") from None
    try:
        return parse(text)
    except SpecError as exc:
        raise error(f"{path}: {exc}") from None
