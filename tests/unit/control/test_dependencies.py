"""Dependencies between workloads (control/dependencies.py): when each condition holds, never will, or not
yet; the pass's sorting of waiting work on a real SQLite store; and the refusals at submit."""

from __future__ import annotations

import pytest

from gpupool.control import submission
from gpupool.control.dependencies import GONE, Dependencies, Facts, dependencies_of, verdict
from gpupool.control.errors import Invalid
from gpupool.control.lifecycle import transition
from gpupool.spec import parse_workload_spec
from gpupool.store.db import Store
from gpupool.store.models import Workload

# (state, started) -> (succeeded, failed, ended, started): True met, False never, None not yet
TABLE = [
    ("pending", False, (None, None, None, None)),
    ("pending", True, (None, None, None, True)),  # started once, preempted and pending again
    ("running", True, (None, None, None, True)),
    ("succeeded", True, (True, False, True, True)),
    ("failed", True, (False, True, True, True)),
    ("failed", False, (False, True, True, False)),  # could not start
    ("cancelled", True, (False, False, True, True)),
    ("cancelled", False, (False, False, True, False)),
]


@pytest.mark.parametrize("state,started,expected", TABLE)
def test_each_condition_holds_never_will_or_not_yet(
    state: str, started: bool, expected: tuple[bool | None, ...]
) -> None:
    facts = Facts("prep", "job", state, started)
    got = tuple(verdict(when, facts) for when in ("succeeded", "failed", "ended", "started"))
    assert got == expected


def test_a_workload_gone_from_the_store_can_no_longer_do_anything() -> None:
    assert {verdict(when, GONE) for when in ("succeeded", "failed", "started")} == {False}


def _submit(store: Store, **fields: object) -> int:
    return int(submission.submit(store, parse_workload_spec({"commands": ["true"], **fields}))["id"])


def _set_state(store: Store, wid: int, *states: str) -> None:
    with store.session() as s:
        workload = s.get(Workload, wid)
        assert workload is not None
        for state in states:
            assert transition(s, workload, state, "test").accepted


def test_a_pass_sorts_waiting_work_into_met_waiting_and_never(store: Store) -> None:
    prep = _submit(store, name="prep")
    other = _submit(store, name="other")
    train = _submit(store, after=[prep, f"started:{other}"])
    cleanup = _submit(store, after=f"failed:{prep}")
    deps = Dependencies()
    with store.read() as s:
        specs = {wid: s.get(Workload, wid) for wid in (train, cleanup)}
        listed = {wid: dependencies_of(w.spec) for wid, w in specs.items() if w is not None}
        deps.sort(s, listed)
    assert set(deps.waiting) == {train, cleanup} and not deps.never
    assert deps.waiting[train].code == "dependency"
    assert deps.waiting[train].message == (
        f"waits for workload {prep} (prep) to succeed (it is pending); and for workload {other} (other) to "
        "start (it is pending)"
    )
    _set_state(store, other, "running")
    _set_state(store, prep, "running", "succeeded")
    with store.read() as s:
        deps.sort(s, listed)
    assert not deps.waiting
    assert deps.never == {
        cleanup: f"dependency never satisfied: workload {prep} (prep) succeeded, and this one was to start "
        "after it failed"
    }
    # Met once, met for good: a later pass does not read the workloads again.
    with store.session() as s:
        gone = s.get(Workload, prep)
        assert gone is not None
        s.delete(gone)
    with store.read() as s:
        deps.sort(s, {train: listed[train]})
    assert not deps.waiting and not deps.never


def test_submit_refuses_what_could_never_start_and_changes_nothing(store: Store) -> None:
    failed = _submit(store, name="flaky")
    _set_state(store, failed, "running", "failed")
    web = int(submission.submit(store, parse_workload_spec({"kind": "service", "commands": ["serve"]}))["id"])
    refusals = [
        ([failed], "after[0]", "failed, and this one was to start after it succeeded"),
        ([f"started:{web}", 99], "after[1].workload", "no workload with id 99"),
        ([f"afterok:{2**64}"], "after[0].workload", f"no workload with id {2**64}"),  # past a 64-bit column
        ([f"succeeded:{web}"], "after[0].when", "is a service"),
        ([f"failed:{web}"], "after[0].when", "is a service"),
    ]
    with store.read() as s:
        before = s.query(Workload).count()
    for after, field, said in refusals:
        with pytest.raises(Invalid) as caught:
            _submit(store, after=after)
        assert caught.value.field == field and said in caught.value.message, caught.value.message
    with store.read() as s:
        assert s.query(Workload).count() == before
    assert _submit(store, after=[f"ended:{failed}", f"started:{web}"]) > 0


def test_an_array_is_waited_for_as_a_whole() -> None:
    def array(*tasks: tuple[str, bool]) -> Facts:
        return Facts("sweep", "job", tasks[0][0], tasks[0][1], tasks=tasks)

    running = array(("succeeded", True), ("running", True), ("pending", False))
    conditions = ("succeeded", "failed", "ended", "started")
    assert [verdict(w, running) for w in conditions] == [None] * 4
    done = array(("succeeded", True), ("succeeded", True))
    assert [verdict(w, done) for w in conditions] == [True, False, True, True]
    one_failed = array(("failed", True), ("running", True))
    assert verdict("succeeded", one_failed) is False  # it can no longer all succeed
    assert verdict("failed", one_failed) is None  # afternotok: once every task has ended
    assert verdict("failed", array(("failed", True), ("succeeded", True))) is True
    never_started = array(("cancelled", False), ("running", True))
    assert verdict("started", never_started) is False
    assert running.summary() == "its tasks: 1 pending, 1 running, 1 succeeded"
