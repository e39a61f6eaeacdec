"""Active health checks as gpupool jobs: submitted by the health loop, bound by the control loop, read back
from the job's log.

A check job is an ordinary workload (`gpupool ps`, `gpupool why`, `gpupool logs` show it) in the system
queue `gpupool-system` (quota 0, over-quota weight 0: it never takes a team's share), non-preemptible,
pinned to the node it checks (placement.nodes) and holding every GPU of the node, so no other work shares
the GPUs while it measures them. Its command is `python -m gpupool.health.check_job` (health/check_job.py).

The scheduler never places a check job: the node may be unhealthy or cordoned, and non-preemptible work
over its queue's quota (0) is never admitted. Like Slurm's HealthCheckProgram or Kubernetes'
node-problem-detector, the checks run outside the scheduler, but through the same store and lifecycle path
as its decisions: the health loop asks (`run`, in its own thread), and the reconcile loop, at the start of a
pass and in its own thread, submits the job and starts it with the placement the health loop chose
(`binds`, called by `Reconciler.tick`, which hands each Bind to the same `_start` as the scheduler's). So a
check job is never started next to work the scheduler placed in the same pass, and the scheduler's next
snapshot sees it as running work holding those GPUs. On a node in state `unhealthy` the scheduler leaves
single-pod work running (the health loop drains it gracefully, except check jobs), so the node stays
`unhealthy` while its check job runs there.

When the job ends, its result line is read from the attempt's log on the head with the reader bench jobs
use (control.bench.job_reports); every backend delivers logs there.

Finished check jobs are deleted once past their retention (`prune`, health config `check_jobs`): the newest
`keep_per_node` of each node, any younger than `max_age`, and any a node's health view names stay.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import and_, func, or_, select

from gpupool import scheduler
from gpupool.control import changes, submission
from gpupool.control.bench import job_reports
from gpupool.control.errors import Conflict, NotFound, ServiceError
from gpupool.control.lifecycle import PENDING, RUNNING, TERMINAL
from gpupool.control.retention import delete_finished
from gpupool.health.active import TORCH_TIMEOUT, ActiveCheckError
from gpupool.health.check_job import REPORT_KIND
from gpupool.health.checks import ActiveResult
from gpupool.health.thresholds import CheckJobRetention
from gpupool.spec import QueueSpec, WorkloadSpec
from gpupool.spec.queue import SYSTEM_QUEUE
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Node, Queue, Workload
from gpupool.timeutil import utcnow

log = logging.getLogger("gpupool.health")

USER = "health"  # the user check jobs are submitted as
PRIORITY = "build"  # a named class above train; check jobs are non-preemptible in any case
GRACE = 10.0  # seconds a check job gets between SIGTERM and SIGKILL
BIND_TIMEOUT = 30.0  # seconds the reconcile loop has to take a requested check job
WAIT_MARGIN = 60.0  # seconds beyond the job's max_duration before the health loop stops waiting
LOG_WAIT = 15.0  # seconds a finished job's result line may take to reach the head (an agent ships it)
POLL = 0.2  # seconds between looks at a running check job
SWEEP_INTERVAL = 60.0  # seconds between looks for pending check jobs nobody waits for
PRUNE_INTERVAL = 60.0  # seconds between deletions of finished check jobs past their retention
PRUNE_LIMIT = 5000  # check jobs deleted at most per round (a backlog goes over several rounds)
PRUNE_BATCH = 500  # check jobs deleted per write transaction
NODE_LOST = "node-lost"  # in the reason of an attempt whose node was lost (backends.agent's status)


class CheckJobFailed(ActiveCheckError):
    """The check job ran but reported no figures (it could not measure, or it died): the node fails."""

    def __init__(self, message: str, workload_id: int | None) -> None:
        super().__init__(message)
        self.workload_id = workload_id


class CheckInterrupted(Conflict):
    """The check job was stopped before it reported (cancelled, or its node drained): no verdict."""


@dataclass(frozen=True)
class CheckJob:
    workload_id: int
    node: str
    result: ActiveResult


@dataclass
class _Request:
    node: str
    level: str
    taken: threading.Event = field(default_factory=threading.Event)
    workload_id: int | None = None
    refused: Exception | None = None


def ensure_system_queue(store: Store) -> None:
    """The queue check jobs are accounted to: no quota and no share of idle capacity."""
    with store.session() as s:
        if s.scalar(select(Queue).where(Queue.name == SYSTEM_QUEUE)) is None:
            spec = QueueSpec.model_validate(
                {
                    "name": SYSTEM_QUEUE,
                    "description": "gpupool's own work (node health checks); started by the head, not the "
                    "scheduler, and never counted against a team",
                    "resources": {"gpu": {"quota": 0, "over_quota_weight": 0}},
                }
            )
            s.add(Queue(name=SYSTEM_QUEUE, parent=None, priority=0, spec=spec.model_dump(mode="json")))


def job_name(node: str, level: str) -> str:
    """`health-<level>-<node>` as a workload name may read (lower case, digits, dashes; 63 at most)."""
    text = "".join(c if c.isascii() and c.isalnum() else "-" for c in f"health-{level}-{node}".lower())
    return re.sub("-+", "-", text)[:63].strip("-")


def job_spec(node: str, level: str, gpus: int, *, simulated: bool, python: str) -> dict[str, Any]:
    """The workload spec of one node's check job (as `gpupool submit` takes it)."""
    command = f"{shlex.quote(python)} -m gpupool.health.check_job --level {level}"
    if simulated:
        command += f" --simulated {shlex.quote(node)}"
    return {
        "kind": "job",
        "name": job_name(node, level),
        "queue": SYSTEM_QUEUE,
        "priority": PRIORITY,
        "preemptible": False,
        "resources": {"gpu": gpus},
        "commands": [command],
        "workdir": "/",  # exists on every node; the job writes nothing there
        "max_duration": TORCH_TIMEOUT[level],
        "grace_period": GRACE,
        "placement": {"nodes": [node]},
    }


def require_free(store: Store, node: str) -> None:
    """Conflict, naming the work, when anything runs on the node: the check job needs every GPU of it."""
    with store.read() as s:
        rows = s.execute(
            select(Attempt.workload_id, Workload.name, Attempt.node_name, Attempt.pods)
            .join(Workload, Attempt.workload_id == Workload.id)
            .where(Attempt.state == RUNNING)
        ).all()
    busy = [
        (wid, name)
        for wid, name, where, pods in rows
        if node in {p["node"] for p in pods or [{"node": where}]}
    ]
    if busy:
        work = ", ".join(f"workload {wid} ({name})" for wid, name in busy)
        raise Conflict(
            f"node {node} runs {work}: the active checks hold every GPU of the node; wait for that work to "
            f"end or drain the node first (`gpupool node drain {node}`)",
            field="node",
        )


class CheckJobs:
    """Check jobs asked for by the health loop's threads and started by the reconcile loop; thread-safe."""

    def __init__(
        self, store: Store, *, wake: Callable[[], None] = lambda: None, python: str = sys.executable
    ) -> None:
        self.store, self.wake, self.python = store, wake, python
        self._lock = threading.Lock()
        self._asked: list[_Request] = []
        self._waited: set[int] = set()  # check jobs a thread of this head waits for
        self._swept = 0.0
        self._pruned = 0.0

    # -- the health loop's side --------------------------------------------------------------------------

    def run(self, node: str, level: str) -> CheckJob:
        """Run the node's check job and wait for its result. Raises Conflict (the node runs other work, is
        lost, or the job was stopped before it reported: no verdict) or CheckJobFailed (the node fails)."""
        request = _Request(node, level)
        with self._lock:
            self._asked.append(request)
        self.wake()
        if not request.taken.wait(BIND_TIMEOUT):
            with self._lock:
                if request in self._asked:
                    self._asked.remove(request)
                    raise Conflict(
                        f"node {node}: the control loop did not start the check job within {BIND_TIMEOUT:g}s "
                        "(is the server's reconcile loop running?)"
                    )
            request.taken.wait()  # taken in the meantime: binds() is about to answer
        if request.refused is not None:
            raise request.refused
        assert request.workload_id is not None
        try:
            return self._outcome(request.workload_id, node, level)
        finally:
            with self._lock:
                self._waited.discard(request.workload_id)

    def _outcome(self, workload_id: int, node: str, level: str) -> CheckJob:
        deadline = time.monotonic() + TORCH_TIMEOUT[level] + GRACE + WAIT_MARGIN
        state, reason, started = self._state(workload_id)
        while state not in TERMINAL:
            if state == PENDING and started:
                # Stopped and requeued (its node drained): a check job is not resumed elsewhere.
                self._cancel(workload_id)
                raise CheckInterrupted(
                    f"node {node}: check job {workload_id} was stopped before it reported ({reason}); "
                    "the node's verdict is unchanged"
                )
            if time.monotonic() > deadline:
                self._cancel(workload_id)
                raise CheckJobFailed(
                    f"check job {workload_id} did not end within {TORCH_TIMEOUT[level] + WAIT_MARGIN:g}s "
                    f"(`gpupool logs {workload_id}`)",
                    workload_id,
                )
            time.sleep(POLL)
            state, reason, started = self._state(workload_id)
        if state == "cancelled":
            raise CheckInterrupted(
                f"node {node}: check job {workload_id} was cancelled before it reported ({reason}); "
                "the node's verdict is unchanged"
            )
        report, attempt_state, attempt_reason = self._report(workload_id)
        # Its node lost meanwhile (the agent backend's "node-lost"): no verdict on the GPUs; the node is
        # checked when it is back (control/health.py).
        stopped = attempt_state == "evicted" or NODE_LOST in attempt_reason
        waited = time.monotonic() + LOG_WAIT
        while report is None and not stopped and time.monotonic() < waited:
            time.sleep(POLL)
            report, attempt_state, attempt_reason = self._report(workload_id)
            stopped = attempt_state == "evicted" or NODE_LOST in attempt_reason
        if report is None and stopped:  # its node turned unhealthy or was lost meanwhile
            raise CheckInterrupted(
                f"node {node}: check job {workload_id} was stopped before it reported "
                f"({attempt_reason or reason}); the node's verdict is unchanged"
            )
        if report is None:
            raise CheckJobFailed(
                f"check job {workload_id} {state} ({reason}) without reporting figures "
                f"(`gpupool logs {workload_id}`)",
                workload_id,
            )
        if report.get("error") or not isinstance(report.get("result"), dict):
            raise CheckJobFailed(
                f"check job {workload_id}: {report.get('error') or 'no result in its report'}", workload_id
            )
        result = ActiveResult.from_dict(report["result"])
        log.info(
            "event=health_check_job_done node=%s workload=%d level=%s state=%s",
            node,
            workload_id,
            level,
            state,
        )
        return CheckJob(workload_id, node, result)

    def _state(self, workload_id: int) -> tuple[str, str, bool]:
        with self.store.read() as s:
            row = s.execute(
                select(Workload.state, Workload.reason, Workload.started_at).where(Workload.id == workload_id)
            ).first()
        if row is None:
            raise CheckInterrupted(f"check job {workload_id} was deleted before it reported")
        return str(row[0]), str(row[1]), row[2] is not None

    def _report(self, workload_id: int) -> tuple[dict[str, Any] | None, str, str]:
        """The job's report from its last attempt's log (None: none yet), and that attempt's state and
        reason."""
        with self.store.read() as s:
            attempt = s.scalars(
                select(Attempt).where(Attempt.workload_id == workload_id).order_by(Attempt.number.desc())
            ).first()
            if attempt is None:
                return None, "", ""
            gang = [str(p["node"]) for p in attempt.pods or [{"node": attempt.node_name}]]
            log_path, state, reason = Path(attempt.log_path), attempt.state, attempt.reason or ""
        found = [r for _, r in job_reports(log_path, gang) if r.get("kind") == REPORT_KIND]
        return (found[-1] if found else None), state, reason

    def sweep(self, now: float) -> None:
        """Cancel pending check jobs no thread of this head waits for (left by a head that stopped, then
        requeued by a drain: the scheduler would never place them), at most every SWEEP_INTERVAL seconds."""
        if now - self._swept < SWEEP_INTERVAL:
            return
        self._swept = now
        with self.store.read() as s:
            pending = s.scalars(
                select(Workload.id).where(
                    Workload.queue == SYSTEM_QUEUE,
                    Workload.state == PENDING,
                    Workload.updated_at < utcnow() - timedelta(seconds=SWEEP_INTERVAL),  # not one being bound
                )
            ).all()
        with self._lock:
            orphans = [wid for wid in pending if wid not in self._waited]
        for wid in orphans:
            log.info("event=health_check_job_orphaned workload=%d", wid)
            self._cancel(wid)

    def prune(self, now: float, retention: CheckJobRetention, *, named: Collection[int] = ()) -> int:
        """Delete finished check jobs past their retention, at most every PRUNE_INTERVAL seconds and
        PRUNE_LIMIT a round, in batches of PRUNE_BATCH; `named`: jobs a node's health view names, kept.
        Returns how many were deleted."""
        if now - self._pruned < PRUNE_INTERVAL or retention.max_age <= 0:
            return 0
        self._pruned = now
        with self._lock:
            keep = set(named) | self._waited
        doomed = [
            wid for wid in self.past_retention(now, retention, PRUNE_LIMIT + len(keep)) if wid not in keep
        ]
        deleted = 0
        for start in range(0, min(len(doomed), PRUNE_LIMIT), PRUNE_BATCH):
            deleted += len(delete_finished(self.store, doomed[start : min(start + PRUNE_BATCH, PRUNE_LIMIT)]))
        if deleted:
            log.info("event=health_check_jobs_pruned count=%d", deleted)
        return deleted

    def past_retention(self, now: float, retention: CheckJobRetention, limit: int) -> list[int]:
        """Finished check jobs past their retention, oldest first: not among the newest `keep_per_node`
        finished ones of their node (that of their first attempt; one never started has no node and no
        result, so none is kept), finished over `max_age` seconds before `now`, not the newest workload."""
        node = func.coalesce(Attempt.node_name, "")
        ranked = (
            select(
                Workload.id.label("id"),
                func.coalesce(Workload.finished_at, Workload.updated_at).label("finished_at"),
                func.row_number().over(partition_by=node, order_by=Workload.id.desc()).label("newer"),
                Attempt.id.label("attempt"),
            )
            .outerjoin(Attempt, and_(Attempt.workload_id == Workload.id, Attempt.number == 0))
            .where(Workload.queue == SYSTEM_QUEUE, Workload.state.in_(TERMINAL))
            .subquery()
        )
        cutoff = datetime.fromtimestamp(now - retention.max_age, UTC)
        with self.store.read() as s:
            return list(
                s.scalars(
                    select(ranked.c.id)
                    .where(
                        or_(ranked.c.newer > retention.keep_per_node, ranked.c.attempt.is_(None)),
                        ranked.c.finished_at < cutoff,
                        # never the newest workload: SQLite would give its id to the next one submitted
                        ranked.c.id < select(func.max(Workload.id)).scalar_subquery(),
                    )
                    .order_by(ranked.c.id)
                    .limit(limit)
                )
            )

    def _cancel(self, workload_id: int) -> None:
        with contextlib.suppress(ServiceError):  # it ended meanwhile
            changes.cancel(self.store, workload_id, actor=USER)
        self.wake()

    # -- the reconcile loop's side -------------------------------------------------------------------------

    def binds(self) -> list[scheduler.Bind]:
        """Submit the check jobs asked for since the last pass and return their placements; the reconcile
        loop starts each at once, before it schedules (Reconciler.tick)."""
        with self._lock:
            asked, self._asked = self._asked, []
        placed = []
        for request in asked:
            try:
                placed.append(self._submit(request))
            except Exception as exc:  # the asking thread raises it; other requests go on
                request.refused = exc
            request.taken.set()
        return placed

    def _submit(self, request: _Request) -> scheduler.Bind:
        name = request.node
        with self.store.read() as s:
            node = s.scalar(select(Node).where(Node.name == name))
            if node is None:
                raise NotFound(f"no node named {name!r}", field="node")
            if node.state == "lost":
                raise Conflict(
                    f"node {name} is lost (no heartbeat); its checks run when it is back", field="node"
                )
            indices = sorted(g.index for g in node.gpus)
            simulated = any(g.simulated for g in node.gpus)
        if not indices:
            raise Conflict(f"node {name} has no GPUs to check", field="node")
        require_free(self.store, name)
        ensure_system_queue(self.store)  # with the first check job: a pool that never checks has none
        spec = job_spec(name, request.level, len(indices), simulated=simulated, python=self.python)
        view = submission.submit(self.store, WorkloadSpec.model_validate(spec), user=USER)
        request.workload_id = int(view["id"])
        with self._lock:
            self._waited.add(request.workload_id)
        log.info(
            "event=health_check_job_submitted node=%s workload=%d level=%s gpus=%d",
            name, request.workload_id, request.level, len(indices),
        )  # fmt: skip
        return scheduler.Bind(request.workload_id, (scheduler.PodPlacement(name, tuple(indices), 1.0),))
