"""`changes.hold` and `release` on a real SQLite store: what they mark, and a hold taken back before the
control loop acted on it."""

from __future__ import annotations

import pytest

from gpupool.control import changes, submission, workloads
from gpupool.control.errors import Conflict
from gpupool.control.lifecycle import HELD, STOP_HOLD
from gpupool.spec import parse_workload_spec
from gpupool.store.db import Store
from gpupool.store.models import Attempt
from tests.support.store import submit_running


def _running(store: Store) -> int:
    return submit_running(store, {"commands": ["train"]}, backend="local")


def _attempt(store: Store, wid: int) -> tuple[str, bool]:
    with store.read() as s:
        attempt = s.query(Attempt).filter_by(workload_id=wid).one()
        return attempt.stop_reason, attempt.stop_requested_at is not None


def test_holding_running_work_asks_the_loop_to_stop_it_and_a_release_in_time_takes_that_back(
    store: Store,
) -> None:
    wid = _running(store)
    view = changes.hold(store, wid)
    assert view["held"] is True and view["held_ids"] == [wid]
    assert _attempt(store, wid) == (STOP_HOLD, False)  # the control loop sends SIGTERM
    changes.release(store, wid)
    assert _attempt(store, wid) == ("", False)  # released before the loop acted: it runs on
    assert workloads.get_workload(store, wid)["held"] is False
    events = [e["reason"] for e in workloads.get_workload(store, wid)["events"]]
    assert events[-2:] == ["held by admin: stopping it, to wait pending until released", "released by admin"]


def test_held_pending_work_says_so_at_once_and_ended_work_cannot_be_held(store: Store) -> None:
    wid = int(submission.submit(store, parse_workload_spec({"commands": ["true"]}))["id"])
    changes.hold(store, wid, actor="alice")
    view = workloads.get_workload(store, wid)
    assert view["held"] is True and view["reason_code"] == HELD
    assert view["reason"] == f"held by alice; `gpupool release {wid}` lets it start"
    changes.cancel(store, wid)
    with pytest.raises(Conflict) as caught:
        changes.hold(store, wid)
    assert caught.value.message == f"workload {wid} was cancelled; nothing to hold"
    with pytest.raises(Conflict) as caught:
        changes.cancel(store, wid)
    assert caught.value.message == f"workload {wid} was cancelled; nothing to cancel"
