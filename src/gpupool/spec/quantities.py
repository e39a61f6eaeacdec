"""Parsing and formatting of the quantities users write in specs: GPU requests, sizes and durations.

GPU requests: a count ("8", 0.5), optionally after the acceptable models ("H100:8", "A100|H100:2") or a
minimum GPU memory ("80GB:1"); a selector alone means one GPU ("H100"). A count of 1 or more is whole;
a count between 0 and 1 is a fraction of one GPU (shared). Model names are upper-cased and sorted.

Sizes (bytes): a plain integer is bytes; units are case-insensitive; K, M, G, T, P (with or without a
trailing B) are powers of 1000, Ki, Mi, Gi, Ti, Pi (with or without B) powers of 1024: "256GB" is 256e9,
"64GiB" is 64 * 2**30, "1.5TB" is 1.5e12. A fraction of a byte is rounded to the nearest byte.

Durations (seconds): a plain number is seconds; otherwise numbers with units d, h, m, s (case-insensitive),
largest first, each at most once: "90s", "30m", "12h", "2d", "1h30m", "1.5h".
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Final

from gpupool.spec.errors import SpecError

MAX_GPUS_PER_NODE: Final = 4096
MAX_SIZE_BYTES: Final = 2**63 - 1  # what a signed 64-bit database column holds
MAX_DURATION_SECONDS: Final = 3650 * 86400.0  # ten years: anything longer is a typo

GPU_EXAMPLE: Final = "'H100:8'"
SIZE_EXAMPLE: Final = "'256GB'"
DURATION_EXAMPLE: Final = "'12h'"

_NUMBER: Final = r"(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)"
_NUMBER_RE: Final = re.compile(_NUMBER)
_SIGNED_NUMBER_RE: Final = re.compile(r"[-+]\s*" + _NUMBER)
_MODEL_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9._-]*")
_NOT_A_NUMBER_WORDS: Final = frozenset({"nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"})

_SIZE_RE: Final = re.compile(r"(" + _NUMBER + r")\s*([A-Za-z]*)")
_SIZE_UNITS: Final[dict[str, int]] = {"": 1, "b": 1}
for _power, _prefix in enumerate("kmgtp", start=1):
    _SIZE_UNITS[_prefix] = _SIZE_UNITS[_prefix + "b"] = 1000**_power
    _SIZE_UNITS[_prefix + "i"] = _SIZE_UNITS[_prefix + "ib"] = 1024**_power
# Largest first; format_size picks the unit that leaves the smallest whole number.
_SIZE_NAMES: Final = [(1000**p, f"{x.upper()}B") for p, x in enumerate("kmgtp", start=1)] + [
    (1024**p, f"{x.upper()}iB") for p, x in enumerate("kmgtp", start=1)
]

_DURATION_UNITS: Final[dict[str, int]] = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION_PART_RE: Final = re.compile(r"(" + _NUMBER + r")\s*([A-Za-z]+)\s*")


def _fail(field: str, value: object, message: str, example: str) -> SpecError:
    return SpecError(field, value, message, example)


def _decimal_text(x: float) -> str:
    """The shortest text that reads back as exactly x, without an exponent (1e-05 -> '0.00001')."""
    if x.is_integer():
        return str(int(x))
    return format(Decimal(repr(x)), "f")


# --- GPU requests -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuRequest:
    """GPUs wanted on each node: how many, and which ones are acceptable."""

    count: float
    """GPUs per node: a whole number 0..4096, or a fraction 0 < f < 1 of one shared GPU."""
    models: tuple[str, ...] = ()
    """Acceptable GPU models, upper-cased and sorted, e.g. ("A100", "H100"); () means any model."""
    min_memory_bytes: int | None = None
    """Any GPU with at least this much memory ("80GB:1"); None means no minimum."""

    def __post_init__(self) -> None:
        if isinstance(self.models, str):
            raise _fail("gpu", self.models, "is not a tuple of GPU models", "('A100', 'H100')")
        count = _check_gpu_count(self.count, self.count, "gpu")
        models = tuple(sorted({_check_model(m, m, "gpu") for m in self.models}))
        if self.models and self.min_memory_bytes is not None:
            raise _fail(
                "gpu", self.models, "cannot ask for both GPU models and a minimum GPU memory", "'80GB:1'"
            )
        if self.min_memory_bytes is not None and (
            isinstance(self.min_memory_bytes, bool)
            or not isinstance(self.min_memory_bytes, int)
            or not 0 < self.min_memory_bytes <= MAX_SIZE_BYTES
        ):
            raise _fail(
                "gpu", self.min_memory_bytes, "is not a positive GPU memory size in bytes", "'80GB:1'"
            )
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "models", models)

    def __str__(self) -> str:
        count = _decimal_text(self.count)
        if self.models:
            return "|".join(self.models) + ":" + count
        if self.min_memory_bytes is not None:
            return format_size(self.min_memory_bytes) + ":" + count
        return count

    @property
    def is_fractional(self) -> bool:
        """True when this asks for a share of one GPU (0 < count < 1)."""
        return 0 < self.count < 1


def _check_gpu_count(raw: object, value: object, field: str) -> float:
    """The count as a float, if it is a valid number of GPUs per node; `value` is what the error shows."""
    if isinstance(raw, bool) or not isinstance(raw, int | float | Decimal):
        raise _fail(field, value, "is not a GPU request: the count must be a number", GPU_EXAMPLE)
    if isinstance(raw, float) and not math.isfinite(raw):
        raise _fail(field, value, "is not a GPU request: the count must be a finite number", GPU_EXAMPLE)
    if raw < 0:
        raise _fail(field, value, "is not a GPU request: the count must not be negative", GPU_EXAMPLE)
    if raw > MAX_GPUS_PER_NODE:  # compared before float(): a huge int would overflow it
        raise _fail(
            field, value, f"is not a GPU request: at most {MAX_GPUS_PER_NODE} GPUs per node", GPU_EXAMPLE
        )
    count = float(raw)
    if count >= 1 and not count.is_integer():
        raise _fail(
            field,
            value,
            "is not a GPU request: a count of 1 or more must be whole (a fraction 0 < f < 1 shares one GPU)",
            "'2' or '0.5'",
        )
    return count


def _check_model(raw: object, value: object, field: str) -> str:
    if not isinstance(raw, str) or not _MODEL_RE.fullmatch(raw):
        raise _fail(
            field,
            value,
            f"is not a GPU request: {raw!r} is not a GPU model name "
            "(a letter, then letters, digits, '-', '_' or '.')",
            "'A100|H100:2'",
        )
    return raw.upper()


def parse_gpu_request(value: str | int | float, field: str = "resources.gpu") -> GpuRequest:
    """Parse "8", "H100:8", "A100|H100:2", "80GB:1", "H100", "0.5" (or a number) into a GpuRequest."""
    raw: object = value
    if isinstance(raw, GpuRequest):
        return raw
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise _fail(field, value, "is not a GPU request: give a count or text like 'H100:8'", GPU_EXAMPLE)
    if not isinstance(raw, str):
        return GpuRequest(_check_gpu_count(raw, value, field))
    text = raw.strip()
    if not text:
        raise _fail(field, value, "is not a GPU request: it is empty", GPU_EXAMPLE)
    if text.count(":") > 1:
        raise _fail(field, value, "is not a GPU request: it has more than one ':'", GPU_EXAMPLE)
    selector, colon, count_text = text.rpartition(":")
    if not colon:
        if text.lower() in _NOT_A_NUMBER_WORDS:
            raise _fail(field, value, "is not a GPU request: the count must be a finite number", GPU_EXAMPLE)
        if _NUMBER_RE.fullmatch(text) or _SIGNED_NUMBER_RE.fullmatch(text):
            selector, count_text = "", text
        else:
            selector, count_text = text, "1"  # "H100" alone means one H100
    elif not selector.strip():
        raise _fail(field, value, "is not a GPU request: no GPU model or memory before ':'", GPU_EXAMPLE)
    count = _parse_gpu_count_text(count_text.strip(), value, field, after_colon=bool(colon))
    if not selector:
        return GpuRequest(count)
    models, min_memory = _parse_gpu_selector(selector, value, field)
    return GpuRequest(count, models, min_memory)


def _parse_gpu_count_text(text: str, value: object, field: str, *, after_colon: bool) -> float:
    where = "the count after ':'" if after_colon else "the count"
    if not text:
        raise _fail(field, value, f"is not a GPU request: {where} is missing", GPU_EXAMPLE)
    if _SIGNED_NUMBER_RE.fullmatch(text):
        if text.startswith("-"):
            raise _fail(field, value, f"is not a GPU request: {where} must not be negative", GPU_EXAMPLE)
        text = text[1:].strip()
    if not _NUMBER_RE.fullmatch(text):
        raise _fail(field, value, f"is not a GPU request: {where} must be a number", GPU_EXAMPLE)
    return _check_gpu_count(Decimal(text), value, field)


def _parse_gpu_selector(selector: str, value: object, field: str) -> tuple[tuple[str, ...], int | None]:
    """The models, or the minimum GPU memory, named before the ':'."""
    models: list[str] = []
    memories: list[int] = []
    for choice in (c.strip() for c in selector.split("|")):
        if not choice:
            raise _fail(field, value, "is not a GPU request: an empty GPU model between '|'", "'A100|H100:2'")
        if choice[0].isdigit() or choice[0] == ".":
            memories.append(_parse_gpu_memory(choice, value, field))
        else:
            models.append(_check_model(choice, value, field))
    if memories and (models or len(memories) > 1):
        raise _fail(
            field,
            value,
            "is not a GPU request: a minimum GPU memory cannot be combined with other choices",
            "'80GB:1' or 'A100|H100:2'",
        )
    return tuple(models), (memories[0] if memories else None)


def _parse_gpu_memory(choice: str, value: object, field: str) -> int:
    match = _SIZE_RE.fullmatch(choice)
    if match is None or not match.group(2) or match.group(2).lower() not in _SIZE_UNITS:
        raise _fail(
            field,
            value,
            f"is not a GPU request: {choice!r} is neither a GPU model nor a memory size like '80GB'",
            "'80GB:1'",
        )
    size = parse_size(choice, field)
    if size <= 0:
        raise _fail(field, value, "is not a GPU request: the minimum GPU memory must be above 0", "'80GB:1'")
    return size


# --- sizes ----------------------------------------------------------------------------------------


def parse_size(value: str | int, field: str) -> int:
    """Bytes from "256GB" (10**9), "64GiB" (2**30), "1.5TB", "512MiB" or a plain integer of bytes."""
    raw: object = value
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise _fail(field, value, "is not a size: give bytes or text like '256GB'", SIZE_EXAMPLE)
    if isinstance(raw, float):
        if not math.isfinite(raw) or not raw.is_integer():
            raise _fail(field, value, "is not a size: a fraction needs a unit", "'1.5GB'")
        raw = int(raw)
    nbytes = raw if isinstance(raw, int) else _parse_size_text(raw, value, field)
    if nbytes < 0:
        raise _fail(field, value, "is not a size: it must not be negative", SIZE_EXAMPLE)
    if nbytes > MAX_SIZE_BYTES:
        raise _fail(field, value, "is too large a size: at most 2**63 - 1 bytes (about 9.2EB)", SIZE_EXAMPLE)
    return nbytes


def _parse_size_text(raw: str, value: object, field: str) -> int:
    text = raw.strip()
    if not text:
        raise _fail(field, value, "is not a size: it is empty", SIZE_EXAMPLE)
    negative = text.startswith("-")
    match = _SIZE_RE.fullmatch(text[1:].strip() if negative or text.startswith("+") else text)
    if match is None:
        raise _fail(field, value, "is not a size: write a number and a unit", SIZE_EXAMPLE)
    unit = match.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise _fail(
            field,
            value,
            f"is not a size: unknown unit {match.group(2)!r} (use B, KB, MB, GB, TB, PB or KiB ... PiB)",
            SIZE_EXAMPLE,
        )
    if negative:
        raise _fail(field, value, "is not a size: it must not be negative", SIZE_EXAMPLE)
    exact = Decimal(match.group(1)) * _SIZE_UNITS[unit]
    return int(exact.to_integral_value(rounding=ROUND_HALF_UP))


def format_figure(x: float) -> str:
    """A figure as a sentence says it: three significant digits ("0.333", "12.5"), whole numbers with
    thousands separators from 1,000 on ("1,024"; `.3g` wrote "1.02e+03")."""
    return f"{x:,.0f}" if abs(x) >= 999.5 else f"{x:.3g}"


def format_size(n: int) -> str:
    """Human text for a number of bytes in the largest exact unit ("256GB", "512MiB", "1234B")."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"format_size needs a non-negative int of bytes, not {n!r}")
    if n == 0:
        return "0B"
    whole = [(n // unit, name) for unit, name in _SIZE_NAMES if n % unit == 0]
    if not whole:
        return f"{n}B"
    number, name = min(whole)
    return f"{number}{name}"


def format_gpu_indices(indices: Sequence[int]) -> str:
    """Which GPUs of a node an attempt holds, as people read them: "GPU 4", "GPUs 0,1", "no GPU" (a
    bare "gpus=4" reads as a count)."""
    if not indices:
        return "no GPU"
    return f"GPU{'s' if len(indices) > 1 else ''} {','.join(str(i) for i in indices)}"


# --- durations ------------------------------------------------------------------------------------


def parse_duration(value: str | int | float, field: str) -> float:
    """Seconds from "90s", "30m", "12h", "2d", "1h30m", "1.5h" or a plain number of seconds (>= 0)."""
    raw: object = value
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise _fail(field, value, "is not a duration: give seconds or text like '12h'", DURATION_EXAMPLE)
    if isinstance(raw, str):
        seconds = _parse_duration_text(raw, value, field)
    else:
        if isinstance(raw, int) and abs(raw) > 10**300:
            raw = math.copysign(math.inf, raw)
        seconds = float(raw)
        if not math.isfinite(seconds):
            raise _fail(field, value, "is not a duration: it must be a finite number", DURATION_EXAMPLE)
        if seconds < 0:
            raise _fail(field, value, "is not a duration: it must not be negative", DURATION_EXAMPLE)
    if seconds > MAX_DURATION_SECONDS:
        raise _fail(field, value, "is too long a duration: at most 3650d (ten years)", DURATION_EXAMPLE)
    return seconds


def _parse_duration_text(raw: str, value: object, field: str) -> float:
    text = raw.strip()
    if not text:
        raise _fail(field, value, "is not a duration: it is empty", DURATION_EXAMPLE)
    if text.startswith("-"):
        raise _fail(field, value, "is not a duration: it must not be negative", DURATION_EXAMPLE)
    if text.lower() in _NOT_A_NUMBER_WORDS:
        raise _fail(field, value, "is not a duration: it must be a finite number", DURATION_EXAMPLE)
    text = text.removeprefix("+").strip()
    if _NUMBER_RE.fullmatch(text):
        return float(Decimal(text))
    total = Decimal(0)
    position = 0
    previous_unit = math.inf
    for match in _DURATION_PART_RE.finditer(text):
        if match.start() != position:
            break
        position = match.end()
        unit = match.group(2).lower()
        if unit not in _DURATION_UNITS:
            raise _fail(
                field,
                value,
                f"is not a duration: unknown unit {match.group(2)!r} (use d, h, m or s)",
                DURATION_EXAMPLE,
            )
        if _DURATION_UNITS[unit] >= previous_unit:
            raise _fail(
                field,
                value,
                "is not a duration: give units largest first, each once",
                "'1h30m'",
            )
        previous_unit = _DURATION_UNITS[unit]
        total += Decimal(match.group(1)) * _DURATION_UNITS[unit]
    if position != len(text) or position == 0:
        raise _fail(
            field, value, "is not a duration: write numbers with units d, h, m or s", DURATION_EXAMPLE
        )
    return float(total)


def format_duration(seconds: float) -> str:
    """Human text for seconds that parse_duration reads back exactly: 5400 -> "1h30m", 90 -> "1m30s"."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"format_duration needs a number of seconds, not {seconds!r}")
    x = float(seconds)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"format_duration needs finite, non-negative seconds, not {seconds!r}")
    if not x.is_integer() or x >= 2**53:
        return _decimal_text(x) + "s"
    rest = int(x)
    parts: list[str] = []
    for unit, size in _DURATION_UNITS.items():
        amount, rest = divmod(rest, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts) or "0s"
