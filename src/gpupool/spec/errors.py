"""The one exception a bad spec raises: it names the field, the bad value, the problem and a valid example."""

from __future__ import annotations

import math
import reprlib
from typing import Final


class _Missing:
    """The value of a field that was not given at all (so there is no bad value to show)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<missing>"

    def __reduce__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()
"""Stands for 'no value given' in SpecError.value (a required field that is absent)."""

# Bounded so that a huge or self-referencing value (a YAML alias bomb) still prints in one short line.
_SHORT = reprlib.Repr()
_SHORT.maxstring = 80
_SHORT.maxother = 80
_SHORT.maxlevel = 2
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 4
_MAX_SHOWN = 120

_MAX_JSON_STRING = 200


def show_value(value: object) -> str:
    """The value as a short one-line Python literal, as an error message shows it."""
    shown = _SHORT.repr(value)
    return shown if len(shown) <= _MAX_SHOWN else shown[: _MAX_SHOWN - 3] + "..."


class SpecError(ValueError):
    """A bad value in a spec: names the field, the bad value, what is wrong, and a valid example.

    `message` is a phrase that reads after the value ("is not a GPU request: ..."), so that
    str(err) is one readable line: "<field>: <value> <message>; e.g. <example>".
    `value` is MISSING when a required field was not given; the line then omits it.
    """

    field: str
    value: object
    message: str
    example: str

    def __init__(self, field: str, value: object, message: str, example: str) -> None:
        # All four go to args so that the error pickles and copies (ValueError rebuilds from args).
        super().__init__(field, value, message, example)
        self.field = field
        self.value = value
        self.message = message
        self.example = example

    def __str__(self) -> str:
        shown = "" if self.value is MISSING else f"{show_value(self.value)} "
        line = f"{self.field}: {shown}{self.message}"
        if self.example:
            line += f"; e.g. {self.example}"
        return " ".join(line.split())  # one line whatever the parts contain

    def __repr__(self) -> str:
        return f"SpecError({self.field!r}, {show_value(self.value)}, {self.message!r}, {self.example!r})"

    def to_dict(self) -> dict[str, object]:
        """A JSON-able description, for API error bodies: field, value, message, example."""
        return {
            "field": self.field,
            "value": _json_value(self.value),
            "message": self.message,
            "example": self.example,
        }

    def at(self, field: str) -> SpecError:
        """The same error reported at another field path (used to prefix paths of nested specs)."""
        return SpecError(field, self.value, self.message, self.example)


def _json_value(value: object) -> object:
    """Scalars as they are (long text cut short); anything else, or a non-finite float, as a short repr."""
    if value is MISSING:
        return None
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return value if len(value) <= _MAX_JSON_STRING else value[:_MAX_JSON_STRING] + "..."
    return show_value(value)
