"""Input files of the simulator, read: the rows of a CSV file (a trace, a node list), a whole text file (a
policy or queue file), and the fields in them (numbers, whole counts, GPU models). Whatever is wrong with one
is one error that names the option, the file, the line and the fix."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path

from gpupool.sim.errors import SimError
from gpupool.spec import GpuRequest, SpecError

MIB = 1024 * 1024


def read_rows(
    path: Path, fmt: str, required: tuple[str, ...], flag: str = "--trace"
) -> Iterator[dict[str, str]]:
    """The rows of a CSV file with a header naming `required`; a row with fewer or more fields than the
    header, or a quoted field running over a line break (a quote left open), is an error naming its line."""
    try:
        handle = path.open(
            newline="", encoding="utf-8-sig"
        )  # a spreadsheet's byte-order mark is not a column
    except FileNotFoundError:
        raise SimError(flag, f"{path}: no such file; check the path after '{fmt}:'") from None
    except OSError as exc:
        raise SimError(flag, f"cannot read {path}: {exc.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        try:
            yield from _checked_rows(reader, path, fmt, required, flag)
        except UnicodeDecodeError:
            # the text is decoded a block at a time, so the error does not know its line: look for it
            with path.open("rb") as raw:
                raise SimError(flag, not_utf8(path, raw)) from None
        except csv.Error as exc:
            where = f"{path} line {reader.line_num + 1}"  # the row it could not read follows the last read
            if "field limit" in str(exc):
                raise SimError(
                    flag,
                    f"{where}: a field longer than {csv.field_size_limit():,} characters: a quote "
                    '(") left open takes in every line after it; close it, or is this not a CSV file?',
                ) from None
            raise SimError(flag, f"{where}: not CSV ({exc})") from None


def _checked_rows(
    reader: csv.DictReader[str], path: Path, fmt: str, required: tuple[str, ...], flag: str
) -> Iterator[dict[str, str]]:
    header = [h.strip() for h in reader.fieldnames or []]
    missing = [c for c in required if c not in header]
    if missing:
        raise SimError(
            flag,
            f"{path} is not in the {fmt} format: missing column(s) {', '.join(missing)} "
            f"(it needs {', '.join(required)}; see docs/simulator.md)",
        )
    reader.fieldnames = header
    last = reader.line_num  # the line the previous row ended on
    for row in reader:
        if reader.line_num != last + 1:  # blank lines, or a quoted field over several lines
            _no_line_breaks(row, last, reader.line_num, path, flag)
        last = reader.line_num
        if None in row:  # csv's key for the fields beyond the header's
            extra = row[None]
            raise SimError(
                flag,
                f"{path} line {reader.line_num}: {len(header) + len(extra)} fields, the header {len(header)} "
                f"(extra: {', '.join(repr(v) for v in extra[:3])}); delete the extra fields, or quote a "
                'field that holds a comma ("a,b")',
            )
        if None in row.values():  # csv's filler for the columns a short row lacks
            missing = [c for c in header if row[c] is None]
            raise SimError(
                flag,
                f"{path} line {reader.line_num}: no {', '.join(missing)} (the row has "
                f"{len(header) - len(missing)} fields, the header {len(header)}); complete or delete it",
            )
        yield row


def _no_line_breaks(row: dict[str, str], last: int, now: int, path: Path, flag: str) -> None:
    """Refuse a row with a field holding a line break: a quote left open takes in the lines after it."""
    breaks = {c: v.count("\n") + v.count("\r") - v.count("\r\n") for c, v in row.items() if v and c}
    column = next((c for c, n in breaks.items() if n), None)
    if column is None:
        return  # blank lines before the row: csv skips them
    # where the row began: the line its breaks end on, less the breaks (one more if the file ended first)
    opened = max(last + 1, now - sum(breaks.values()))
    raise SimError(
        flag,
        f'{path} line {opened}: {column} opens a quote (") that this line does not close, so the lines '
        "after it are read into the field; close the quote on that line, or remove it",
    )


UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")  # what a spreadsheet's "Unicode text" begins with


def read_text(path: Path, flag: str) -> str:
    """A whole file as UTF-8 text (a byte-order mark dropped); OSError is the caller's to word."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SimError(flag, not_utf8(path, data.splitlines(keepends=True))) from None


def not_utf8(path: Path, lines: Iterable[bytes]) -> str:
    """What is wrong with a file that is not UTF-8, at its first line that is not: "b.csv line 3: not UTF-8
    text (byte 0xe9 at column 12); save it as UTF-8"."""
    for number, line in enumerate(lines, start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            byte = f"byte 0x{line[exc.start]:02x} at column {exc.start + 1}"
            if number == 1 and line.startswith(UTF16_MARKS):
                converted = path.with_name(f"{path.stem}-utf8{path.suffix}")
                return (
                    f"{path} line 1: not UTF-8 text ({byte}: the file is UTF-16); save it as UTF-8, "
                    f"e.g. iconv -f UTF-16 -t UTF-8 {path} > {converted}"
                )
            return f"{path} line {number}: not UTF-8 text ({byte}); save it as UTF-8"
    return f"{path}: not UTF-8 text; save it as UTF-8"


def number_field(row: dict[str, str], column: str, path: Path, line: int, flag: str = "--trace") -> float:
    raw = (row.get(column) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise SimError(flag, f"{path} line {line}: {column} {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SimError(flag, f"{path} line {line}: {column} is {raw!r}; it must be a finite number")
    return value


def whole_field(
    row: dict[str, str], column: str, path: Path, line: int, unit: str, flag: str = "--trace"
) -> int:
    """A count that only comes whole (nodes, GPUs of a node): "2.5" is an error, never cut to 2. Whether a
    negative one is an error or a row to leave out is the caller's to say."""
    value = number_field(row, column, path, line, flag)
    if not value.is_integer():
        raise SimError(
            flag, f"{path} line {line}: {column} {value:g} is not a whole number; give whole {unit}"
        )
    return int(value)


@lru_cache(maxsize=4096)
def gpu_models(text: str) -> tuple[str, ...]:
    """The GPU models of `a100|H100` as the product spells them (a GpuRequest's: upper case, sorted, each
    once), so that a trace's and a cluster's agree whatever their case; () for none. SpecError if one is
    not a model name. Cached: a trace repeats a handful of texts."""
    return GpuRequest(1, tuple(m.strip() for m in text.split("|") if m.strip())).models


def models_field(
    row: dict[str, str], column: str, path: Path, line: int, flag: str = "--trace"
) -> tuple[str, ...]:
    """A column of GPU models (`A100|H100`; empty: any), canonical (`gpu_models`)."""
    raw = row.get(column) or ""
    try:
        return gpu_models(raw)
    except SpecError:
        raise SimError(
            flag,
            f"{path} line {line}: {column} {raw.strip()!r} is not a GPU model name (a letter, then letters, "
            "digits, '-', '_' or '.'; several joined by '|', e.g. A100|H100)",
        ) from None
