"""Where the head's proxy sends a service's requests (control/service_targets.py), read from a real SQLite
store: an attempt being launched is refused as starting, not as one that will never have an address."""

from __future__ import annotations

import pytest

from gpupool.control.errors import Unavailable
from gpupool.control.service_targets import service_targets
from gpupool.store.db import Store
from gpupool.store.models import Attempt
from tests.support.store import submit_running


def test_a_service_being_launched_is_starting_and_then_reached_at_its_endpoint(store: Store) -> None:
    wid = submit_running(store, {"kind": "service", "commands": ["serve"]}, backend="local")
    with pytest.raises(Unavailable) as caught:
        service_targets(store, wid)
    assert "attempt 0 is starting" in caught.value.message and "try again in a moment" in caught.value.message
    with store.session() as s:
        attempt = s.query(Attempt).filter_by(workload_id=wid).one()
        attempt.pid, attempt.endpoint = 4242, "127.0.0.1:18000"
    (target,) = service_targets(store, wid)
    assert (target.endpoint, target.workload_id, target.attempt) == ("127.0.0.1:18000", wid, 0)
