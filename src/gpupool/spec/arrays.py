"""Job arrays: a workload spec's `array`, in Slurm's --array notation, and the task indices it names."""

from __future__ import annotations

import re
from typing import Final

from gpupool.spec.errors import SpecError

MAX_ARRAY_TASKS: Final = 1000  # Slurm's MaxArraySize is 1001 by default
MAX_ARRAY_INDEX: Final = 1_000_000
_ARRAY_PART_RE: Final = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")


class ArrayRange:
    """A job array's task indices and how many of its tasks may run at once (Slurm's --array)."""

    __slots__ = ("indices", "limit")

    def __init__(self, indices: tuple[int, ...], limit: int | None) -> None:
        self.indices = indices  # ascending, each once
        self.limit = limit  # None: no limit

    def text(self) -> str:
        """The canonical form: runs of consecutive indices as A-B, joined by commas, then %LIMIT."""
        parts: list[str] = []
        start = prev = self.indices[0]
        for index in (*self.indices[1:], None):
            if index is not None and index == prev + 1:
                prev = index
                continue
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            if index is not None:
                start = prev = index
        return ",".join(parts) + (f"%{self.limit}" if self.limit is not None else "")


def parse_array(value: object, field: str = "array") -> ArrayRange:
    """Slurm's --array notation: "0-15", "1,3,5-9", "0-99:10" (every 10th), each with an optional "%4"
    (at most 4 tasks running at once)."""
    example = "0-15%4"
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise SpecError(field, value, "is not an array of task indices", example)
    text = str(value).replace(" ", "")
    spec, sep, limit_text = text.partition("%")
    limit: int | None = None
    if sep:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise SpecError(field, value, "has a limit after % that is not a whole number >= 1", example)
        limit = int(limit_text)
    indices: set[int] = set()
    parts = spec.split(",")
    for part in parts:
        # the part at fault, named where the value has several ("0-3,5-1"); a value of one is the part
        named = f"has {part!r}, which is" if len(parts) > 1 else "is"
        match = _ARRAY_PART_RE.fullmatch(part)
        if match is None:
            raise SpecError(field, value, f"{named} not N, N-M or N-M:STEP (task indices)", example)
        first, last, step = match.groups()
        low, high = int(first), int(last if last is not None else first)
        stride = int(step) if step is not None else 1
        if high < low or stride < 1:
            raise SpecError(field, value, f"{named} not a range N-M with N <= M and a step >= 1", example)
        if high > MAX_ARRAY_INDEX:
            raise SpecError(field, value, f"has an index above {MAX_ARRAY_INDEX}", example)
        if (high - low) // stride + 1 > MAX_ARRAY_TASKS:  # checked before the range is made
            raise SpecError(field, value, f"has more than {MAX_ARRAY_TASKS} tasks", "0-999%50")
        indices.update(range(low, high + 1, stride))
        if len(indices) > MAX_ARRAY_TASKS:
            raise SpecError(field, value, f"has more than {MAX_ARRAY_TASKS} tasks", "0-999%50")
    return ArrayRange(tuple(sorted(indices)), limit)


def array_limit(stored: str) -> int | None:
    """The %N of an array as a spec stores it (`ArrayRange.text`), without making its indices."""
    _, sep, limit = stored.rpartition("%")
    return int(limit) if sep else None
