"""Workload priority: the named classes, the range of numbers, and which priorities are preemptible.

Priority (Run:ai semantics): a named class or a number 0..1000, higher runs first and may preempt lower.
The classes are inference (125) > build (100) > interactive (75) > train (50, the default). A workload is
preemptible by default when its priority is at most train's (50): "train" and any number <= 50 are
preemptible; "inference", "build", "interactive" and any number above 50 are not. `preemptible:` overrides.
"""

from __future__ import annotations

from typing import Final

PRIORITY_CLASSES: Final[dict[str, int]] = {"inference": 125, "build": 100, "interactive": 75, "train": 50}
"""Named priority classes and their numbers; higher runs first."""

DEFAULT_PRIORITY_CLASS: Final = "train"
MAX_PRIORITY: Final = 1000
PREEMPTIBLE_AT_OR_BELOW: Final = PRIORITY_CLASSES["train"]
"""A workload whose priority is at most this is preemptible unless its spec says otherwise."""
NON_PREEMPTIBLE_BY_DEFAULT: Final = frozenset(
    name for name, value in PRIORITY_CLASSES.items() if value > PREEMPTIBLE_AT_OR_BELOW
)
"""The classes that are not preemptible unless the spec says so: inference, build, interactive."""


def priority_class_of(priority: str) -> str | None:
    """The canonical class name for a name given in any case (" Train " -> "train"), or None."""
    name = priority.strip().lower()
    return name if name in PRIORITY_CLASSES else None


def default_preemptible(priority: int) -> bool:
    """Whether a workload of this priority is preemptible when its spec does not say."""
    return priority <= PREEMPTIBLE_AT_OR_BELOW


__all__ = [
    "NON_PREEMPTIBLE_BY_DEFAULT",
    "PREEMPTIBLE_AT_OR_BELOW",
    "PRIORITY_CLASSES",
    "default_preemptible",
    "priority_class_of",
]
