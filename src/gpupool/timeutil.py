"""Wall-clock helpers for the imperative shell (the scheduler never reads a clock)."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; treat them as UTC so arithmetic never mixes kinds."""
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def iso(value: datetime | None) -> str | None:
    """A stored time as ISO 8601 (a naive one read as UTC); None stays None."""
    value = as_utc(value)
    return value.isoformat() if value is not None else None


def age_seconds(value: datetime | None, now: datetime | None = None) -> float:
    value = as_utc(value)
    if value is None:
        return 0.0
    return ((now or utcnow()) - value).total_seconds()
