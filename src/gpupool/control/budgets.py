"""Queue budgets: GPU-hours a queue, with the queues below it, may use per calendar day, week or month
(UTC), the queue spec's `budget`. Slurm's GrpTRESMins on an association, renewed each period.

Once a budget is used, the pending work of its queue and of every queue below it waits, with the reason
code `budget`, until the next period begins or an admin raises the budget. Running work goes on (it may
take the queue past its budget: what it holds counts as it runs), unless the budget says `when_spent:
stop` (as Slurm's GrpTRESMins ends running jobs): then each pass asks that tree's running work that holds
GPUs to stop (`Budgets.stop_spent`), the stop written down before any signal, as `gpupool requeue` does;
the observe phase stops it (SIGTERM, SIGKILL after its grace period; control/observe.py) and sends it back
to pending, using no restart, where the budget keeps it waiting as it keeps new work. The hours are
counted as `gpupool usage` counts them (control/accounting.py): every attempt's GPUs from start to end,
fractions as fractions. Each pass of the loop asks (`Budgets.look`); the hours are counted again at most
every REFRESH seconds, and at once when a budget is changed or a period begins. A count reads only the
attempts that may have changed since the last (`accounting.Tally`: those running and those that ended
lately); the whole period is read again every FULL_RECOUNT seconds. A count is never made more often than
COST_SPACING times what the last one took, so that counting takes at most 1/COST_SPACING of the loop's
time even on a store too big for that.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.accounting import Tally
from gpupool.control.lifecycle import RUNNING, note, running_unstopped
from gpupool.control.usage import attempt_gpus
from gpupool.scheduler import Explanation
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Queue, Workload

log = logging.getLogger("gpupool.control")

BUDGET: Final = "budget"  # the reason code of work held back by a used budget
# The stop reason of running work stopped by a used budget that says `when_spent: stop` (control/observe.py
# stops it and sends it back to pending), and the actor its history names.
STOP_BUDGET: Final = BUDGET
STOP: Final = "stop"  # the `when_spent` that stops running work
REFRESH: Final = 10.0  # seconds a count of the hours used serves, at least
COST_SPACING: Final = 50.0  # a count serves at least this many times what it took
FULL_RECOUNT: Final = 3600.0  # seconds between counts of a whole period


def period_bounds(period: str, now: datetime) -> tuple[datetime, datetime]:
    """The calendar period (UTC) that holds `now`: a day, a week from Monday, or a month."""
    day = datetime(now.year, now.month, now.day, tzinfo=UTC)
    if period == "day":
        return day, day + timedelta(days=1)
    if period == "week":
        monday = day - timedelta(days=day.weekday())
        return monday, monday + timedelta(days=7)
    first = datetime(now.year, now.month, 1, tzinfo=UTC)
    following = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=UTC)
    return first, following


def hours(value: float) -> str:
    """GPU-hours in words: 1,234.5, 12.3, 0.00213."""
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def period_name(period: str, start: datetime) -> str:
    if period == "day":
        return start.date().isoformat()
    if period == "week":
        return f"the week of {start.date().isoformat()}"
    return start.strftime("%Y-%m")


@dataclass(frozen=True, slots=True)
class BudgetState:
    """One queue's budget in the current period, and the GPU-hours its tree used in it."""

    queue: str
    gpu_hours: float
    period: str
    start: datetime
    end: datetime
    used: float
    when_spent: str = "wait"  # the spec's: wait (running work goes on) or stop

    @property
    def spent(self) -> bool:
        return self.used >= self.gpu_hours

    @property
    def stops(self) -> bool:
        """Used, and says that the running work of its tree stops."""
        return self.spent and self.when_spent == STOP

    def view(self) -> dict[str, Any]:
        """As the API shows it on the queue."""
        return {
            "gpu_hours": self.gpu_hours,
            "period": self.period,
            "used_gpu_hours": round(self.used, 6),
            "from": self.start.isoformat(),
            "until": self.end.isoformat(),
            "spent": self.spent,
            "when_spent": self.when_spent,
        }

    def explanation(self) -> Explanation:
        waits = "its work" if self.when_spent == STOP else "new work"
        return Explanation(
            BUDGET,
            f"queue {self.queue} used {hours(self.used)} of its {self.gpu_hours:,g} GPU-hour budget for "
            f"{period_name(self.period, self.start)}: {waits} waits until {self.end:%Y-%m-%d %H:%M} UTC, "
            f"or an admin raises it (`gpupool queue update {self.queue} --budget N/{self.period}`)",
        )

    def used_up(self) -> str:
        """Why its tree's running work is stopped: "queue nlp's budget of 200 GPU-hours for the week of
        2026-12-07 is used"."""
        return (
            f"queue {self.queue}'s budget of {self.gpu_hours:,g} GPU-hours for "
            f"{period_name(self.period, self.start)} is used"
        )

    def stopping(self) -> str:
        """What a running workload's history says when the budget asks it to stop."""
        return (
            f"{self.used_up()} ({hours(self.used)} GPU-hours; when_spent: stop): stopping it, to wait "
            f"pending until {self.end:%Y-%m-%d %H:%M} UTC or until an admin raises the budget "
            f"(`gpupool queue update {self.queue} --budget N/{self.period}`); no restart used"
        )


class Budgets:
    """The budgets of the last look (`state`, by queue) and what that look counted."""

    def __init__(self, timer: Callable[[], float] = time.perf_counter) -> None:
        self.state: dict[str, BudgetState] = {}
        self._timer = timer
        self.serves = REFRESH  # seconds the last count serves (longer when counting took long)
        self._counted_at = float("-inf")
        self._tallies: dict[datetime, tuple[float, Tally]] = {}  # period start -> (begun at, its tally)
        self._asked: tuple[tuple[str, float, str, str], ...] = ()
        self._ends = float("inf")  # when the earliest period counted ends (timestamp)
        self._stopped: dict[str, BudgetState] | None = None  # the state `stop_spent` last carried out

    def look(self, s: Session, queues: Sequence[Queue], now: float) -> dict[str, BudgetState]:
        """Each budgeted queue's state now (counted again when REFRESH has passed, a budget changed, or a
        period ended)."""
        asked = tuple(sorted(_budgets(queues)))
        if not asked:
            self.state, self._asked = {}, ()
            return self.state
        if asked == self._asked and now < self._counted_at + self.serves and now < self._ends:
            return self.state
        began = self._timer()
        when = datetime.fromtimestamp(now, UTC)
        parents = {q.name: q.parent for q in queues}
        counted: dict[datetime, dict[str, float]] = {}  # period start -> GPU-hours by queue
        state: dict[str, BudgetState] = {}
        for name, gpu_hours, period, when_spent in asked:
            start, end = period_bounds(period, when)
            hours = counted.get(start)
            if hours is None:
                hours = counted[start] = self._tally(start, now).count(s, when)
            used = sum(h for queue, h in hours.items() if name in chain(queue, parents))
            state[name] = BudgetState(name, gpu_hours, period, start, end, used, when_spent)
        self.state, self._asked, self._counted_at = state, asked, now
        self._ends = min(b.end.timestamp() for b in state.values())
        self.serves = max(REFRESH, COST_SPACING * (self._timer() - began))
        self._tallies = {start: kept for start, kept in self._tallies.items() if start in counted}
        return state

    def stop_spent(self, store: Store) -> list[int]:
        """Ask the running work that holds GPUs in the tree of each used budget that says `when_spent:
        stop` (as the last look counted it) to stop: its stop reason and why are written down here, the
        signals are the observe phase's (SIGTERM, SIGKILL after its grace period), which then sends it back
        to pending. Work already stopping (cancelled, held, requeued, evicted, drained) is left as it is.
        Once per count: while a budget stays used, no work of its tree starts. Returns the ids of the
        workloads asked."""
        state = self.state
        stops = {name: b for name, b in state.items() if b.stops}
        if not stops or state is self._stopped:
            return []
        with store.read() as s:
            parents: dict[str, str | None] = {
                name: parent for name, parent in s.execute(select(Queue.name, Queue.parent))
            }
            tree = blocked(stops, parents, parents)  # each queue under a budget that stops: the nearest one
            rows = s.execute(
                select(Attempt.id, Workload.queue, Attempt.gpu_indices, Attempt.gpu_fraction, Attempt.pods)
                .join(Workload, Attempt.workload_id == Workload.id)
                .where(*running_unstopped(), Workload.queue.in_(list(tree)))
            ).all()
        # Work holding no GPU spends no GPU-hours: it runs on.
        due = [
            (row.id, tree[row.queue])
            for row in rows
            if attempt_gpus(row.gpu_indices, row.gpu_fraction, row.pods)
        ]
        asked: list[int] = []
        if not due:
            self._stopped = state
            return asked
        with store.session() as s:
            for attempt_id, budget in due:
                attempt = s.get(Attempt, attempt_id)
                if attempt is None or attempt.state != RUNNING or attempt.stop_requested_at is not None:
                    continue
                if attempt.stop_reason or attempt.workload.cancel_requested:  # since it was read
                    continue
                attempt.stop_reason, attempt.reason = STOP_BUDGET, budget.used_up()
                note(s, attempt.workload, budget.stopping(), actor=BUDGET)
                asked.append(attempt.workload_id)
                log.info(
                    "event=budget_stop workload=%d attempt=%d budget=%s used=%.6g gpu_hours=%g",
                    attempt.workload_id, attempt.number, budget.queue, budget.used, budget.gpu_hours,
                )  # fmt: skip
        self._stopped = state
        return asked

    def _tally(self, start: datetime, now: float) -> Tally:
        """The running count of the period from `start`: begun afresh every FULL_RECOUNT seconds."""
        kept = self._tallies.get(start)
        if kept is None or now >= kept[0] + FULL_RECOUNT or now < kept[0]:
            kept = self._tallies[start] = (now, Tally(start))
        return kept[1]


def _budgets(queues: Iterable[Queue]) -> Iterable[tuple[str, float, str, str]]:
    for q in queues:
        budget = (q.spec or {}).get("budget")
        if isinstance(budget, Mapping) and budget.get("gpu_hours"):
            period, when_spent = str(budget.get("period") or "month"), str(budget.get("when_spent") or "wait")
            yield q.name, float(budget["gpu_hours"]), period, when_spent


def chain(queue: str, parents: Mapping[str, str | None]) -> list[str]:
    """`queue` and its ancestors, nearest first (a queue that no longer exists: itself alone)."""
    found = [queue]
    parent = parents.get(queue)
    while parent is not None and parent not in found:
        found.append(parent)
        parent = parents.get(parent)
    return found


def blocked(
    state: Mapping[str, BudgetState], parents: Mapping[str, str | None], queues: Iterable[str]
) -> dict[str, BudgetState]:
    """Of `queues`, those whose own budget or an ancestor's is used, each with the nearest such budget."""
    spent = {name: b for name, b in state.items() if b.spent}
    found: dict[str, BudgetState] = {}
    if not spent:
        return found
    for queue in queues:
        for level in chain(queue, parents):
            if level in spent:
                found[queue] = spent[level]
                break
    return found


def spent_warning(store: Store, state: Mapping[str, BudgetState], queue: str, workload_id: int) -> list[str]:
    """What to tell a submitter to a queue whose budget (or an ancestor's) the last count found used: the
    work is kept, and waits pending until the next period or a raised budget (said at once, as the
    scheduler's reason would say it a moment later)."""
    if not any(b.spent for b in state.values()):
        return []
    budget = blocked(state, queue_parents(store), [queue]).get(queue)
    if budget is None:
        return []
    return [f"budget: {budget.explanation().message}; or `gpupool cancel {workload_id}`"]


def queue_parents(store: Store) -> dict[str, str | None]:
    """Each queue's parent (None: a top-level queue)."""
    with store.read() as s:
        return {name: parent for name, parent in s.execute(select(Queue.name, Queue.parent))}


def spent_above(
    state: Mapping[str, BudgetState], parents: Mapping[str, str | None], queue: str
) -> dict[str, Any] | None:
    """The used budget of an ancestor of `queue` that holds back its new work (its own aside: the queue
    shows that one), as the API shows a budget, with whose it is; None when there is none."""
    budget = blocked(state, parents, [queue]).get(queue)
    if budget is None or budget.queue == queue:
        return None
    return {"queue": budget.queue, **budget.view()}
