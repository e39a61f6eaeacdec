"""What the control loop's unit tests share: a fresh SQLite store with the default queue."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.control import queues
from gpupool.store.db import Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'gpupool.db'}")
    queues.ensure_default_queue(store)
    yield store
    store.close()
