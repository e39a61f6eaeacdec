"""Small values a head keeps across its restarts (the `head_state` table), by key."""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpupool.store.models import HeadState


def read(s: Session, key: str) -> str | None:
    row = s.get(HeadState, key)
    return None if row is None else row.value


def write(s: Session, key: str, value: str) -> None:
    row = s.get(HeadState, key)
    if row is None:
        s.add(HeadState(key=key, value=value))
    else:
        row.value = value
