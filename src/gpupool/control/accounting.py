"""GPU-hours and what they cost, per queue, user, workload, node, GPU model, day or attempt outcome, over a
window of time: `gpupool usage` and `GET /api/v1/usage` (docs/user-guide.md#usage-and-cost).

Counted from the attempts in the store. Each pod of an attempt holds its GPUs (a fraction of a GPU counts
as that fraction) from the attempt's start to its end, or until now while it runs; the part of that span
inside the window is counted, so a report of last week and one of this week never count an hour twice.
What is counted is what was allocated, as Slurm's `sreport` and Run:ai's consumption reports count it, not
what the programs made of it; beside it, `used_gpu_hours` weighs each attempt's hours by its mean GPU
utilization (control/efficiency.py), over the attempts with GPU telemetry only (`measured_gpu_hours`): an
attempt without any (an old one, a Slurm node's) is left out of both, never counted as idle. A pod's GPU
model is the one recorded when the attempt started (attempts from before gpupool recorded it take the
model its node has now).

A report of some users (`users`) counts only the attempts of their workloads, in every grouping; a name
that never submitted work and holds no token is refused (a typo must not read as "used nothing").

Prices come from `$GPUPOOL_HOME/prices.yaml` (spec/prices.py), read when the server starts. Without the
file the report has GPU-hours and no costs; with it, hours of a model it does not price (and no `default`)
are reported as unpriced, never as free.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from gpupool.control.config_files import parse_file
from gpupool.control.errors import Invalid
from gpupool.control.lifecycle import CANCELLED, EVICTED, FAILED, SUCCEEDED
from gpupool.control.tokens import known_user
from gpupool.gpu.catalog import families, known_models
from gpupool.spec import SpecError, parse_duration
from gpupool.spec.prices import DEFAULT_MODEL, PricesSpec, parse_prices_spec
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Gpu, Node, Queue, Workload
from gpupool.timeutil import as_utc

log = logging.getLogger(__name__)

PRICES_FILE: Final = "prices.yaml"
GROUPS: Final = ("queue", "user", "workload", "node", "model", "day", "outcome")
RUNNING_OUTCOME: Final = "running"
OUTCOMES: Final = (SUCCEEDED, FAILED, CANCELLED, EVICTED, RUNNING_OUTCOME)
UNKNOWN_MODEL: Final = "unknown"
DEFAULT_SPAN: Final = 7 * 86400.0  # a report with no `since` covers the last 7 days
HOUR: Final = 3600.0


class PricesConfigError(ValueError):
    """A price list that cannot be used; the message names the file, the field and the fix."""


def load_prices(home: Path) -> PricesSpec | None:
    """$GPUPOOL_HOME/prices.yaml, or None when there is none (reports then have no costs). A model the GPU
    catalog does not know is taken, with a warning in the log (a typo would leave its GPUs unpriced)."""
    path = home / PRICES_FILE
    if not path.exists():
        return None
    prices = parse_file(path, parse_prices_spec, PricesConfigError)
    for name in unknown_models(prices):
        close = difflib.get_close_matches(name.upper(), [*families(), *known_models()], n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]}?)" if close else ""
        log.warning(
            "event=prices_unknown_model file=%s model=%r: no GPU model of that name is known%s; its price "
            "applies only to GPUs reported under exactly that name",
            path,
            name,
            hint,
        )
    return prices


def unknown_models(prices: PricesSpec) -> list[str]:
    """The models `prices` names that the GPU catalog does not know (`default` aside)."""
    known = {m.lower() for m in (*known_models(), *families(), DEFAULT_MODEL)}
    return [name for name in prices.gpu_hour if name.strip().lower() not in known]


# -- the window ------------------------------------------------------------------------------------------


def window_edge(text: str | None, name: str, *, before: datetime) -> datetime | None:
    """`since`/`until` as given to the API: an ISO 8601 time or date (without a zone, UTC), or a duration
    ("7d", "12h") meaning that long before `before`; None when not given. Invalid (422) names the field."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    dated = text[4:5] == "-"  # 2026-11-01...; anything else that starts with a digit is a duration (1440m)
    if text[0].isdigit() and not dated:
        try:
            return before - timedelta(seconds=parse_duration(text, name))
        except SpecError as exc:
            raise Invalid(
                f"{exc}, or an ISO 8601 time (2026-11-01 or 2026-11-01T08:00:00Z)", field=name, example="7d"
            ) from None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise Invalid(
            f"{name}: {text!r} is neither a time nor a duration; give an ISO 8601 time "
            "(2026-11-01 or 2026-11-01T08:00:00Z) or how long before now (7d, 12h)",
            field=name,
            example="7d",
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def window(since: str | None, until: str | None, now: datetime) -> tuple[datetime, datetime]:
    """The report's window: `until` (default now, and never past now) back to `since` (default 7 days
    before `until`); 422 naming the field when it is empty or starts after now."""
    end = window_edge(until, "until", before=now) or now
    end = min(end, now)
    start = window_edge(since, "since", before=end) or end - timedelta(seconds=DEFAULT_SPAN)
    if start >= now:
        raise Invalid(
            f"since: {start.isoformat()} is not in the past; a report counts what has been used "
            "(e.g. since=7d)",
            field="since",
            example="7d",
        )
    if start >= end:
        raise Invalid(
            f"since: {start.isoformat()} is not before until ({end.isoformat()}); "
            "give since earlier than until",
            field="since",
            example="7d",
        )
    return start, end


# -- the report ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Row:
    """One line of the report as it is summed."""

    gpu_hours: float = 0.0
    cost: float = 0.0
    unpriced_gpu_hours: float = 0.0
    attempts: set[int] = field(default_factory=set)
    workloads: set[int] = field(default_factory=set)
    by_outcome: dict[str, float] = field(default_factory=dict)
    name: str | None = None  # the workload's name, when grouped by workload
    measured_gpu_hours: float = 0.0  # of attempts with GPU telemetry
    used_gpu_hours: float = 0.0  # those hours x their attempt's mean utilization

    def add(
        self,
        hours: float,
        price: float | None,
        attempt: int,
        workload: int,
        outcome: str,
        utilization_pct: float | None = None,
    ) -> None:
        self.gpu_hours += hours
        if utilization_pct is not None:
            self.measured_gpu_hours += hours
            self.used_gpu_hours += hours * utilization_pct / 100.0
        if price is None:
            self.unpriced_gpu_hours += hours
        else:
            self.cost += hours * price
        self.attempts.add(attempt)
        self.workloads.add(workload)
        self.by_outcome[outcome] = self.by_outcome.get(outcome, 0.0) + hours


@dataclass(frozen=True, slots=True)
class _Span:
    """One pod of an attempt, held from `start` to `end` (inside the window)."""

    start: datetime
    end: datetime
    gpus: float
    node: str
    model: str
    attempt: int
    outcome: str
    workload: int
    name: str
    queue: str
    user: str
    utilization_pct: float | None  # the attempt's mean GPU utilization; None: no GPU telemetry


def usage(
    store: Store,
    since: datetime,
    until: datetime,
    *,
    by: str = "queue",
    queue: str | None = None,
    users: Sequence[str] | None = None,
    prices: PricesSpec | None = None,
    now: datetime,
) -> dict[str, Any]:
    """The report: a row per `by` key (GPU-hours, share, cost, attempts, workloads, GPU-hours by how the
    attempts ended), the total, and the pool's capacity over the window; `users`: only their work."""
    if by not in GROUPS:
        raise Invalid(f"by: {by!r} is not one of {', '.join(GROUPS)}", field="by", example="queue")
    if users is not None and not users:
        raise Invalid("user: empty; give a user's name, e.g. user=alice", field="user", example="alice")
    hours = (until - since).total_seconds() / HOUR
    with store.read() as s:
        if queue is not None and not _known_queue(s, queue):
            raise Invalid(
                f"queue: no queue named {queue!r} and no work in one; list them with `gpupool queues`",
                field="queue",
            )
        for name in users or ():
            if not known_user(s, name):
                raise Invalid(
                    f"user: no work was ever submitted by {name!r} and no token has that name; check the "
                    "spelling (`gpupool ps --all` shows who submitted what)",
                    field="user",
                    example="alice",
                )
        models = _models(s)
        pool = _pool_nodes(s)
        capacity = sum(len(gpus) for node, gpus in models.items() if node in pool)  # the pool's GPUs now
        queue_rows = list(s.scalars(select(Queue)))
        quotas = {q.name: gpu_quota(q.spec) for q in queue_rows}
        parents = {q.name: q.parent for q in queue_rows}
        # a queue's report covers the queues under it too, as its budget counts them (a department's)
        queues = None if queue is None else _subtree(s, queue)
        spans = list(_spans(s, since, until, queues, models, now, users=users))
    rows: dict[str, _Row] = {}
    total = _Row()
    for span in spans:
        price = prices.of(span.model) if prices is not None else None
        for key, start, end in _keys(span, by):
            held = span.gpus * (end - start).total_seconds() / HOUR
            row = rows.get(key)
            if row is None:
                row = rows[key] = _Row(name=span.name if by == "workload" else None)
            row.add(held, price, span.attempt, span.workload, span.outcome, span.utilization_pct)
        held = span.gpus * (span.end - span.start).total_seconds() / HOUR
        total.add(held, price, span.attempt, span.workload, span.outcome, span.utilization_pct)
    if by == "queue" and users is None:
        # a queue that used nothing is a line too: its quota went unused (with --queue, those of its tree:
        # a department's own row, with what the queues under it used, is its report's first line)
        for name in quotas if queues is None else queues:
            rows.setdefault(name, _Row())
    below = _below(rows, parents) if by == "queue" else {}
    ordered = _ordered(rows, by)
    priced = prices is not None
    return {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "hours": round(hours, 6),
        "by": by,
        "queue": queue,
        "users": sorted(set(users)) if users is not None else None,
        "currency": prices.currency if priced and prices is not None else None,
        "capacity_gpu_hours": round(capacity * hours, 6),
        "capacity_gpus": capacity,
        "rows": [
            _row_view(
                key,
                row,
                total.gpu_hours,
                priced,
                quotas.get(key) if by == "queue" else None,
                hours,
                below.get(key, 0.0),
            )
            for key, row in ordered
        ],
        "total": _row_view("total", total, total.gpu_hours, priced, None, hours),
    }


def _below(rows: Mapping[str, _Row], parents: Mapping[str, str | None]) -> dict[str, float]:
    """The GPU-hours of the queues under each queue, at any depth (a department's, beside its own row)."""
    below: dict[str, float] = {}
    for key, row in rows.items():
        at, seen = parents.get(key), {key}
        while at is not None and at not in seen:  # a loop in bad data ends the walk
            seen.add(at)
            below[at] = below.get(at, 0.0) + row.gpu_hours
            at = parents.get(at)
    return below


def gpu_hours_by_queue(s: Session, since: datetime, until: datetime, now: datetime) -> dict[str, float]:
    """GPU-hours each queue's attempts held inside the window, as `usage --by queue` counts them."""
    totals: dict[str, float] = {}
    for span in _spans(s, since, until, None, _models(s), now):
        held = span.gpus * (span.end - span.start).total_seconds() / HOUR
        totals[span.queue] = totals.get(span.queue, 0.0) + held
    return totals


def _known_queue(s: Session, queue: str) -> bool:
    """A queue that exists, or did: one that work was submitted to."""
    if s.scalar(select(Queue.id).where(Queue.name == queue)) is not None:
        return True
    return s.scalar(select(Workload.id).where(Workload.queue == queue).limit(1)) is not None


def _models(s: Session) -> dict[str, dict[int, str]]:
    """Each node's GPU models by index, as the store has them now."""
    models: dict[str, dict[int, str]] = {}
    rows = s.execute(select(Node.name, Gpu.index, Gpu.model).join(Gpu, Gpu.node_id == Node.id))
    for node, index, model in rows:
        models.setdefault(node, {})[index] = model
    return models


def _pool_nodes(s: Session) -> set[str]:
    return set(s.scalars(select(Node.name).where(Node.state != "lost")))


def gpu_quota(spec: Mapping[str, Any] | None) -> float:
    """A queue spec's GPU quota (0 where it sets none)."""
    gpu = ((spec or {}).get("resources") or {}).get("gpu")
    if isinstance(gpu, Mapping):
        quota = gpu.get("quota")
        return float(quota) if isinstance(quota, int | float) else 0.0
    return 0.0


_SPAN_COLUMNS: Final = (
    Attempt.id, Attempt.state, Attempt.node_name, Attempt.gpu_indices, Attempt.gpu_fraction,
    Attempt.pods, Attempt.started_at, Attempt.finished_at,
    Workload.id, Workload.name, Attempt.queue, Workload.user, Attempt.gpu_utilization_pct,
    Workload.replica, Workload.array_id, Workload.array_index,
)  # fmt: skip


def _subtree(s: Session, queue: str) -> list[str]:
    """`queue` and every queue under it, at any depth."""
    children: dict[str | None, list[str]] = {}
    for name, parent in s.execute(select(Queue.name, Queue.parent)):
        children.setdefault(parent, []).append(name)
    found, frontier = [queue], [queue]
    while frontier:
        below = [c for q in frontier for c in children.get(q, ()) if c not in found]
        found += below
        frontier = below
    return found


def _spans(
    s: Session,
    since: datetime,
    until: datetime,
    queues: list[str] | None,
    models: dict[str, dict[int, str]],
    now: datetime,
    *,
    users: Sequence[str] | None = None,
) -> Iterator[_Span]:
    """Every pod of every attempt that held GPUs inside the window, cut to it (of `queues` and of `users`
    only, if given)."""
    query = (
        select(*_SPAN_COLUMNS)
        .join(Workload, Attempt.workload_id == Workload.id)
        .where(Attempt.started_at < until, or_(Attempt.finished_at.is_(None), Attempt.finished_at > since))
        .order_by(Attempt.id)
    )
    if queues is not None:
        query = query.where(Attempt.queue.in_(queues))  # where its GPU-hours were spent (work may move)
    if users is not None:
        query = query.where(Workload.user.in_(list(users)))
    for row in s.execute(query):
        yield from _row_spans(row, since, until, models, now)


def _row_spans(
    row: Any, since: datetime, until: datetime, models: dict[str, dict[int, str]], now: datetime
) -> Iterator[_Span]:
    """The pods of one attempt (a row of _SPAN_COLUMNS) that held GPUs inside the window, cut to it."""
    attempt_id, state, node, indices, fraction, pods, started, finished, wid, name, wqueue, user, util = row[
        :13
    ]
    replica, array_id, array_index = row[13:]
    if array_id is not None:  # as `gpupool ps` names a job array's task and a service's replica
        name = f"{name}[{array_index}]"
    elif replica:
        name = f"{name}#{replica}"
    began, ended = as_utc(started), as_utc(finished)
    if began is None:
        return
    start, end = max(began, since), min(ended or now, until)
    if end <= start:
        return
    outcome = state if state in OUTCOMES else RUNNING_OUTCOME
    for pod in pods or [{"node": node, "gpu_indices": indices, "gpu_fraction": fraction}]:
        held = list(pod.get("gpu_indices") or ())
        gpus = len(held) * (pod.get("gpu_fraction") or 1.0)
        if gpus <= 0:
            continue
        pod_node = str(pod.get("node") or node)
        model = pod.get("model") or models.get(pod_node, {}).get(held[0]) or UNKNOWN_MODEL
        yield _Span(
            start, end, gpus, pod_node, str(model), attempt_id, outcome, wid, name, wqueue, user, util
        )


class Tally:
    """GPU-hours by queue from `since` on, counted again and again (a budget's period, control/budgets.py),
    each count reading only the attempts that may have changed since the last: those running, those that
    ended after the last count's time less LAG (an end the control loop recorded after the fact), and
    those written since the count before last (by id: a row inserted already ended; two counts back, so
    that on PostgreSQL a transaction that took a lower id and committed late is read too). Finished
    attempts' hours are final: kept in `closed`, each counted once. A count equals what
    `gpu_hours_by_queue(s, since, now, now)` gives unless an attempt's end was recorded more than LAG
    after it happened; the caller begins a new Tally now and then (control/budgets.py: every hour)."""

    LAG: Final = timedelta(hours=1)

    def __init__(self, since: datetime) -> None:
        self.since = since
        self.closed: dict[str, float] = {}
        self.mark = since  # every attempt that ended by then is in `closed` (or was written after)
        self.counted: dict[int, datetime] = {}  # in `closed` and still read by the query: id -> its end
        self.newest: list[int] = []  # the newest attempt id at each of the last two counts

    def count(self, s: Session, now: datetime) -> dict[str, float]:
        recent = or_(Attempt.finished_at.is_(None), Attempt.finished_at > self.mark)
        floor = self.newest[0] if self.newest else None
        query = (
            select(*_SPAN_COLUMNS)
            .join(Workload, Attempt.workload_id == Workload.id)
            .where(Attempt.started_at < now, recent if floor is None else or_(recent, Attempt.id > floor))
        )
        newest = int(s.scalar(select(func.max(Attempt.id))) or 0)
        models = _models(s)
        running: dict[str, float] = {}
        for row in s.execute(query):
            ended = as_utc(row[7])
            over = ended if ended is not None and ended <= now else None  # its end, when it is final
            if over is not None and row[0] in self.counted:
                continue
            totals = self.closed if over is not None else running
            for span in _row_spans(row, self.since, now, models, now):
                held = span.gpus * (span.end - span.start).total_seconds() / HOUR
                totals[span.queue] = totals.get(span.queue, 0.0) + held
            if over is not None:
                self.counted[row[0]] = over
        self.newest = [*self.newest, newest][-2:]
        self.mark = max(self.since, now - self.LAG)
        floor = self.newest[0]
        self.counted = {i: end for i, end in self.counted.items() if end > self.mark or i > floor}
        return {q: self.closed.get(q, 0.0) + running.get(q, 0.0) for q in {*self.closed, *running}}


def _keys(span: _Span, by: str) -> Iterator[tuple[str, datetime, datetime]]:
    """The report's key(s) for a span, with the part of the span each takes (days split at UTC midnight)."""
    if by == "day":
        start = span.start
        while start < span.end:
            midnight = datetime(start.year, start.month, start.day, tzinfo=UTC) + timedelta(days=1)
            end = min(midnight, span.end)
            yield start.date().isoformat(), start, end
            start = end
        return
    key = {
        "queue": span.queue,
        "user": span.user,
        "workload": str(span.workload),
        "node": span.node,
        "model": span.model,
        "outcome": span.outcome,
    }[by]
    yield key, span.start, span.end


def _ordered(rows: dict[str, _Row], by: str) -> list[tuple[str, _Row]]:
    if by == "day":
        return sorted(rows.items())
    if by == "outcome":
        return sorted(rows.items(), key=lambda item: OUTCOMES.index(item[0]))
    return sorted(rows.items(), key=lambda item: (-item[1].gpu_hours, item[0]))


def _all_unpriced(row: _Row) -> bool:
    return row.gpu_hours > 0 and row.unpriced_gpu_hours >= row.gpu_hours - 1e-9


def _row_view(
    key: str, row: _Row, total: float, priced: bool, quota: float | None, hours: float, below: float = 0.0
) -> dict[str, Any]:
    measured = row.measured_gpu_hours
    view: dict[str, Any] = {
        "key": key,
        "gpu_hours": round(row.gpu_hours, 6),
        "share": round(row.gpu_hours / total, 6) if total > 0 else 0.0,
        # None, not 0, where none of its GPU-hours has a price: a sum of costs must not read them as free
        "cost": round(row.cost, 6) if priced and not _all_unpriced(row) else None,
        "unpriced_gpu_hours": round(row.unpriced_gpu_hours, 6) if priced else None,
        "attempts": len(row.attempts),
        "workloads": len(row.workloads),
        "by_outcome": {o: round(row.by_outcome[o], 6) for o in OUTCOMES if o in row.by_outcome},
        # GPU efficiency: None (not 0) where no attempt counted had GPU telemetry.
        "measured_gpu_hours": round(row.measured_gpu_hours, 6),
        "used_gpu_hours": round(row.used_gpu_hours, 6) if measured else None,
        "gpu_utilization_pct": round(100.0 * row.used_gpu_hours / measured, 3) if measured else None,
    }
    if row.name is not None:
        view["name"] = row.name
    if below:  # a parent queue: its row is its own work; its quota covers the queues under it too
        view["gpu_hours_below"] = round(below, 6)
    if quota is not None:
        within = row.gpu_hours + below
        view["quota_gpu_hours"] = round(quota * hours, 6)
        view["quota_used"] = round(within / (quota * hours), 6) if quota > 0 and hours > 0 else None
    return view
