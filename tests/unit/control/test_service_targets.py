"""Where the head's proxy sends a service's requests (service.service_targets), read from a real SQLite
store: an attempt being launched is refused as starting, not as one that will never have an address."""

from __future__ import annotations

import pytest

from gpupool.control import service
from gpupool.control.errors import Unavailable
from gpupool.control.lifecycle import RUNNING, transition
from gpupool.spec import parse_workload_spec
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Workload


def test_a_service_being_launched_is_starting_and_then_reached_at_its_endpoint(store: Store) -> None:
    wid = int(service.submit(store, parse_workload_spec({"kind": "service", "commands": ["serve"]}))["id"])
    with store.session() as s:
        workload = s.get(Workload, wid)
        assert workload is not None and transition(s, workload, RUNNING, "started").accepted
        s.add(
            Attempt(
                workload_id=wid,
                queue=workload.queue,
                number=0,
                state=RUNNING,
                node_name="node-1",
                backend="local",
            )
        )
    with pytest.raises(Unavailable) as caught:
        service.service_targets(store, wid)
    assert "attempt 0 is starting" in caught.value.message and "try again in a moment" in caught.value.message
    with store.session() as s:
        attempt = s.query(Attempt).filter_by(workload_id=wid).one()
        attempt.pid, attempt.endpoint = 4242, "127.0.0.1:18000"
    (target,) = service.service_targets(store, wid)
    assert (target.endpoint, target.workload_id, target.attempt) == ("127.0.0.1:18000", wid, 0)
