"""The reconcile loop's schedule phase, first half (control/loop.py): the snapshot the scheduler decides on.

Pending and running work, nodes and queues are read from the store into the scheduler's views. A
workload's view is parsed from its spec once and kept, and a node's view of the last pass is reused while
nothing changed, so that the scheduler recognises an unchanged snapshot by identity and answers from memory.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gpupool import scheduler
from gpupool.control import inventory
from gpupool.control.arrays import throttled
from gpupool.control.budgets import Budgets, blocked
from gpupool.control.dependencies import Dependencies, Dependency, dependencies_of
from gpupool.control.lifecycle import FAILED, HELD, PENDING, RUNNING
from gpupool.control.node_views import NodeViews
from gpupool.control.policy import BandedPass
from gpupool.control.restarts import Backoff, Ended, backoff
from gpupool.control.settings import ControlSettings
from gpupool.control.usage import AttainedService, attempt_gpus, queue_usage
from gpupool.control.user_limits import held_back, limits_of
from gpupool.spec import parse_gpu_request
from gpupool.spec.arrays import array_limit
from gpupool.spec.views import queue_view
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Queue, Workload
from gpupool.timeutil import as_utc, utcnow

USAGE_REFRESH = 30.0  # seconds between recomputations of the queues' decayed usage
USAGE_HORIZON_HALF_LIVES = 10  # attempts that ended longer ago than this many half-lives are ignored
# What `gpupool update` may change of cached views besides the priority, read each pass with the work.
CHANGEABLE = (Workload.queue, Workload.spec["max_duration"].as_float())
BY_SERVICE = ("attained", "las")  # orderings that rank pending work by the service it already received
HELD_EXPLANATION = scheduler.Explanation(
    HELD, "held (its history says by whom: hold, --hold, idle); `gpupool release` lets it start"
)


class SnapshotBuilding:
    """The snapshot building of `Reconciler` (control/loop.py), which sets these attributes."""

    store: Store
    settings: ControlSettings
    _config: scheduler.SchedulerConfig
    _inventory_generation: int
    _views: dict[int, scheduler.WorkloadView]
    _resumable: set[int]
    _usage_cache: tuple[float, dict[str, float]] | None
    _attained: AttainedService
    _node_views: dict[str, scheduler.NodeView]
    _nodes: NodeViews
    # (workload id, restarts + node failures) -> backoff, see _backing_off
    _backoffs: dict[tuple[int, int], Backoff | None]
    backing_off: dict[int, Backoff]  # pending work the last snapshot left out: it waits to start again
    held: dict[int, scheduler.Explanation]  # pending work the last snapshot left out: held until released
    _after: dict[int, tuple[Dependency, ...]]  # cached workloads whose spec lists `after`: what they wait for
    dependencies: Dependencies  # pending work the last snapshot left out: it waits for other workloads
    _array_limits: dict[int, tuple[int, int]]  # cached tasks of arrays with a %N: (array id, N)
    array_held: dict[int, scheduler.Explanation]  # pending tasks the last snapshot left out: their array's %N
    _users: dict[int, str]  # cached: who submitted each workload
    user_held: dict[int, scheduler.Explanation]  # pending work the last snapshot left out: user_limits
    budgets: Budgets  # the queues' budgets as the last pass counted them
    over_budget: dict[int, scheduler.Explanation]  # pending work the last snapshot left out: a budget used

    def _held_reasons(self, s: Session, held: list[int]) -> dict[int, scheduler.Explanation]:
        """Why each held workload waits: the reason its hold wrote ("held by alice", "held at submit",
        the idle rule's words), which stays until it is released; the general sentence where none was
        kept (held before gpupool kept them)."""
        if not held:
            return {}
        rows = s.execute(
            select(Workload.id, Workload.reason, Workload.reason_code).where(Workload.id.in_(held))
        ).all()
        kept = {
            int(wid): scheduler.Explanation(HELD, reason)
            for wid, reason, code in rows
            if code == HELD and reason
        }
        return {wid: kept.get(wid, HELD_EXPLANATION) for wid in held}

    def _snapshot(self, s: Session, now: float | None = None) -> scheduler.Snapshot:
        now = time.time() if now is None else now
        config = self._config
        rows = s.execute(
            select(
                Workload.id,
                Workload.priority,
                Workload.restarts + Workload.node_failures,
                Workload.held,
                *CHANGEABLE,
            )
            .where(Workload.state == PENDING)
            .order_by(Workload.id)
        ).all()
        self.held = self._held_reasons(s, [int(wid) for wid, _, _, held, *_ in rows if held])
        restarted = [(int(wid), int(n)) for wid, _, n, held, *_ in rows if n and not held]
        self.backing_off = self._backing_off(s, restarted, now) if restarted else {}
        pending = [
            (int(wid), int(priority))
            for wid, priority, _, held, *_ in rows
            if not held and wid not in self.backing_off
        ]
        attempts = s.execute(
            select(
                Attempt.workload_id,
                Workload.priority,
                Attempt.node_name,
                Attempt.gpu_indices,
                Attempt.gpu_fraction,
                Attempt.started_at,
                Attempt.stop_requested_at,
                Attempt.pods,
                Attempt.stop_for_workload,
                *CHANGEABLE,
            )
            .join(Workload, Attempt.workload_id == Workload.id)
            .where(Attempt.state == RUNNING)
            .order_by(Attempt.workload_id)
        ).all()
        self._cache_views(s, [wid for wid, _ in pending] + [row[0] for row in attempts])
        listed = {int(wid) for wid, _ in pending}
        self._updated((row[0], row[-2], row[-1]) for row in rows if row[0] in listed)
        self._updated((row[0], row[-2], row[-1]) for row in attempts)
        after = self._after
        self.dependencies.sort(s, {wid: after[wid] for wid, _ in pending if wid in after})
        held = self.dependencies.waiting.keys() | self.dependencies.never.keys()
        if held:
            pending = [(wid, priority) for wid, priority in pending if wid not in held]
        self.array_held = {}
        if self._array_limits:
            ids = [wid for wid, _ in pending]
            self.array_held = throttled(ids, {row[0] for row in attempts}, self._array_limits)
            if self.array_held:
                pending = [(wid, priority) for wid, priority in pending if wid not in self.array_held]
        queue_rows = s.scalars(select(Queue).order_by(Queue.name)).all()
        pending = self._within_user_limits(queue_rows, pending, [row[0] for row in attempts])
        pending = self._within_budget(s, queue_rows, pending, now)
        usage = self._usage(s, {q.name: q.parent for q in queue_rows})
        queues = tuple(replace(_queue_view(q), usage=usage.get(q.name, 0.0)) for q in queue_rows)
        # Attained service is read where something ranks or weighs by it: las / attained ordering, the
        # policy's bands and young-work weights (control/policy.py).
        by_service = (
            bool(config.young_weights)
            or config.ordering in BY_SERVICE
            or any(q.ordering in BY_SERVICE for q in queues)
        )
        bands = BandedPass(config, queues) if by_service else None
        started = [as_utc(row[5]) for row in attempts]
        keys = [
            (row[0], start.timestamp() if start else 0.0)
            for row, start in zip(attempts, started, strict=True)
        ]
        earlier = self._attained.of_running(s, keys) if bands is not None else {}
        running = []
        for row, start, key in zip(attempts, started, keys, strict=True):
            wid, priority, node, indices, fraction, _, stopping, pods, stop_for, *_ = row
            placement = tuple(
                scheduler.PodPlacement(
                    p["node"], tuple(int(i) for i in p["gpu_indices"]), p.get("gpu_fraction") or 1.0
                )
                for p in pods or ()
            ) or (scheduler.PodPlacement(node, tuple(int(i) for i in indices), fraction or 1.0),)
            view = self._views[wid]
            if bands is not None:
                # The running attempt's GPU-seconds so far count: its band and weight change as it runs.
                ran = max(0.0, now - key[1]) * attempt_gpus(indices, fraction, pods) if start else 0.0
                priority = bands.priority(priority, earlier[key] + ran, view.queue, wid in self._resumable)
            running.append(
                replace(
                    view,
                    priority=priority,
                    placement=placement,
                    start_time=start.timestamp() if start else None,
                    stopping=stopping is not None,
                    evicted_for=stop_for if stopping is not None else None,
                )
            )
        nodes = self._nodes.read(self.store)
        if self._inventory_generation:
            nodes = inventory.with_foreign_use(s, nodes, running)
        nodes = tuple(self._same_view(view) for view in nodes)
        if bands is not None:
            for wid, attained in self._attained.of(s, [wid for wid, _ in pending]).items():
                if self._views[wid].attained_service != attained:
                    self._views[wid] = replace(self._views[wid], attained_service=attained)
        # Priority is read fresh each pass: it is the one field an operator may change while work waits.
        views = []
        for wid, priority in pending:
            view = self._views[wid]
            if bands is not None:
                priority = bands.priority(priority, view.attained_service, view.queue)
            if view.priority != priority:
                view = self._views[wid] = replace(view, priority=priority)
            views.append(view)
        if bands is not None:
            queues = bands.queues(queues)
        return scheduler.Snapshot(nodes, tuple(views), queues, tuple(running), config)

    def _updated(self, rows: Iterable[tuple[int, str, float | None]]) -> None:
        """Refresh the cached views of work whose queue or time limit changed since they were made
        (`gpupool update --queue / --max-duration`; `rows`: id, queue, max_duration read this pass)."""
        views = self._views
        for wid, queue, limit in rows:
            view = views[wid]
            if view.queue != queue or view.max_duration != limit:
                views[wid] = replace(view, queue=queue, max_duration=limit)

    def _within_user_limits(
        self, queue_rows: Sequence[Queue], pending: list[tuple[int, int]], running: list[int]
    ) -> list[tuple[int, int]]:
        """`pending` without the work its queue's `user_limits` hold back beside each user's running work:
        that work is left in `user_held`, with why (control/user_limits.py)."""
        self.user_held = {}
        limits = limits_of((q.name, q.spec) for q in queue_rows)
        if not limits or not pending:
            return pending
        views, users = self._views, self._users
        self.user_held = held_back(
            ((wid, views[wid].queue, users[wid], views[wid].gpu_units) for wid, _ in pending),
            ((views[wid].queue, users[wid], views[wid].gpu_units) for wid in running),
            limits,
            {q.name: q.parent for q in queue_rows},
        )
        if not self.user_held:
            return pending
        return [(wid, priority) for wid, priority in pending if wid not in self.user_held]

    def _within_budget(
        self, s: Session, queue_rows: Sequence[Queue], pending: list[tuple[int, int]], now: float
    ) -> list[tuple[int, int]]:
        """`pending` without the work of queues whose budget (or an ancestor's) is used: that work is left
        in `over_budget`, with why (control/budgets.py)."""
        self.over_budget = {}
        state = self.budgets.look(s, queue_rows, now)
        if not state or not pending:
            return pending
        views = self._views
        out = blocked(state, {q.name: q.parent for q in queue_rows}, {views[wid].queue for wid, _ in pending})
        if not out:
            return pending
        for wid, _ in pending:
            budget = out.get(views[wid].queue)
            if budget is not None:
                self.over_budget[wid] = budget.explanation()
        return [(wid, priority) for wid, priority in pending if wid not in self.over_budget]

    def _same_view(self, view: scheduler.NodeView) -> scheduler.NodeView:
        """The view of the last pass when nothing changed: the scheduler then recognises the node (and an
        unchanged snapshot) by identity, which is cheaper than by value."""
        last = self._node_views.get(view.name)
        if last is view or (last is not None and last == view):
            return last
        self._node_views[view.name] = view
        return view

    def _usage(self, s: Session, parents: dict[str, str | None]) -> dict[str, float]:
        """Decayed GPU-seconds per queue, recomputed from the attempts at most every USAGE_REFRESH s or a
        hundredth of the half-life (it changes slowly; an unchanged snapshot lets the scheduler answer from
        memory)."""
        settings = self.settings
        if settings.usage_weight <= 0:
            return {}
        now = time.time()
        refresh = min(USAGE_REFRESH, settings.usage_half_life / 100.0)
        if self._usage_cache is not None and now - self._usage_cache[0] < refresh:
            return self._usage_cache[1]
        horizon = datetime.fromtimestamp(now - USAGE_HORIZON_HALF_LIVES * settings.usage_half_life, UTC)
        rows = s.execute(
            select(Attempt.queue, Attempt.gpu_indices, Attempt.gpu_fraction, Attempt.pods,
                   Attempt.started_at, Attempt.finished_at)
            .where(or_(Attempt.finished_at.is_(None), Attempt.finished_at >= horizon))
        ).all()  # fmt: skip
        intervals = []
        for queue, indices, fraction, pods, started, finished in rows:
            start, end = as_utc(started), as_utc(finished)
            gpus = attempt_gpus(indices, fraction, pods)
            if start is not None:
                intervals.append((queue, gpus, start.timestamp(), end.timestamp() if end else now))
        usage = queue_usage(intervals, parents, now, settings.usage_half_life)
        self._usage_cache = (now, usage)
        return usage

    def _backing_off(self, s: Session, restarted: list[tuple[int, int]], now: float) -> dict[int, Backoff]:
        """The pending workloads started before (id, restarts + node failures) that wait out a crash-loop
        backoff before their next attempt (control/restarts.py), by id. A backoff is read from the attempts
        once per requeue that counts and kept: while the workload is pending, its attempts do not change."""
        known = self._backoffs
        missing = [key for key in restarted if key not in known]
        for chunk in range(0, len(missing), 500):
            ids = [wid for wid, _ in missing[chunk : chunk + 500]]
            attempts: dict[int, list[Ended]] = {}
            for wid, started, finished, code, stop_reason, pid, state, reason in s.execute(
                select(
                    Attempt.workload_id,
                    Attempt.started_at,
                    Attempt.finished_at,
                    Attempt.exit_code,
                    Attempt.stop_reason,
                    Attempt.pid,
                    Attempt.state,
                    Attempt.reason,
                )
                .where(Attempt.workload_id.in_(ids))
                .order_by(Attempt.workload_id, Attempt.number)
            ):
                # no process, failed: its node could not start it (a head that died before the process
                # existed leaves it evicted instead, and that is no quick exit)
                unstarted = pid is None and state == FAILED
                ended = Ended(started, finished, code, stop_reason or "", unstarted, reason or "")
                attempts.setdefault(wid, []).append(ended)
            for key in missing[chunk : chunk + 500]:
                known[key] = backoff(attempts.get(key[0], ()), self.settings.restart_backoff)
        if len(known) > 2 * len(restarted) + 100:
            wanted = set(restarted)
            self._backoffs = known = {key: b for key, b in known.items() if key in wanted}
        waiting = {}
        for key in restarted:
            found = known[key]
            if found is not None and found.until > now:
                waiting[key[0]] = found
        return waiting

    def _cache_views(self, s: Session, ids: list[int]) -> None:
        """Views of workloads by id, each parsed from its spec once and kept; what `gpupool update` may
        change is read each pass (the priority; the queue and time limit through `_updated`)."""
        missing = [wid for wid in ids if wid not in self._views]
        for chunk in range(0, len(missing), 500):
            rows = s.execute(
                select(
                    Workload.id,
                    Workload.queue,
                    Workload.nodes,
                    Workload.created_at,
                    Workload.preemptible,
                    Workload.spec,
                    Workload.priority,
                    Workload.service_id,
                    Workload.array_id,
                    Workload.user,
                ).where(Workload.id.in_(missing[chunk : chunk + 500]))
            ).all()
            for row in rows:
                wid, queue, nodes, created_at, preemptible, spec, priority, service_id, array_id, user = row
                self._users[wid] = user
                self._views[wid] = replace(
                    _workload_view(wid, queue, nodes, created_at, preemptible, spec),
                    priority=priority,
                    spread_group=service_id,  # a service's replicas: spread over nodes where they can be
                )
                if (spec or {}).get("checkpoint"):
                    self._resumable.add(wid)
                if (spec or {}).get("after"):
                    self._after[wid] = dependencies_of(spec)
                limit = array_limit(spec["array"]) if array_id and (spec or {}).get("array") else None
                if array_id is not None and limit is not None:
                    self._array_limits[wid] = (array_id, limit)
        if len(self._views) > 2 * len(ids) + 1000:
            wanted = set(ids)
            self._views = {wid: view for wid, view in self._views.items() if wid in wanted}
            self._resumable &= wanted
            self._after = {wid: deps for wid, deps in self._after.items() if wid in wanted}
            self._array_limits = {wid: a for wid, a in self._array_limits.items() if wid in wanted}
            self._users = {wid: user for wid, user in self._users.items() if wid in wanted}


def _queue_view(queue: Queue) -> scheduler.QueueView:
    return queue_view(
        {**(queue.spec or {}), "name": queue.name, "parent": queue.parent, "priority": queue.priority}
    )


def _workload_view(
    workload_id: int, queue: str, nodes: int, created_at: datetime, preemptible: bool, spec: dict[str, Any]
) -> scheduler.WorkloadView:
    resources = spec.get("resources") or {}
    placement = spec.get("placement") or {}
    request = parse_gpu_request(resources.get("gpu", 0))
    created = as_utc(created_at) or utcnow()
    return scheduler.WorkloadView(
        id=workload_id,
        queue=queue,
        priority=0,
        submit_time=created.timestamp(),
        nodes=nodes,
        gpus=scheduler.GpuDemand(request.count, request.models, request.min_memory_bytes),
        cpus=float(resources.get("cpu") or 0.0),
        memory_bytes=int(resources.get("memory") or 0),
        preemptible=preemptible,
        topology=placement.get("topology"),
        topology_preferred=placement.get("topology_preferred"),
        node_names=frozenset(placement.get("nodes") or ()),
        max_duration=spec.get("max_duration"),
    )
