"""Queue budgets (control/budgets.py) on a real SQLite store: the calendar periods, what a budget counts
(its queue and the queues below it, in its period only), and which queues' work waits."""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from gpupool.backends.base import Handle, Launch
from gpupool.backends.local import LocalBackend
from gpupool.control import changes, queues, workloads
from gpupool.control.accounting import Tally, gpu_hours_by_queue
from gpupool.control.budgets import (
    BUDGET,
    COST_SPACING,
    REFRESH,
    STOP_BUDGET,
    Budgets,
    BudgetState,
    blocked,
    period_bounds,
)
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.spec import parse_queue_spec
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Queue, Workload
from gpupool.timeutil import utcnow
from tests.support.store import submit_running

NOW = datetime(2026, 12, 31, 22, 0, tzinfo=UTC)  # a Thursday
H = timedelta(hours=1)
NODE = "head"


@pytest.mark.parametrize(
    ("period", "start", "end"),
    [
        ("day", datetime(2026, 12, 31, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
        ("week", datetime(2026, 12, 28, tzinfo=UTC), datetime(2027, 1, 4, tzinfo=UTC)),
        ("month", datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
    ],
)
def test_periods_are_calendar_periods_in_utc(period: str, start: datetime, end: datetime) -> None:
    assert period_bounds(period, NOW) == (start, end)
    assert period_bounds("month", datetime(2027, 2, 10, tzinfo=UTC))[1] == datetime(2027, 3, 1, tzinfo=UTC)


def _queue(store: Store, **spec: object) -> None:
    queues.create_queue(store, parse_queue_spec(spec))


def _used(store: Store, queue: str, start: datetime, hours: float, gpus: int = 1) -> None:
    with store.session() as s:
        workload = Workload(name="w", queue=queue, user="admin", spec={}, state="succeeded", version=1)
        s.add(workload)
        s.flush()
        s.add(
            Attempt(
                workload_id=workload.id, queue=queue, number=0, state="succeeded", node_name="a",
                gpu_indices=list(range(gpus)), gpu_fraction=1.0, pods=[],
                started_at=start, finished_at=start + hours * H,
            )
        )  # fmt: skip


def _look(store: Store, budgets: Budgets, now: datetime = NOW) -> dict[str, BudgetState]:
    with store.read() as s:
        return dict(budgets.look(s, s.scalars(select(Queue)).all(), now.timestamp()))


def test_a_budget_counts_its_tree_in_its_period_and_blocks_the_tree(store: Store) -> None:
    _queue(store, name="research", budget={"gpu_hours": 100, "period": "month"})
    _queue(store, name="nlp", parent="research", budget={"gpu_hours": 10, "period": "day"})
    _queue(store, name="cv", parent="research")
    _used(store, "nlp", NOW - 3 * H, 2, gpus=4)  # 8 GPU-hours today
    _used(store, "nlp", NOW - 48 * H, 1, gpus=8)  # 8 this month, not today
    _used(store, "cv", NOW - 10 * 24 * H, 10, gpus=8)  # 80 this month
    _used(store, "cv", NOW - 40 * 24 * H, 10, gpus=8)  # last month: not counted

    budgets = Budgets()
    assert set(_look(store, budgets)) == {"research", "nlp"}
    assert budgets.state["nlp"].used == pytest.approx(8.0) and not budgets.state["nlp"].spent
    assert budgets.state["research"].used == pytest.approx(96.0) and not budgets.state["research"].spent
    parents = {"research": None, "nlp": "research", "cv": "research", "default": None}
    assert blocked(budgets.state, parents, ["nlp", "cv", "default"]) == {}

    _used(store, "cv", NOW - 5 * H, 1, gpus=4)  # research reaches 100
    assert _look(store, budgets)["research"].used == pytest.approx(96.0)
    later = NOW + timedelta(seconds=REFRESH)
    assert _look(store, budgets, later)["research"].used == pytest.approx(100.0)
    out = blocked(budgets.state, parents, ["nlp", "cv", "default"])
    assert set(out) == {"nlp", "cv"} and out["cv"].queue == "research"
    why = out["nlp"].explanation()
    assert why.code == BUDGET
    assert why.message.startswith("queue research used 100.0 of its 100 GPU-hour budget for 2026-12: ")
    assert "new work waits until 2027-01-01 00:00 UTC" in why.message


def test_a_changed_budget_or_a_new_period_is_counted_at_once(store: Store) -> None:
    _queue(store, name="nlp", budget={"gpu_hours": 4, "period": "day"})
    _used(store, "nlp", NOW - 2 * H, 1, gpus=4)
    budgets = Budgets()
    assert _look(store, budgets)["nlp"].spent
    queues.update_queue(
        store, "nlp", lambda spec: parse_queue_spec({**spec, "budget": {"gpu_hours": 8, "period": "day"}})
    )
    assert not _look(store, budgets)["nlp"].spent
    _used(store, "nlp", NOW - 1 * H, 1, gpus=4)
    assert _look(store, budgets)["nlp"].used == pytest.approx(4.0)  # cached
    tomorrow = NOW + 2.5 * H  # past midnight: a new day, counted afresh within REFRESH
    assert _look(store, budgets, tomorrow)["nlp"].used == 0.0


def test_a_count_that_took_long_is_spaced_further(store: Store) -> None:
    """Counting every attempt of a month on a big store takes time: the next count waits COST_SPACING times
    as long (here the timer says each count took 1 s), so it takes at most 2% of the loop's time."""
    _queue(store, name="nlp", budget={"gpu_hours": 100, "period": "month"})
    ticks = iter(range(1000))
    budgets = Budgets(timer=lambda: float(next(ticks)))
    assert _look(store, budgets)["nlp"].used == 0.0
    assert budgets.serves == COST_SPACING * 1.0
    _used(store, "nlp", NOW - 3 * H, 2, gpus=4)
    assert _look(store, budgets, NOW + timedelta(seconds=REFRESH * 2))["nlp"].used == 0.0  # still served
    assert _look(store, budgets, NOW + timedelta(seconds=COST_SPACING))["nlp"].used == pytest.approx(8.0)


def test_a_tally_reads_only_what_changed_and_equals_a_whole_count(store: Store) -> None:
    """`accounting.Tally` against `gpu_hours_by_queue` after each change: running work counted as it runs,
    an end recorded late (within LAG), an attempt written already ended, a finished one read again and
    not counted twice, work from before the period cut at its start."""
    since = NOW - 24 * H

    def attempt(queue: str, start: datetime, end: datetime | None, gpus: int = 1) -> int:
        with store.session() as s:
            workload = Workload(name="w", queue=queue, user="u", spec={}, state="running", version=1)
            s.add(workload)
            s.flush()
            row = Attempt(
                workload_id=workload.id, queue=queue,
                number=0, state="running" if end is None else "succeeded",
                node_name="a", gpu_indices=list(range(gpus)), gpu_fraction=1.0, pods=[],
                started_at=start, finished_at=end,
            )  # fmt: skip
            s.add(row)
            s.flush()
            return row.id

    def end(attempt_id: int, at: datetime) -> None:
        with store.session() as s:
            row = s.get(Attempt, attempt_id)
            assert row is not None
            row.state, row.finished_at = "succeeded", at

    tally = Tally(since)

    def same(now: datetime) -> dict[str, float]:
        with store.read() as s:
            counted = tally.count(s, now)
            whole = gpu_hours_by_queue(s, since, now, now)
        assert counted.keys() == whole.keys() and all(counted[q] == pytest.approx(whole[q]) for q in whole)
        return counted

    early = attempt("nlp", since - 2 * H, None, gpus=2)  # began before the period
    attempt("cv", since - 5 * H, since - H)  # ended before it: never counted
    attempt("cv", since + H, since + 3 * H, gpus=4)
    t1 = NOW - 6 * H
    assert same(t1) == pytest.approx({"nlp": 2 * 18.0, "cv": 8.0})
    end(early, t1 + 0.5 * H)  # recorded at the next count: late, but within LAG
    attempt("cv", t1 - 4 * H, t1 - 3 * H, gpus=8)  # written already ended, hours in the past
    t2 = t1 + 2 * H
    assert same(t2) == pytest.approx({"nlp": 2 * 18.5, "cv": 16.0})
    running = attempt("cv", t2 - 0.5 * H, None)
    for later in (t2 + H, t2 + 2 * H, t2 + 3 * H):  # finished ones read again are not counted twice
        same(later)
    end(running, t2 + 3 * H)
    assert same(t2 + 4 * H)["cv"] == pytest.approx(16.0 + 3.5)
    assert len(tally.counted) <= 2  # what the query no longer reads is forgotten


def _running_process(
    store: Store, backend: LocalBackend, folder: Path, queue: str, **spec: object
) -> tuple[int, Handle]:
    """A workload of `queue` running `sleep 60` as a real process, begun a minute ago as its attempt says."""
    folder.mkdir()
    handle = backend.start(
        Launch(
            attempt_id=0, workload_id=0, attempt_number=0, script="exec sleep 60\n", env=dict(os.environ),
            workdir=folder, run_dir=folder / "run", log_path=folder / "attempt.log",
        )
    )  # fmt: skip
    wid = submit_running(
        store, {"queue": queue, "commands": ["sleep 60"], "resources": {"gpu": 1}, **spec}, node=NODE,
        gpu_indices=[0], run_dir=str(folder / "run"), pid=handle.pid, pid_start_time=handle.start_time,
        pid_boot_id=handle.boot, started_at=utcnow() - timedelta(minutes=1),
    )  # fmt: skip
    return wid, handle


def _attempt(store: Store, wid: int) -> Attempt:
    with store.read() as s:
        attempt = s.scalar(select(Attempt).where(Attempt.workload_id == wid).order_by(Attempt.number))
        assert attempt is not None
        s.expunge(attempt)
        return attempt


def test_a_spent_budget_that_says_stop_stops_its_trees_running_work_through_a_head_restart(
    tmp_path: Path, store: Store
) -> None:
    """`when_spent: stop` (an ancestor's too): the stop of each running workload that holds GPUs is written
    down first, with the budget's words and the actor `budget`, and no signal; a head that starts after
    that (its Budgets never counted) carries it out; the work goes back to pending with no restart used.
    Work under a budget that says wait, work without GPUs and work stopping already are left as they are;
    nothing is asked twice."""
    _queue(store, name="lab", budget={"gpu_hours": 0.001, "period": "day", "when_spent": "stop"})
    _queue(store, name="nlp", parent="lab", budget={"gpu_hours": 1000, "period": "day"})  # wait, unspent
    _queue(store, name="cv", budget={"gpu_hours": 0.001, "period": "day"})  # spent, but it says wait
    backend = LocalBackend()
    stopped, _ = _running_process(store, backend, tmp_path / "a", "nlp", checkpoint={"dir": "./ckpt"})
    goes_on, left = _running_process(store, backend, tmp_path / "b", "cv")
    no_gpu = submit_running(store, {"queue": "lab", "commands": ["true"]}, node=NODE, gpu_indices=[])
    one_gpu = {"queue": "nlp", "commands": ["true"], "resources": {"gpu": 1}}
    cancelled = submit_running(
        store, one_gpu, node=NODE, gpu_indices=[1], started_at=utcnow() - timedelta(minutes=1)
    )
    changes.cancel(store, cancelled)

    budgets, now = Budgets(), datetime.now(UTC)
    state = _look(store, budgets, now)
    assert state["lab"].stops and state["cv"].spent and not state["cv"].stops
    assert state["lab"].view()["when_spent"] == "stop"
    assert budgets.stop_spent(store) == [stopped]
    assert budgets.stop_spent(store) == []  # once per count
    another = Budgets()  # another head's count, or the next: nothing is asked twice
    _look(store, another, now)
    assert another.stop_spent(store) == []
    first = _attempt(store, stopped)
    assert (first.stop_reason, first.stop_requested_at) == (STOP_BUDGET, None)  # on record, no signal yet
    assert first.reason.startswith("queue lab's budget of 0.001 GPU-hours for 20"), first.reason
    assert first.reason.endswith(" is used"), first.reason
    assert _attempt(store, goes_on).stop_reason == "" and _attempt(store, no_gpu).stop_reason == ""
    assert _attempt(store, cancelled).stop_reason == ""  # the cancel stops it, as it was asked
    shown = workloads.get_workload(store, stopped)
    assert shown["reason_code"] == "stopping" and shown["reason"].startswith(f"stopping ({first.reason})")
    said = shown["events"][-1]
    assert said["actor"] == "budget" and said["reason"].startswith(first.reason + " (0.0")
    assert "when_spent: stop): stopping it, to wait pending until 20" in said["reason"]

    # the head died before its observe: the next one sends the SIGTERM and settles the work
    head = Reconciler(store, backend, None, ControlSettings(home=tmp_path, node_name=NODE))
    head.recover()
    head.observe(time.time())
    assert _attempt(store, stopped).stop_requested_at is not None
    deadline = time.time() + 10
    while (done := workloads.get_workload(store, stopped))["state"] == "running":
        assert time.time() < deadline, done
        time.sleep(0.05)
        head.observe(time.time())
    assert done["state"] == "pending" and done["restarts"] == 0, done
    last = done["events"][-1]
    assert last["actor"] == "budget", last
    assert last["reason"].startswith(f"stopped: {first.reason}; it waits pending"), last
    assert last["reason"].endswith("with no restart used (it resumes from its checkpoint)"), last
    ended = _attempt(store, stopped)
    assert ended.state == "evicted" and ended.reason == f"{first.reason}; exit code 143", ended.reason
    assert workloads.get_workload(store, goes_on)["state"] == "running"
    backend.signal(left, signal.SIGKILL)
