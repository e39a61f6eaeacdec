"""Agents' heartbeats are answered from the node credentials the head last read while its store cannot be
read (a PostgreSQL restart): an agent's liveness needs no store, and a heartbeat refused for that long made
agents kill their work after their orphan grace."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from gpupool.api.routes.agents import CREDENTIAL_CACHE_SECONDS, NodeCredentials
from gpupool.store.db import Store


def _break(store: Store) -> None:
    """The store answers every read of the nodes with an error, as one that cannot be reached does."""
    with store.engine.begin() as connection:
        connection.execute(text("DROP TABLE gpus"))
        connection.execute(text("DROP TABLE nodes"))


def test_known_credentials_answer_while_the_store_is_down_and_a_first_read_fails_loudly(
    tmp_path: Path,
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'gpupool.db'}")
    try:
        credentials = NodeCredentials()
        assert credentials.name(store, "unknown") is None  # read the store once: no node yet
        credentials.registered("node-1", "secret-1")
        _break(store)
        credentials._loaded = time.monotonic() - CREDENTIAL_CACHE_SECONDS - 1  # due to be read again
        assert credentials.name(store, "secret-1") == "node-1"
        assert credentials.name(store, "unknown") is None
        with pytest.raises(OperationalError):  # nothing read yet: the API's 503 store_unavailable
            NodeCredentials().name(store, "secret-1")
    finally:
        store.close()
