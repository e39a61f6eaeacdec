"""Queue budgets: GPU-hours a queue, with the queues below it, may use per calendar day, week or month
(UTC), the queue spec's `budget`. Slurm's GrpTRESMins on an association, renewed each period.

Once a budget is used, the pending work of its queue and of every queue below it waits, with the reason
code `budget`, until the next period begins or an admin raises the budget; running work goes on (it may
take the queue past its budget: what it holds counts as it runs). The hours are counted as `gpupool
usage` counts them (control/accounting.py): every attempt's GPUs from start to end, fractions as
fractions. Each pass of the loop asks (`Budgets.look`); the hours are counted again at most every
REFRESH seconds, and at once when a budget is changed or a period begins. A count reads only the attempts
that may have changed since the last (`accounting.Tally`: those running and those that ended lately); the
whole period is read again every FULL_RECOUNT seconds. A count is never made more often than
COST_SPACING times what the last one took, so that counting takes at most 1/COST_SPACING of the loop's
time even on a store too big for that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from sqlalchemy.orm import Session

from gpupool.control.accounting import Tally
from gpupool.scheduler import Explanation
from gpupool.store.models import Queue

BUDGET: Final = "budget"  # the reason code of work held back by a used budget
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

    @property
    def spent(self) -> bool:
        return self.used >= self.gpu_hours

    def view(self) -> dict[str, Any]:
        """As the API shows it on the queue."""
        return {
            "gpu_hours": self.gpu_hours,
            "period": self.period,
            "used_gpu_hours": round(self.used, 6),
            "from": self.start.isoformat(),
            "until": self.end.isoformat(),
            "spent": self.spent,
        }

    def explanation(self) -> Explanation:
        return Explanation(
            BUDGET,
            f"queue {self.queue} used {hours(self.used)} of its {self.gpu_hours:,g} GPU-hour budget for "
            f"{period_name(self.period, self.start)}: new work waits until {self.end:%Y-%m-%d %H:%M} UTC, "
            f"or an admin raises it (`gpupool queue update {self.queue} --budget N/{self.period}`)",
        )


class Budgets:
    """The budgets of the last look (`state`, by queue) and what that look counted."""

    def __init__(self, timer: Callable[[], float] = time.perf_counter) -> None:
        self.state: dict[str, BudgetState] = {}
        self._timer = timer
        self.serves = REFRESH  # seconds the last count serves (longer when counting took long)
        self._counted_at = float("-inf")
        self._tallies: dict[datetime, tuple[float, Tally]] = {}  # period start -> (begun at, its tally)
        self._asked: tuple[tuple[str, float, str], ...] = ()
        self._ends = float("inf")  # when the earliest period counted ends (timestamp)

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
        for name, gpu_hours, period in asked:
            start, end = period_bounds(period, when)
            hours = counted.get(start)
            if hours is None:
                hours = counted[start] = self._tally(start, now).count(s, when)
            used = sum(h for queue, h in hours.items() if name in chain(queue, parents))
            state[name] = BudgetState(name, gpu_hours, period, start, end, used)
        self.state, self._asked, self._counted_at = state, asked, now
        self._ends = min(b.end.timestamp() for b in state.values())
        self.serves = max(REFRESH, COST_SPACING * (self._timer() - began))
        self._tallies = {start: kept for start, kept in self._tallies.items() if start in counted}
        return state

    def _tally(self, start: datetime, now: float) -> Tally:
        """The running count of the period from `start`: begun afresh every FULL_RECOUNT seconds."""
        kept = self._tallies.get(start)
        if kept is None or now >= kept[0] + FULL_RECOUNT or now < kept[0]:
            kept = self._tallies[start] = (now, Tally(start))
        return kept[1]


def _budgets(queues: Iterable[Queue]) -> Iterable[tuple[str, float, str]]:
    for q in queues:
        budget = (q.spec or {}).get("budget")
        if isinstance(budget, Mapping) and budget.get("gpu_hours"):
            yield q.name, float(budget["gpu_hours"]), str(budget.get("period") or "month")


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
