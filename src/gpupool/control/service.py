"""What the API can ask of the pool: submit, cancel, list, logs, nodes, queues. No HTTP here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, cast

from sqlalchemy import Table, func, insert, select
from sqlalchemy import update as update_rows
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.exc import StaleDataError

from gpupool.backends.agent_records import rank_log_path
from gpupool.control import audit, secrets
from gpupool.control.accounting import gpu_quota
from gpupool.control.arrays import ARRAY_LIMIT
from gpupool.control.budgets import BUDGET
from gpupool.control.dependencies import DEPENDENCY, check_at_submit
from gpupool.control.errors import Conflict, Forbidden, Invalid, NotFound, ServiceError, Unavailable
from gpupool.control.lifecycle import (
    ACTIVE,
    CANCELLED,
    EVICTED,
    FAILED,
    HELD,
    HOLD_STOPPING,
    PENDING,
    REQUEUE_STOPPING,
    RUNNING,
    SERVICE,
    STATES,
    STOP_HOLD,
    STOP_REQUEUE,
    TERMINAL,
    note,
    transition,
)
from gpupool.control.notify import redacted_url
from gpupool.control.readiness import Readiness, word_on
from gpupool.control.reclaim_blockers import NOTHING_TO_RECLAIM, reclaim_blockers
from gpupool.control.restarts import DEFAULT_BASE, RESTART_BACKOFF, Ended, backoff
from gpupool.control.telemetry import TelemetryCache
from gpupool.control.usage import attempt_gpus
from gpupool.control.user_limits import USER_LIMIT
from gpupool.gpu.catalog import families
from gpupool.scheduler import Explanation, explain
from gpupool.scheduler.placement import split_model
from gpupool.spec import (
    QueueSpec,
    SpecError,
    WorkloadSpec,
    parse_gpu_request,
    parse_queue_spec,
    parse_workload_spec,
)
from gpupool.spec.quantities import format_duration
from gpupool.spec.workload import (
    MAX_PRIORITY,
    MAX_REPLICAS,
    PRIORITY_CLASSES,
    ArrayRange,
    parse_array,
)
from gpupool.store.db import Store
from gpupool.store.models import MAX_ID, ApiToken, Attempt, Event, Gpu, Node, Queue, Workload
from gpupool.timeutil import age_seconds, as_utc, utcnow

DEFAULT_QUEUE = "default"
SYSTEM_QUEUE = "gpupool-system"  # gpupool's own work; a top-level queue with no quota, made when first needed
# The reason codes of pending work that counts toward no fair share, so that reclaim takes nothing back
# for it (and QueueStarvedBelowQuota does not page for it): what the control loop holds back from the
# scheduler (a hold, a dependency, an array's limit, a crash-loop backoff, a user limit, a spent budget),
# what its own queue's limit holds back (no reclaim from other queues frees room under it), and what the
# scheduler found can never fit the pool (too large, no GPU of its model).
HELD_BACK: Final = frozenset(
    {
        HELD,
        DEPENDENCY,
        ARRAY_LIMIT,
        RESTART_BACKOFF,
        USER_LIMIT,
        BUDGET,
        explain.QUEUE_LIMIT,
        explain.TOO_LARGE,
        explain.NO_MATCHING_GPU,
    }
)
LOG_CHUNK_MAX = 1 << 20


def _iso(value: Any) -> str | None:
    value = as_utc(value)
    return value.isoformat() if value is not None else None


# -- queues ----------------------------------------------------------------------------------------------


def ensure_default_queue(store: Store) -> None:
    with store.session() as s:
        if s.scalar(select(Queue).where(Queue.name == DEFAULT_QUEUE)) is None:
            spec = QueueSpec(name=DEFAULT_QUEUE, description="Where workloads go when they name no queue.")
            s.add(Queue(name=DEFAULT_QUEUE, parent=None, priority=0, spec=spec.model_dump(mode="json")))


def queue_view(
    queue: Queue,
    usage: dict[str, dict[str, float]] | None = None,
    fair_shares: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    used = (usage or {}).get(queue.name, {})
    fair = (fair_shares or {}).get(queue.name, {})
    return {
        "name": queue.name,
        "parent": queue.parent,
        "priority": queue.priority,
        "description": queue.spec.get("description", ""),
        "resources": queue.spec.get("resources", {}),
        "gpus_allocated": used.get("gpus", 0.0),
        "gpus_pending": used.get("gpus_pending", 0.0),
        "gpus_held_back": used.get("gpus_held_back", 0.0),
        "fair_share": {resource: round(value, 6) for resource, value in fair.items()},
        "ordering": queue.spec.get("ordering"),
        "min_runtime_preempt": queue.spec.get("min_runtime_preempt"),
        "min_runtime_reclaim": queue.spec.get("min_runtime_reclaim"),
        "budget": queue.spec.get("budget"),
        "user_limits": queue.spec.get("user_limits"),
        "max_priority": queue.spec.get("max_priority"),
        "running": int(used.get("running", 0)),
        "pending": int(used.get("pending", 0)),
        # a parent's: what the queues under it hold and run (not in its own figures above)
        "gpus_allocated_below": used.get("gpus_below", 0.0),
        "running_below": int(used.get("running_below", 0)),
        "created_at": _iso(queue.created_at),
        "updated_at": _iso(queue.updated_at),
    }


def _queue_usage(s: Session, live: Live | None = None) -> dict[str, dict[str, float]]:
    usage: dict[str, dict[str, float]] = {}
    for queue, state, count in s.execute(
        select(Workload.queue, Workload.state, func.count())
        .where(Workload.state.in_(ACTIVE))
        .group_by(Workload.queue, Workload.state)
    ):
        usage.setdefault(queue, {})[state] = float(count)
    for queue, indices, fraction, pods in s.execute(
        select(Workload.queue, Attempt.gpu_indices, Attempt.gpu_fraction, Attempt.pods)
        .join(Workload, Attempt.workload_id == Workload.id)
        .where(Attempt.state == RUNNING)
    ):
        row = usage.setdefault(queue, {})
        row["gpus"] = row.get("gpus", 0.0) + attempt_gpus(indices, fraction, pods)
    for wid, queue, gpus, nodes, code in s.execute(
        select(Workload.id, Workload.queue, Workload.gpus, Workload.nodes, Workload.reason_code).where(
            Workload.state == PENDING
        )
    ):
        row = usage.setdefault(queue, {})
        asked = parse_gpu_request(gpus).count * nodes
        row["gpus_pending"] = row.get("gpus_pending", 0.0) + asked
        if live is not None and wid in live:
            code = live[wid].code  # the latest pass's reason: the store keeps it only when it changes
        if code in HELD_BACK:
            row["gpus_held_back"] = row.get("gpus_held_back", 0.0) + asked
    # What runs in the queues under each parent (a department's): kept apart from its own figures, so
    # that a sum over queues (a dashboard's) counts nothing twice.
    parents = dict(s.execute(select(Queue.name, Queue.parent)).all())
    for queue, row in list(usage.items()):
        above, seen = parents.get(queue), {queue}
        while above is not None and above not in seen:
            seen.add(above)
            up = usage.setdefault(above, {})
            up["gpus_below"] = up.get("gpus_below", 0.0) + row.get("gpus", 0.0)
            up["running_below"] = up.get("running_below", 0.0) + row.get(RUNNING, 0.0)
            above = parents.get(above)
    return usage


def _check_parent(s: Session, spec: QueueSpec) -> None:
    if spec.parent is None:
        return
    if spec.parent == spec.name:
        raise Invalid(f"queue {spec.name} cannot be its own parent", field="parent")
    parents: dict[str, str | None] = {
        name: parent for name, parent in s.execute(select(Queue.name, Queue.parent))
    }
    if spec.parent not in parents:
        raise Invalid(f"parent queue {spec.parent!r} does not exist; create it first", field="parent")
    chain, above = [spec.parent], parents[spec.parent]
    while above is not None and above not in chain:  # `not in chain`: ends even on a loop stored before
        if above == spec.name:
            loop = " under ".join([*chain, spec.name])
            raise Invalid(
                f"parent: {spec.parent!r} is under {spec.name!r} ({loop}), so the queues would form a loop; "
                f"choose a parent outside {spec.name!r} and the queues under it",
                field="parent",
            )
        chain.append(above)
        above = parents.get(above)


def quota_warnings(s: Session, name: str) -> list[str]:
    """What no longer holds once queue `name` has its quota: the quotas of it and its siblings promise more
    GPUs than their parent's quota (or, at the top, than the pool has), or those of its children more than
    its own. Accepted all the same (a pool may grow, and Slurm and Kueue take such settings too), but every
    such queue then gets less than its quota when all of them want it: fair shares scale the quotas down."""
    rows = s.execute(select(Queue.name, Queue.parent, Queue.spec)).all()
    quotas = {n: gpu_quota(spec) for n, _, spec in rows}
    parent = next((p for n, p, _ in rows if n == name), None)
    levels = [(parent, sum(quotas[n] for n, p, _ in rows if p == parent))]
    if any(p == name for _, p, _ in rows):
        levels.append((name, sum(quotas[n] for n, p, _ in rows if p == name)))
    said = []
    for above, promised in levels:
        if above is None:
            room, whose = float(s.scalar(select(func.count()).select_from(Gpu)) or 0), "the pool has"
            if room == 0:
                continue  # no node has joined yet: nothing to say
        else:
            room, whose = quotas.get(above, 0.0), f"parent queue {above}'s quota is"
        if promised > room + 1e-9:
            level = "top-level queues" if above is None else f"the queues under {above}"
            said.append(
                f"the GPU quotas of {level} add up to {promised:g}, but {whose} {room:g}: when all of "
                "them want their quota, each gets less (fair shares scale the quotas down), so a quota is no "
                "longer a guarantee"
            )
    return said


def create_queue(store: Store, spec: QueueSpec, *, actor: str = "admin") -> dict[str, Any]:
    _not_system(spec.name, "made by hand")
    with store.session() as s:
        if s.scalar(select(Queue).where(Queue.name == spec.name)) is not None:
            raise Conflict(
                f"queue {spec.name!r} already exists; change it with `gpupool queue update {spec.name}`",
                field="name",
            )
        _check_parent(s, spec)
        queue = Queue(
            name=spec.name, parent=spec.parent, priority=spec.priority, spec=spec.model_dump(mode="json")
        )
        s.add(queue)
        audit.record(s, audit.QUEUE, spec.name, f"created: {_queue_settings(queue)}", actor)
        s.flush()
        return {**queue_view(queue), "warnings": quota_warnings(s, spec.name)}


def _queue_settings(queue: Queue) -> str:
    """What the audit log says a queue was made with: the fields its spec sets away from the defaults."""
    defaults = parse_queue_spec({"name": queue.name}).model_dump(mode="json")
    return audit.settings(queue.spec, defaults)


def update_queue(
    store: Store, name: str, build: Callable[[dict[str, Any]], QueueSpec], *, actor: str = "admin"
) -> dict[str, Any]:
    """`build` turns the current spec (as JSON) into the new, validated spec."""
    _not_system(name, "changed")
    with store.session() as s:
        queue = s.scalar(select(Queue).where(Queue.name == name))
        if queue is None:
            raise NotFound(f"no queue named {name!r}; list them with `gpupool queues`")
        spec = build(dict(queue.spec))
        if spec.name != name:
            raise Invalid("a queue cannot be renamed", field="name")
        _check_parent(s, spec)
        before = queue.spec
        queue.parent, queue.priority, queue.spec = spec.parent, spec.priority, spec.model_dump(mode="json")
        audit.record(s, audit.QUEUE, name, f"updated: {audit.changes(before, queue.spec)}", actor)
        s.flush()
        warnings = quota_warnings(s, name) + _unreclaimable_warnings(s, name, gpu_quota(queue.spec))
        return {**queue_view(queue, _queue_usage(s)), "warnings": warnings}


def _unreclaimable_warnings(s: Session, name: str, quota: float) -> list[str]:
    """Queue `name`'s non-preemptible running work beyond its (new) quota: nothing takes those GPUs back
    for other queues until that work ends, as over-quota work of its own kind could not have started."""
    held = sum(
        attempt_gpus(indices, fraction, pods)
        for indices, fraction, pods in s.execute(
            select(Attempt.gpu_indices, Attempt.gpu_fraction, Attempt.pods)
            .join(Workload, Attempt.workload_id == Workload.id)
            .where(Attempt.state == RUNNING, Workload.queue == name, Workload.preemptible.is_(False))
        )
    )
    if held <= quota + 1e-9:
        return []
    return [
        f"queue {name} runs {held:g} GPUs of non-preemptible work, more than its GPU quota of {quota:g}: "
        f"no queue can reclaim the {held - quota:g} beyond it until that work ends (`gpupool ps --queue "
        f"{name}`; `gpupool requeue ID` stops one now)"
    ]


def _not_system(name: str, done: str) -> None:
    if name == SYSTEM_QUEUE:
        raise Conflict(
            f"queue {SYSTEM_QUEUE} is gpupool's own (its node health checks run there, outside quotas and "
            f"fair shares) and cannot be {done}; change the teams' queues instead",
            field="name",
        )


def delete_queue(store: Store, name: str, *, actor: str = "admin") -> dict[str, Any]:
    """Remove a queue nothing uses any more: no pending or running work, no child queues, and not the
    default queue. Finished work keeps the queue's name (its history and GPU-hours stay as they were).
    Returns the queue as it was."""
    _not_system(name, "deleted")
    with store.session() as s:
        queue = s.scalar(select(Queue).where(Queue.name == name))
        if queue is None:
            raise NotFound(f"no queue named {name!r}; list them with `gpupool queues`")
        if name == DEFAULT_QUEUE:
            raise Conflict(
                f"the {DEFAULT_QUEUE!r} queue cannot be deleted: work that names no queue goes there",
                field="name",
            )
        children = list(s.scalars(select(Queue.name).where(Queue.parent == name).order_by(Queue.name)))
        if children:
            raise Conflict(
                f"queue {name!r} is the parent of {', '.join(children)}; delete those first, or move them "
                f"with `gpupool queue update {children[0]} --parent OTHER`",
                field="name",
            )
        active = dict(
            s.execute(
                select(Workload.state, func.count())
                .where(Workload.queue == name, Workload.state.in_(ACTIVE))
                .group_by(Workload.state)
            ).all()
        )
        if active:
            counts = " and ".join(f"{active[state]} {state}" for state in sorted(active))
            plural = "s" if sum(active.values()) != 1 else ""
            raise Conflict(
                f"queue {name!r} still has {counts} workload{plural}; cancel them or let them finish "
                f"first (`gpupool ps --queue {name}`)",
                field="name",
            )
        view = queue_view(queue)  # nothing pending or running: no usage to show
        bound = sorted(t.name for t in s.scalars(select(ApiToken)) if name in (t.queues or ()))
        s.delete(queue)
        audit.record(s, audit.QUEUE, name, f"deleted (it had: {_queue_settings(queue)})", actor)
        view["warnings"] = (
            [
                f"token{'s' if len(bound) > 1 else ''} {', '.join(bound)} may submit to {name}, which is "
                "gone now (and back if a queue of that name is made again); to change that, revoke and "
                f"create again (`gpupool token revoke {bound[0]}`, `gpupool token create {bound[0]} --queue "
                "OTHER`)"
            ]
            if bound
            else []
        )
        if s.scalar(select(Attempt.id).where(Attempt.queue == name).limit(1)) is not None:
            view["warnings"].append(
                f"the GPU-hours used in {name} stay under that name (usage, costs): a queue made again as "
                f"{name} starts with them, and its budget with what they spent this period"
            )
        return view


def list_queues(
    store: Store, fair_shares: dict[str, dict[str, float]] | None = None, live: Live | None = None
) -> list[dict[str, Any]]:
    """`live`: the control loop's latest explanation of each pending workload (what of the pending demand is
    held back before the scheduler is read from it, else from the store)."""
    with store.read() as s:
        usage = _queue_usage(s, live)
        return [queue_view(q, usage, fair_shares) for q in s.scalars(select(Queue).order_by(Queue.name))]


def get_queue(
    store: Store, name: str, fair_shares: dict[str, dict[str, float]] | None = None, live: Live | None = None
) -> dict[str, Any]:
    with store.read() as s:
        queue = s.scalar(select(Queue).where(Queue.name == name))
        if queue is None:
            raise NotFound(f"no queue named {name!r}; list them with `gpupool queues`")
        return queue_view(queue, _queue_usage(s, live), fair_shares)


# -- workloads -------------------------------------------------------------------------------------------


def attempt_nodes(attempt: Attempt) -> list[str]:
    """The node of each of an attempt's ranks, in rank order (its one node where it records no ranks)."""
    return [str(pod["node"]) for pod in attempt.pods or ()] or [attempt.node_name]


def attempt_view(attempt: Attempt) -> dict[str, Any]:
    return {
        "number": attempt.number,
        "state": attempt.state,
        "node": attempt.node_name,
        "queue": attempt.queue,  # the queue it ran in (its workload may have moved since)
        "gpu_indices": list(attempt.gpu_indices),
        "gpu_fraction": attempt.gpu_fraction,
        "backend": attempt.backend,
        "pid": attempt.pid if attempt.backend == "local" else None,
        "slurm_job_id": str(attempt.pid) if attempt.backend == "slurm" and attempt.pid else None,
        "exit_code": attempt.exit_code,
        "reason": attempt.reason,
        "log_path": attempt.log_path,
        "pods": list(attempt.pods or []),
        "endpoint": attempt.endpoint or None,
        "started_at": _iso(attempt.started_at),
        "finished_at": _iso(attempt.finished_at),
        # GPU efficiency from telemetry (control/efficiency.py); None: no GPU telemetry for this attempt.
        "gpu_utilization_pct": attempt.gpu_utilization_pct,
        "gpu_memory_peak_bytes": attempt.gpu_memory_peak_bytes,
        "gpu_memory_total_bytes": attempt.gpu_memory_total_bytes,
        "gpu_seconds_sampled": attempt.gpu_seconds_sampled,
    }


Live = Mapping[int, Explanation]  # the control loop's latest explanation of each pending workload
Ready = Mapping[int, Readiness]  # the readiness prober's last word on each running service with a probe


def _readiness_of(workload: Workload, last: Attempt | None, readiness: Ready | None) -> Readiness | None:
    """The prober's word on `workload`'s running attempt (`last`); a not-ready one when it has said
    nothing of that attempt yet."""
    if last is None or last.state != RUNNING or not (workload.spec or {}).get("readiness_probe"):
        return None
    return word_on(readiness or {}, workload.id, last.number)


def run_seconds(attempts: Sequence[Attempt]) -> float:
    """The time `attempts` ran (each from its start to its end, or to now while it runs), added up."""
    now = utcnow()
    total = 0.0
    for attempt in attempts:
        started = as_utc(attempt.started_at)
        ended = as_utc(attempt.finished_at) or now
        if started is not None and ended > started:
            total += (ended - started).total_seconds()
    return total


def work_seconds(workload: Workload) -> float:
    """The run time of the work `workload`'s attempts kept: all of it, less the attempts the control plane
    stopped (evicted, drained, held, requeued) when it declares no checkpoint, whose next attempt started
    over and did that work again. What a replay of the workload asks for (`sim whatif`), which evicts on
    its own terms."""
    resumes = bool(workload.spec.get("checkpoint"))
    return run_seconds([a for a in workload.attempts if resumes or a.state != EVICTED])


STOPPING = "stopping"  # the reason code of running work asked to stop (it still holds its GPUs)
_STOP_CAUSES = {"cancelled": "cancelled", "max_duration": "past its max_duration"}  # else the code itself


def stopping_reason(workload: Workload, attempt: Attempt) -> str:
    """Why running work is stopping, and when it is killed if it has not exited: "stopping (held by alice):
    SIGTERM sent at 10:02:03 UTC, SIGKILL at 10:02:33 UTC unless it exits first"."""
    cause = attempt.reason.partition(HOLD_STOPPING)[0].partition(REQUEUE_STOPPING)[0]
    cause = cause or _STOP_CAUSES.get(attempt.stop_reason, attempt.stop_reason) or "cancelled"
    asked = as_utc(attempt.stop_requested_at)
    if asked is None:
        return f"stopping ({cause}): SIGTERM at the next pass"
    if attempt.killed_at is not None:
        return f"stopping ({cause}): SIGKILL sent after its grace period"
    kill = asked + timedelta(seconds=float(workload.spec.get("grace_period", 30.0)))
    return (
        f"stopping ({cause}): SIGTERM sent at {asked:%H:%M:%S} UTC, SIGKILL at {kill:%H:%M:%S} UTC unless it "
        "exits first"
    )


def workload_view(
    workload: Workload, *, detail: bool = False, live: Live | None = None, readiness: Ready | None = None
) -> dict[str, Any]:
    last = workload.attempts[-1] if workload.attempts else None
    reason, reason_code = workload.reason, workload.reason_code
    if workload.state == PENDING and live is not None and workload.id in live:
        reason, reason_code = live[workload.id].message, live[workload.id].code
    running = last is not None and last.state == RUNNING
    if running and last is not None and (last.stop_reason or workload.cancel_requested):
        reason, reason_code = stopping_reason(workload, last), STOPPING
    probed = _readiness_of(workload, last, readiness)  # None: no probe, or not running
    view: dict[str, Any] = {
        "id": workload.id,
        "name": workload.name,
        "kind": workload.kind,
        "queue": workload.queue,
        "user": workload.user,
        "state": workload.state,
        "reason": reason,
        "reason_code": reason_code,
        "priority": workload.priority,
        "preemptible": workload.preemptible,
        # a service's replicas share service_id (replica 0's id, the service's); null for a job
        "service_id": workload.service_id,
        "replica": workload.replica,
        # a job array's tasks share array_id (the first task's id, the array's); null for other work
        "array_id": workload.array_id,
        "array_index": workload.array_index,
        "gpus": workload.gpus,
        "nodes": workload.nodes,
        "max_duration": workload.spec.get("max_duration"),  # seconds an attempt may run; null: no limit
        "node": last.node_name if running and last else None,
        # each rank's node (one for single-node work), in rank order: the running attempt's, or, once the
        # work has ended, its last attempt's (Slurm's NodeList); [] while it waits
        "node_list": attempt_nodes(last) if last and (running or workload.state in TERMINAL) else [],
        "gpu_indices": list(last.gpu_indices) if running and last else [],
        # a running service's address, "host:port"; the head proxies to it (see `service_targets`)
        "endpoint": (last.endpoint or None) if running and last else None,
        # by its readiness probe (the proxy passes requests on only when true); null without a probe
        "ready": probed.ready if probed is not None else None,
        "readiness": probed.detail if probed is not None else None,
        "attempts": len(workload.attempts),
        "restarts": workload.restarts,
        # times a lost node (or one that could not start it) requeued it without using a restart
        "node_failures": workload.node_failures,
        "exit_code": workload.exit_code,
        "cancel_requested": workload.cancel_requested,
        "held": workload.held,
        "created_at": _iso(workload.created_at),
        "started_at": _iso(workload.started_at),
        "finished_at": _iso(workload.finished_at),
        # how long its attempts held their GPUs, in all: not the time it waited between them
        "run_seconds": round(run_seconds(workload.attempts), 3),
        "work_seconds": round(work_seconds(workload), 3),
        "age_seconds": round(age_seconds(workload.created_at), 3),
    }
    if detail:
        view["spec"] = workload.spec
        view["attempt_list"] = [attempt_view(a) for a in workload.attempts]
    return view


HIDDEN: Final = "(hidden)"


def redacted_spec(spec: Mapping[str, Any], *, whole: bool) -> dict[str, Any]:
    """A workload's spec as the API shows it: a notification's signing secret hidden from everyone (its
    owner has it); for a reader who is neither its owner nor an admin (`whole` false) also its
    environment variables' values (where API keys go) and its notification URL's path and query (where a
    chat webhook keeps its secret), as Slurm's PrivateData hides others' jobs' details."""
    shown = dict(spec)
    if shown.get("env") and not whole:
        shown["env"] = dict.fromkeys(shown["env"], HIDDEN)
    notify = shown.get("notify")
    if notify:
        url = str(notify["url"]) if whole else redacted_url(str(notify["url"]))
        shown["notify"] = {**notify, "url": url, **({"secret": HIDDEN} if notify.get("secret") else {})}
    return shown


def submit(
    store: Store, spec: WorkloadSpec, *, user: str = "admin", held: bool = False, admin: bool = True
) -> dict[str, Any]:
    """Validate against the pool, then commit the workload; it is durable when this returns. `held`: it
    waits held until `release` (Slurm's sbatch --hold), a service's replicas and an array's tasks alike.
    A user's (not `admin`) work above its queue's `max_priority` is refused (403)."""
    with store.session() as s:
        if s.scalar(select(Queue.name).where(Queue.name == spec.queue)) is None:
            names = ", ".join(s.scalars(select(Queue.name).order_by(Queue.name))) or "none"
            raise Invalid(
                f"queue {spec.queue!r} does not exist (queues: {names}); "
                f"create it with `gpupool queue create {spec.queue}`",
                field="queue",
                example=DEFAULT_QUEUE,
            )
        if not admin:
            _check_priority_cap(s, spec.queue, spec.priority, "submit")
        lacking = _check_gpu_models(s, spec)
        check_at_submit(s, spec.after)
        secrets.check_at_submit(s, user, spec.secrets)
        if spec.workdir is not None and not Path(spec.workdir).is_absolute():
            raise Invalid(
                f"workdir must be an absolute path, got {spec.workdir!r}",
                field="workdir",
                example="/home/me/project",
            )
        first = Workload(
            name=spec.name or "",
            kind=spec.kind,
            queue=spec.queue,
            user=user,
            priority=spec.priority,
            preemptible=spec.preemptible,
            gpus=str(spec.resources.gpu),
            nodes=spec.nodes,
            spec=spec.model_dump(mode="json"),
            state=PENDING,
            reason="waiting for the scheduler",
            held=held,
            attempts=[],  # new: no query needed to know it has none
        )
        s.add(first)
        s.flush()
        named: dict[str, Any] = {}  # what needs its id, written at once (no second flush of the object)
        if not first.name:
            named["name"] = f"{spec.kind}-{first.id}"
        if held:  # the next pass says so too; the store says it at once
            named["reason"] = f"held at submit; `gpupool release {first.id}` lets it start"
            named["reason_code"] = HELD
        if named:
            table = cast(Table, Workload.__table__)
            s.execute(update_rows(table).where(table.c.id == first.id).values(named))
            for key, value in named.items():
                set_committed_value(first, key, value)
        warnings = {
            "warnings": _placement_warnings(s, spec, first.id)
            + _model_warnings(lacking, spec, first.id)
            + _checkpoint_warnings(s, spec, first.id)
        }
        if spec.array is not None:
            return {**_submit_array(s, first, parse_array(spec.array), user), **warnings}
        if spec.kind != SERVICE:
            _submitted(s, [first], "submitted", user)
            return {**workload_view(first), **warnings}
        first.service_id = first.id
        replicas = [first, *(_replica_like(s, first, r) for r in range(1, spec.replicas))]
        s.flush()
        _submitted(s, replicas, "submitted", user)
        return {**workload_view(first), "replica_ids": [w.id for w in replicas], **warnings}


def _model_warnings(in_pool: list[str] | None, spec: WorkloadSpec, workload_id: int) -> list[str]:
    """What to tell a submitter who asks for GPU models no node of this pool has (`in_pool`: the pool's
    models, from `_check_gpu_models`, None when one asked for is there): accepted, since nodes with them may
    join, but it waits (`no-matching-gpu`) until then, as work pinned to a node that never joined does."""
    if in_pool is None:
        return []
    wanted = spec.resources.gpu.models
    return [
        f"resources.gpu: no node of this pool has {' or '.join(wanted)} GPUs (models here: "
        f"{', '.join(in_pool) or 'none'}); it waits pending until such a node joins: ask for another model, "
        f"or `gpupool cancel {workload_id}`"
    ]


def _checkpoint_warnings(s: Session, spec: WorkloadSpec, workload_id: int) -> list[str]:
    """What to tell a submitter whose `checkpoint.dir` is the one of work pending or running now: both would
    write (and resume from) the same checkpoint and overwrite each other's. Accepted, as a second run
    meant to resume after the first is; an array's tasks each get a folder of their own."""
    given = spec.checkpoint.dir if spec.checkpoint is not None else None
    if not given or spec.array is not None:
        return []
    mine = _checkpoint_path(given, spec.workdir)
    same = [
        wid
        for wid, workdir in s.execute(
            select(Workload.id, Workload.spec["workdir"].as_string()).where(
                Workload.state.in_(ACTIVE),
                Workload.id != workload_id,
                Workload.array_id.is_(None),
                Workload.spec["checkpoint"]["dir"].as_string() == given,
            )
        )
        if _checkpoint_path(given, workdir) == mine
    ]
    if not same:
        return []
    listed = ", ".join(str(w) for w in same[:5]) + (f" and {len(same) - 5} more" if len(same) > 5 else "")
    return [
        f"checkpoint.dir: {mine} is also the checkpoint of workload {listed}, pending or running: both would "
        f"write and resume from it; give this one its own, or `gpupool cancel {workload_id}`"
    ]


def _checkpoint_path(given: str, workdir: str | None) -> str:
    path = Path(given).expanduser()
    if not path.is_absolute() and workdir:
        path = Path(workdir) / path
    return str(path)


def _placement_warnings(s: Session, spec: WorkloadSpec, workload_id: int) -> list[str]:
    """What to tell a submitter whose `placement.nodes` names a node that never joined: the work is
    accepted (an agent may join under that name later, as Kubernetes takes a nodeSelector no node matches
    yet) but waits pending until then, and a typo would look like a queue that never moves."""
    named = spec.placement.nodes
    if not named:
        return []
    known = set(s.scalars(select(Node.name).where(Node.name.in_(named))))
    unknown = [name for name in named if name not in known]
    if not unknown:
        return []
    nodes = sorted(s.scalars(select(Node.name)))
    listed = ", ".join(nodes[:20]) + (f" and {len(nodes) - 20} more" if len(nodes) > 20 else "") or "none"
    which = f"node {unknown[0]!r}" if len(unknown) == 1 else f"nodes {', '.join(map(repr, unknown))}"
    return [
        f"placement.nodes: no {which} in this pool (nodes: {listed}); it waits pending until such a node "
        f"joins: check the name (`gpupool nodes`), or `gpupool cancel {workload_id}`"
    ]


def _submit_array(s: Session, first: Workload, array: ArrayRange, user: str) -> dict[str, Any]:
    """The tasks of a job array, `first` (flushed, with its id: the array's) being the first index's."""
    first.array_id, first.array_index = first.id, array.indices[0]
    tasks = [first]
    for index in array.indices[1:]:
        task = _replica_like(s, first, 0)
        task.array_id, task.array_index = first.id, index
        tasks.append(task)
    s.flush()
    said = [(task, f"submitted: task {task.array_index} of array {first.id}") for task in tasks]
    _add_events(s, said, user)
    return {**workload_view(first), "array_ids": [w.id for w in tasks]}


def _replica_like(s: Session, template: Workload, replica: int) -> Workload:
    """A new pending replica `replica` of `template`'s service, added to `s`."""
    workload = Workload(
        name=template.name,
        kind=template.kind,
        queue=template.queue,
        user=template.user,
        priority=template.priority,
        preemptible=template.preemptible,
        gpus=template.gpus,
        nodes=template.nodes,
        spec=template.spec,
        state=PENDING,
        # held with its service or array (held at submit, or the service held since): released with it
        reason=f"held; `gpupool release {template.id}` lets it start"
        if template.held
        else "waiting for the scheduler",
        reason_code=HELD if template.held else "",
        held=template.held,
        service_id=template.service_id,
        replica=replica,
        attempts=[],
    )
    s.add(workload)
    return workload


def _submitted(s: Session, workloads: list[Workload], reason: str, actor: str) -> None:
    """Each new workload's first event: pending since `reason` (a service's replicas say which they are)."""
    many = len(workloads) > 1 or workloads[0].replica > 0
    _add_events(s, [(w, f"{reason}: replica {w.replica}" if many else reason) for w in workloads], actor)


def _add_events(s: Session, pending_since: list[tuple[Workload, str]], actor: str) -> None:
    """The first event of each new (flushed) workload, with its reason, in one statement: the events are
    never read back in this transaction, so they need no objects (nor a flush of them)."""
    rows = [
        {"object_kind": "workload", "object_id": str(w.id), "from_state": "", "to_state": PENDING,
         "reason": reason, "actor": actor}
        for w, reason in pending_since
    ]  # fmt: skip
    s.execute(insert(cast(Table, Event.__table__)), rows)


def _check_gpu_models(s: Session, spec: WorkloadSpec) -> list[str] | None:
    """Refuse a GPU model that no node has and no catalog knows (a typo would otherwise wait forever). The
    pool's models when it has none of those asked for (a known model: `_model_warnings` says so), else
    None."""
    wanted = spec.resources.gpu.models
    if not wanted:
        return None
    in_pool = {m.upper() for m in s.scalars(select(Gpu.model).distinct())}
    known = {m.upper() for m in families()} | in_pool
    unknown = [m for m in wanted if split_model(m)[0] not in known]
    if unknown:
        raise Invalid(
            f"resources.gpu: unknown GPU model {unknown[0]!r}; models in this pool: "
            f"{', '.join(sorted(in_pool)) or 'none'}; known models: {', '.join(sorted(known))}",
            field="resources.gpu",
            example="H100:8",
        )
    if any(split_model(m)[0] in in_pool for m in wanted):
        return None
    return sorted(in_pool)


def owner_of(store: Store, workload_id: int) -> str:
    """Who submitted the workload (its `user`: the name of the token that submitted it)."""
    with store.read() as s:
        return _load(s, workload_id).user


MAX_LISTED_IDS: Final = 1000  # ids one listing may name (`id=` repeated in the query)
PRIVATE: Final = "private"
PUBLIC: Final = "public"


@dataclass(frozen=True, slots=True)
class Access:
    """Who may reach a workload through the head's proxy (spec `access`): its owner and admins (private),
    any token of the head (pool), or anyone (public). A job is private: the proxy refuses it anyway."""

    owner: str
    access: str


def access_of(store: Store, workload_id: int) -> Access | None:
    """Who may reach the workload `workload_id` through the proxy; None when there is no such workload."""
    if not 0 < workload_id <= MAX_ID:
        return None
    with store.read() as s:
        workload = s.get(Workload, workload_id)
        if workload is None:
            return None
        access = (workload.spec or {}).get("access") if workload.kind == SERVICE else None
        return Access(workload.user, access or PRIVATE)


def _load(s: Session, workload_id: int) -> Workload:
    # An id past a 64-bit integer would reach the database as an error instead of a miss.
    workload = s.get(Workload, workload_id) if 0 < workload_id <= MAX_ID else None
    if workload is None:
        raise NotFound(f"no workload with id {workload_id}; list them with `gpupool ps --all`")
    return workload


def _load_service(s: Session, workload_id: int, what_only_a_service: str) -> Workload:
    """The workload `workload_id`, refused (409, naming the field `kind`) when it is a job."""
    workload = _load(s, workload_id)
    if workload.kind != SERVICE:
        raise Conflict(
            f"workload {workload.id} ({workload.name}) is a job; only a service {what_only_a_service}",
            field="kind",
        )
    return workload


def _replicas(s: Session, workload: Workload) -> list[Workload]:
    """Every replica of `workload`'s service, ended ones included, by replica number (newest last); a job
    alone."""
    if workload.service_id is None:
        return [workload]
    return list(
        s.scalars(
            select(Workload)
            .where(Workload.service_id == workload.service_id)
            .order_by(Workload.replica, Workload.id)
        )
    )


def _tasks(s: Session, array_id: int) -> list[Workload]:
    """Every task of the job array `array_id`, by index."""
    return list(
        s.scalars(select(Workload).where(Workload.array_id == array_id).order_by(Workload.array_index))
    )


def _named(s: Session, workload: Workload, task: bool) -> tuple[list[Workload], bool]:
    """What an id names for cancel, hold, release and update: a service's replicas, a job array's tasks
    by the array's id (unless `task`: its first task alone), else the workload; and whether it named a
    whole array."""
    if workload.array_id == workload.id and not task:
        return _tasks(s, workload.id), True
    return _replicas(s, workload), False


def _count_states(workloads: list[Workload]) -> dict[str, int]:
    """How many of `workloads` are in each state, "total" too."""
    counts = {"total": len(workloads)}
    for w in workloads:
        counts[w.state] = counts.get(w.state, 0) + 1
    return counts


def _active(replicas: list[Workload]) -> list[Workload]:
    """Those pending or running, stopping ones included."""
    return [w for w in replicas if w.state not in TERMINAL]


def _kept(replicas: list[Workload]) -> list[Workload]:
    """Those pending or running that nobody asked to stop: the replicas a service has."""
    return [w for w in replicas if w.state not in TERMINAL and not w.cancel_requested]


def replica_view(workload: Workload, readiness: Ready | None = None) -> dict[str, Any]:
    """One replica as a service's detail lists it."""
    last = workload.attempts[-1] if workload.attempts else None
    running = last is not None and last.state == RUNNING
    probed = _readiness_of(workload, last, readiness)
    stopping = running and last is not None and bool(last.stop_reason or workload.cancel_requested)
    return {
        "id": workload.id,
        "replica": workload.replica,
        "state": workload.state,
        "reason": stopping_reason(workload, last) if stopping and last is not None else workload.reason,
        "stopping": stopping,  # asked to stop (scaled down, cancelled), still running until it has
        "node": last.node_name if running and last else None,
        "endpoint": (last.endpoint or None) if running and last else None,
        "ready": probed.ready if probed is not None else None,
        "attempts": len(workload.attempts),
        "restarts": workload.restarts,
    }


@dataclass(frozen=True, slots=True)
class ServiceTarget:
    """Where the head's proxy reaches a running service."""

    endpoint: str  # "host:port"
    described: str  # how messages name it: the service, its attempt, node and endpoint
    workload_id: int  # the replica's workload (the prober's word is by workload and attempt)
    attempt: int  # the running attempt's number
    probed: bool  # it declares a readiness_probe: requests pass only while the prober says ready


def service_targets(
    store: Store,
    workload_id: int,
    readiness: Ready | None = None,
    live: Live | None = None,
    restart_backoff: float = DEFAULT_BASE,
) -> tuple[ServiceTarget, ...]:
    """Where the replicas of the service `workload_id` names (any of its replicas' ids) listen and take
    requests now, for the head's proxy, by replica number; a clear refusal when none does: not a service,
    ended, or none of its replicas running and ready (each one's reason said, pending ones' as the control
    loop explains them now (`live`); `NotServing.retry_at` when one's crash-loop backoff ends, read with the
    head's `restart_backoff`)."""
    with store.read() as s:
        workload = _load_service(
            s, workload_id, "has an endpoint to reach through the proxy: submit it with kind: service "
            "(or `gpupool run --service`)"
        )  # fmt: skip
        replicas = _replicas(s, workload)
        active = _active(replicas)
        if len(replicas) == 1 or len(active) <= 1:
            one = active[0] if active else workload
            name = f"service {one.name} (workload {one.id})"
            return (_target_of(one, name, readiness, live, restart_backoff),)
        targets: list[ServiceTarget] = []
        refusals: list[str] = []
        retry_at: list[float] = []
        for replica in active:
            if replica.cancel_requested:  # stopping: it finishes what it has, and takes nothing new
                refusals.append(f"{_replica_name(replica)} is stopping")
                continue
            try:
                targets.append(_target_of(replica, _replica_name(replica), readiness, live, restart_backoff))
            except ServiceError as exc:
                refusals.append(exc.message)
                if isinstance(exc, NotServing) and exc.retry_at is not None:
                    retry_at.append(exc.retry_at)
        if not targets:
            raise NotServing(
                f"none of the {len(active)} replicas of service {workload.name} (workload "
                f"{workload.service_id}) takes requests now: " + "; ".join(refusals),
                retry_at=min(retry_at, default=None),
            )
        return tuple(targets)


class NotServing(Unavailable):
    """A service that takes no requests now; `retry_at` (Unix seconds): when it may, where that is known
    (the end of a crash-loop backoff), for the proxy's Retry-After."""

    def __init__(self, message: str, *, retry_at: float | None = None) -> None:
        super().__init__(message)
        self.retry_at = retry_at


def _replica_name(workload: Workload) -> str:
    return f"service {workload.name} replica {workload.replica} (workload {workload.id})"


def _pending_reason(workload: Workload, live: Live | None) -> tuple[str, str]:
    """Why pending work waits, as the control loop explains it now (`live`), else as last stored: the
    reason and its code."""
    explained = live.get(workload.id) if live is not None else None
    if explained is not None:
        return explained.message, explained.code
    return workload.reason, workload.reason_code


def _backoff_end(workload: Workload, restart_backoff: float) -> float | None:
    """When pending work waiting out a crash-loop backoff may start again (Unix seconds)."""
    ended = []
    for a in sorted(workload.attempts, key=lambda a: a.number):
        unstarted = a.pid is None and a.state == FAILED  # its node could not start it, as the loop reads it
        stop = a.stop_reason or ""
        ended.append(Ended(a.started_at, a.finished_at, a.exit_code, stop, unstarted, a.reason or ""))
    waiting = backoff(ended, restart_backoff)
    return waiting.until if waiting is not None else None


def _target_of(
    workload: Workload,
    name: str,
    readiness: Ready | None,
    live: Live | None = None,
    restart_backoff: float = DEFAULT_BASE,
) -> ServiceTarget:
    """Where one replica listens (`name`: how messages name it), or why it takes no requests now."""
    if workload.state in TERMINAL:
        raise Conflict(f"{name} has ended ({workload.state}) and runs no more: submit it again")
    last = workload.attempts[-1] if workload.attempts else None
    if workload.state != RUNNING or last is None or last.state != RUNNING:
        reason, code = _pending_reason(workload, live) if workload.state == PENDING else ("", "")
        why = f": {reason}" if reason else ""
        retry_at = _backoff_end(workload, restart_backoff) if code == RESTART_BACKOFF else None
        raise NotServing(
            f"{name} is {workload.state}{why}; it has no running attempt to proxy to yet: try again "
            f"when `gpupool show {workload.id}` says running",
            retry_at=retry_at,
        )
    if not last.endpoint and last.pid is None:
        # The attempt is stored before its process is launched; the backend gives the address after.
        raise Unavailable(
            f"{name}: attempt {last.number} is starting (its process is being launched, and its address "
            "is known once it runs); try again in a moment"
        )
    if not last.endpoint:
        raise Unavailable(
            f"{name}: attempt {last.number} started before gpupool recorded service endpoints; it gets "
            "one when it starts again"
        )
    probed = _readiness_of(workload, last, readiness)
    if probed is not None and not probed.ready:
        path = workload.spec["readiness_probe"]
        raise Unavailable(
            f"{name} is not ready: its readiness probe, for attempt {last.number}, {probed.detail}; the "
            f"proxy passes requests on once GET {path} answers 2xx or 3xx"
        )
    described = f"{name}, attempt {last.number} on {last.node_name} at {last.endpoint}"
    return ServiceTarget(last.endpoint, described, workload.id, last.number, probed is not None)


def get_workload(
    store: Store, workload_id: int, live: Live | None = None, readiness: Ready | None = None
) -> dict[str, Any]:
    with store.read() as s:
        workload = _load(s, workload_id)
        view = workload_view(workload, detail=True, live=live, readiness=readiness)
        if view["state"] == PENDING and NOTHING_TO_RECLAIM in (view["reason"] or ""):
            # which work of other queues reclaim may not take, and until when (`gpupool why`)
            view["reclaim_blockers"] = reclaim_blockers(s, workload.queue)
        if workload.kind == SERVICE:
            replicas = _replicas(s, workload)
            view["replicas"] = len(_kept(replicas))
            view["replica_list"] = [replica_view(w, readiness) for w in replicas]
        if workload.array_id is not None:
            tasks = _tasks(s, workload.array_id)
            view["array_tasks"] = _count_states(tasks)
            if workload.array_id == workload.id:  # the array's own id: its tasks listed
                view["task_list"] = [
                    {"id": t.id, "index": t.array_index, "state": t.state, "reason": t.reason} for t in tasks
                ]
        view["events"] = [
            {"at": _iso(e.at), "from": e.from_state, "to": e.to_state, "reason": e.reason, "actor": e.actor}
            for e in s.scalars(
                select(Event)
                .where(Event.object_kind == "workload", Event.object_id == str(workload_id))
                .order_by(Event.id)
            )
        ]
        return view


def list_workloads(
    store: Store,
    *,
    include_finished: bool = False,
    state: str | None = None,
    queue: str | None = None,
    user: str | None = None,
    name: str | None = None,
    since: datetime | None = None,
    ids: Sequence[int] | None = None,
    limit: int = 1000,
    live: Live | None = None,
    readiness: Ready | None = None,
) -> list[dict[str, Any]]:
    """Workloads oldest first: the newest `limit` of those matching (submitted at or after `since`; among
    `ids`, when given; of `name`: a service's replicas and an array's tasks share theirs)."""
    if ids is not None and len(ids) > MAX_LISTED_IDS:
        raise Invalid(f"{len(ids)} ids: at most {MAX_LISTED_IDS} in one request; ask in parts", field="id")
    states = _states(state)
    with store.read() as s:
        query = select(Workload).order_by(Workload.id.desc()).limit(limit)
        if since is not None:
            query = query.where(Workload.created_at >= as_utc(since))
        if states:
            query = query.where(Workload.state.in_(states))
        elif not include_finished:
            query = query.where(Workload.state.in_(ACTIVE))
        if queue is not None:
            query = query.where(Workload.queue == queue)
        if user is not None:
            query = query.where(Workload.user == user)
        if name is not None:
            query = query.where(Workload.name == name)
        if ids is not None:
            query = query.where(Workload.id.in_([i for i in ids if 0 < i <= MAX_ID]))
        return [workload_view(w, live=live, readiness=readiness) for w in reversed(s.scalars(query).all())]


def _states(asked: str | None) -> list[str]:
    """The states `asked` names: one, or several with commas (`pending,running`, as squeue's -t), in any
    case; none when None."""
    if asked is None:
        return []
    states = [part.strip().lower() for part in asked.split(",")]
    for state in states:
        if state not in STATES:
            slurm = SLURM_STATES.get(state)
            hint = f" (Slurm's {state.upper()} is {slurm})" if slurm else ""
            raise Invalid(
                f"unknown state {state!r}{hint}; one of {', '.join(STATES)}, or several with commas "
                "(pending,running)",
                field="state",
            )
    return states


# Slurm's job state codes (squeue -t), for the hint when one is given as a state
SLURM_STATES: Final = {
    "pd": "pending", "r": "running", "cg": "running (stopping)", "cd": "succeeded", "f": "failed",
    "ca": "cancelled", "to": "failed (reason_code timeout)", "nf": "failed", "pr": "pending (requeued)",
}  # fmt: skip


def cancel(
    store: Store, workload_id: int, *, actor: str = "admin", task: bool = False, why: str | None = None
) -> dict[str, Any]:
    """A pending workload is cancelled at once; a running one is stopped by the control loop. A service is
    cancelled whole: the id of any of its replicas cancels them all (`gpupool scale` removes some). A job
    array is cancelled whole by its id (its first task's, as Slurm's scancel of an array's id), unless
    `task`; any other task's id cancels that task alone. `why`: the reason, when not a person's request
    (control/idle.py), recorded in each workload's history."""
    for _ in range(5):
        try:
            with store.session() as s:
                workload = _load(s, workload_id)
                group, whole_array = _named(s, workload, task)
                active = _active(group)
                if not active:
                    raise Conflict(f"workload {workload_id} {_standing(workload)}; nothing to cancel")
                for replica in active:
                    if (
                        replica.state == RUNNING and not replica.cancel_requested
                    ):  # its stop ends it cancelled
                        note(s, replica, why or f"cancel asked by {actor}: stopping it", actor=actor)
                        for attempt in replica.attempts:  # who, for the reason it ends with
                            if attempt.state == RUNNING:
                                # "cancelled by idle: its GPUs ...", not "cancelled by idle: idle: ..."
                                said = why.removeprefix(f"{actor}: ") if why else ""
                                attempt.reason = f"cancelled by {actor}" + (f": {said}" if said else "")
                    # one that ran before (held, preempted) and waits again did start
                    waited = "while it waited" if replica.attempts else "before it started"
                    _cancel_one(s, replica, why or f"cancelled by {actor} {waited}", actor)
                s.flush()
                view = workload_view(workload)
                if workload.kind == SERVICE:
                    view["cancelled_replicas"] = [w.id for w in active]
                if whole_array:
                    view["cancelled_tasks"] = [w.id for w in active]
                return view
        except StaleDataError:
            continue  # the control loop changed it at the same moment: read again and decide again
    raise Conflict(f"workload {workload_id} is changing state; try again")


def hold(
    store: Store,
    workload_id: int,
    *,
    actor: str = "admin",
    task: bool = False,
    why: str | None = None,
    admin: bool = False,
) -> dict[str, Any]:
    """Keep work pending, out of the scheduler's reach, until `release` (Slurm's scontrol hold, Run:ai's
    suspend). Running work is stopped first (SIGTERM, then SIGKILL after its grace period), like a
    preemption that uses no restart, and waits pending. It names what `cancel` would: a service whole, a
    job array whole by its id (unless `task`). `why`: the reason, when not a person's request
    (control/idle.py). `admin`: an admin holds it, and only an admin may release it (an admin's hold of
    work held already makes it theirs). Returns the workload, with `held_ids` (all it names) and
    `changed_ids` (those not held before: none when all were)."""
    return _set_held(store, workload_id, True, actor, task, why, admin)


def release(
    store: Store, workload_id: int, *, actor: str = "admin", task: bool = False, admin: bool = False
) -> dict[str, Any]:
    """Let held work be scheduled again (Slurm's scontrol release, Run:ai's resume); `changed_ids`: those
    that were held (none: nothing to release). Work an admin held takes an admin (`admin`): 403."""
    return _set_held(store, workload_id, False, actor, task, admin=admin)


def _set_held(
    store: Store,
    workload_id: int,
    held: bool,
    actor: str,
    task: bool,
    why: str | None = None,
    admin: bool = False,
) -> dict[str, Any]:
    changed: list[int] = []

    def check(s: Session, named: Workload, active: list[Workload]) -> None:
        changed.clear()  # a try the control loop raced is made again from the start
        if held or admin:
            return
        by_admin = [w.id for w in active if w.held and w.held_by_admin]
        if by_admin:
            raise Forbidden(
                f"{'workload' if len(by_admin) == 1 else 'workloads'} {', '.join(map(str, by_admin))} "
                f"{'was' if len(by_admin) == 1 else 'were'} held by an admin "
                f"(gpupool show {by_admin[0]} says who): only an admin may release it, as Slurm's admin "
                "hold; ask them",
                field="held",
            )

    def change(s: Session, w: Workload) -> None:
        if w.held == held:
            if held and admin and not w.held_by_admin:  # a user's hold becomes an admin's
                w.held_by_admin = True
                note(s, w, f"held by {actor} (an admin: only an admin releases it)", actor=actor)
            return
        changed.append(w.id)
        w.held = held
        w.held_by_admin = held and admin
        said = why or (f"held by {actor}" if held else f"released by {actor}")
        if held and w.state == RUNNING:
            said += HOLD_STOPPING
            for attempt in w.attempts:
                if attempt.state == RUNNING and attempt.stop_requested_at is None:
                    attempt.stop_reason = STOP_HOLD  # the control loop stops it
                    attempt.reason = said
        elif held:  # the next pass says so too; the store says it at once
            w.reason, w.reason_code = f"{said}; `gpupool release {w.id}` lets it start", HELD
        else:
            for attempt in w.attempts:  # held and released before the loop stopped it: it runs on
                if attempt.stop_reason == STOP_HOLD and attempt.stop_requested_at is None:
                    attempt.stop_reason, attempt.reason = "", ""
        note(s, w, said, actor=actor)

    view, ids = _change_named(store, workload_id, task, "hold" if held else "release", change, check)
    return {**view, "held": held, "held_ids": ids, "changed_ids": changed}


def requeue(store: Store, workload_id: int, *, actor: str = "admin", task: bool = False) -> dict[str, Any]:
    """Send running work back to pending for the scheduler to place again (Slurm's scontrol requeue): each
    running attempt is stopped (SIGTERM, then SIGKILL after its grace period) and the work waits pending,
    to resume from its checkpoint wherever the next pass puts it; unlike `hold`, nothing keeps it waiting.
    It names what `cancel` names; pending work among it stays as it is, and a name with nothing running is
    refused (409). Returns the workload, with `requeued_ids`."""
    said = f"requeued by {actor}"
    requeued: list[int] = []

    def check(s: Session, named: Workload, active: list[Workload]) -> None:
        del s
        requeued.clear()  # once per try of the transaction (a retried one starts again)
        if not any(w.state == RUNNING for w in active):
            waits = (
                f"it is held: `gpupool release {named.id}` lets it start"
                if named.held
                else f"it waits for the scheduler: `gpupool why {named.id}` says why"
            )
            raise Conflict(f"workload {named.id} is pending, not running; nothing to requeue ({waits})")

    def change(s: Session, w: Workload) -> None:
        stopping = [a for a in w.attempts if a.state == RUNNING and a.stop_requested_at is None]
        if w.state != RUNNING or not stopping or stopping[0].stop_reason:
            return  # pending, or already stopping for a hold, a drain, a requeue or an eviction
        for attempt in stopping:
            attempt.stop_reason = STOP_REQUEUE  # the control loop stops it
            attempt.reason = said + REQUEUE_STOPPING
        requeued.append(w.id)
        note(s, w, said + REQUEUE_STOPPING, actor=actor)

    view, _ = _change_named(store, workload_id, task, "requeue", change, check)
    return {**view, "requeued_ids": requeued}


@dataclass(frozen=True)
class TimeLimit:
    """A new `max_duration` for `update`: seconds, or None for no limit."""

    seconds: float | None


def update(
    store: Store,
    workload_id: int,
    *,
    priority: int | None = None,
    limit: TimeLimit | None = None,
    queue: str | None = None,
    actor: str = "admin",
    task: bool = False,
    admin: bool = True,
    refuse: Callable[[WorkloadSpec], None] | None = None,
) -> dict[str, Any]:
    """Change pending or running work, as Slurm's scontrol update: its priority (0..1000; the next pass
    orders and preempts by it; whether it is preemptible stays as submitted), its time limit (TimeLimit=)
    and, while it waits, its queue (Partition=). A running attempt's limit counts from its start, so one
    already past a new limit is stopped at the next pass (SIGTERM, then SIGKILL after its grace period) and
    ends as `max_duration` ends it; a backfill reservation reads the new limit at the next pass too. Only
    pending work moves to another queue: of a job array, its pending tasks (those running finish where
    they are); a service, only with no replica running. The GPU-hours of attempts that ran before stay
    with the queue they ran in (Attempt.queue). Everything is checked before anything changes, and all
    changes in one transaction. It names what `cancel` names: a service whole, a job array whole by its
    id (unless `task`). Where the caller is not an admin (`admin` False), raising a priority, or raising
    or removing a time limit, is refused (403), as Slurm lets users only lower them. `refuse` (the
    backend's `refuse`) sees each changed spec with its new time limit, as at submit: what the backend can
    never run (a max_duration past a Slurm partition's MaxTime) is refused, and nothing changes."""
    if priority is None and limit is None and queue is None:
        raise Invalid("give a priority, a max_duration or a queue to change", field="priority", example="100")
    if priority is not None and not 0 <= priority <= MAX_PRIORITY:
        raise Invalid(
            f"priority must be 0..{MAX_PRIORITY} or a class name ({', '.join(PRIORITY_CLASSES)}), got "
            f"{priority}",
            field="priority",
            example="100",
        )
    seconds = None if limit is None else limit.seconds
    if seconds is not None and not seconds > 0:
        raise Invalid(
            f"max_duration must be longer than 0 seconds, or none for no limit, got {seconds:g}",
            field="max_duration",
            example="12h",
        )

    moved: list[int] = []

    def check(s: Session, named: Workload, active: list[Workload]) -> None:
        moved.clear()  # once per try of the transaction (a retried one starts again)
        if not admin:
            for w in active:
                _check_not_raised(w, priority, limit)
            moving = [w.priority if priority is None else priority for w in active if w.state == PENDING]
            if queue is not None and moving:
                _check_priority_cap(s, queue, max(moving), "move")
        if queue is not None:
            _check_move(s, named, active, queue)
        if refuse is not None and limit is not None:
            for w in active:
                _refused_by_backend(refuse, w, seconds)

    def change(s: Session, w: Workload) -> None:
        if priority is not None and w.priority != priority:
            note(s, w, f"priority {w.priority} -> {priority} by {actor}", actor=actor)
            w.priority = priority
        before = w.spec.get("max_duration")
        if limit is not None and before != seconds:
            note(s, w, f"max_duration {_limit(before)} -> {_limit(seconds)} by {actor}", actor=actor)
            w.spec = {**w.spec, "max_duration": seconds}  # a new dict: the JSON column sees the change
        if queue is not None and w.state == PENDING:
            moved.append(w.id)
            if w.queue != queue:
                note(s, w, f"queue {w.queue} -> {queue} by {actor}", actor=actor)
                w.queue = queue
                w.spec = {**w.spec, "queue": queue}

    verb = "change the priority of" if limit is None and queue is None else "change"
    view, ids = _change_named(store, workload_id, task, verb, change, check)
    return {**view, "updated_ids": ids, **({"moved_ids": moved} if queue is not None else {})}


def _refused_by_backend(refuse: Callable[[WorkloadSpec], None], w: Workload, seconds: float | None) -> None:
    """Raise the backend's SpecError where it could never run `w` with a time limit of `seconds`."""
    try:
        changed = parse_workload_spec({**w.spec, "max_duration": seconds})
    except SpecError:
        return  # a spec stored by an older version that reads differently now: the backend says at start
    refuse(changed)


def _check_priority_cap(s: Session, queue: str, priority: int, done: str) -> None:
    """Refuse (403) a user's work above its queue's `max_priority`."""
    spec = s.scalar(select(Queue.spec).where(Queue.name == queue)) or {}
    cap = spec.get("max_priority")
    if cap is not None and priority > cap:
        raise Forbidden(
            f"priority: queue {queue} takes work up to priority {cap} from users (its max_priority), and "
            f"this would {done} work at {priority}; ask for {cap} or less, or ask an admin",
            field="priority",
        )


def _check_not_raised(w: Workload, priority: int | None, limit: TimeLimit | None) -> None:
    """Refuse (403) a user's raise of `w`'s priority or time limit: an admin's to give (Slurm's rule), so
    that what an admin lowered stays lowered, and nobody outranks their teammates' work by an update."""
    if priority is not None and priority > w.priority:
        raise Forbidden(
            f"priority: raising workload {w.id}'s priority ({w.priority} -> {priority}) takes an admin, as "
            "Slurm's scontrol update Priority=; you may lower it, or ask an admin",
            field="priority",
        )
    before = w.spec.get("max_duration")
    if limit is not None and before is not None and (limit.seconds is None or limit.seconds > before):
        raise Forbidden(
            f"max_duration: raising or removing workload {w.id}'s time limit ({_limit(before)} -> "
            f"{_limit(limit.seconds)}) takes an admin, as Slurm's scontrol update TimeLimit=; you may "
            "shorten it, or ask an admin",
            field="max_duration",
        )


def _check_move(s: Session, named: Workload, active: list[Workload], queue: str) -> None:
    """Refuse to move work to `queue` (409, or 422 for a queue that does not exist) where nothing named
    is pending, or where a service would be split between queues."""
    if s.scalar(select(Queue.id).where(Queue.name == queue)) is None:
        names = ", ".join(s.scalars(select(Queue.name).order_by(Queue.name))) or "none"
        raise Invalid(
            f"queue {queue!r} does not exist (queues: {names}); create it with `gpupool queue create "
            f"{queue}`",
            field="queue",
            example=DEFAULT_QUEUE,
        )
    running = [w for w in active if w.state != PENDING]
    if not running:
        return
    if named.kind == SERVICE:
        raise Conflict(
            f"service {named.name} (workload {named.service_id}) has {len(running)} replica"
            f"{'s' if len(running) != 1 else ''} running; a service moves to another queue only while none "
            f"runs: `gpupool hold {named.service_id}`, update, then `gpupool release {named.service_id}`",
            field="queue",
        )
    if len(running) == len(active):
        what = f"job array {named.array_id}'s tasks are all" if len(active) > 1 else f"workload {named.id} is"
        raise Conflict(
            f"{what} running; only pending work moves to another queue (as Slurm's Partition=): "
            f"`gpupool hold {named.id}` stops it (from its checkpoint if it has one), then update and "
            f"`gpupool release {named.id}`",
            field="queue",
        )


def set_priority(
    store: Store, workload_id: int, priority: int, *, actor: str = "admin", task: bool = False
) -> dict[str, Any]:
    """`update` of the priority alone."""
    return update(store, workload_id, priority=priority, actor=actor, task=task)


def _limit(seconds: float | None) -> str:
    return "none" if seconds is None else format_duration(seconds)


def _standing(workload: Workload) -> str:
    """Where a workload that cannot be changed stands, to follow its name: "has succeeded", "was cancelled",
    "is running and stopping"."""
    if workload.state == CANCELLED:
        return "was cancelled"
    if workload.state in TERMINAL:
        return f"has {workload.state}"
    return f"is {workload.state}" + (" and stopping" if workload.cancel_requested else "")


def _change_named(
    store: Store,
    workload_id: int,
    task: bool,
    verb: str,
    change: Callable[[Session, Workload], None],
    check: Callable[[Session, Workload, list[Workload]], None] | None = None,
) -> tuple[dict[str, Any], list[int]]:
    """`change` each pending or running workload that `workload_id` names (see `_named`) and nobody asked
    to stop, in one transaction, once `check` (given the named workload and those) has not refused; the
    named workload's view and the ids changed. 409 when none is left."""
    for _ in range(5):
        try:
            with store.session() as s:
                workload = _load(s, workload_id)
                group, _ = _named(s, workload, task)
                active = [w for w in _active(group) if not w.cancel_requested]
                if not active:
                    raise Conflict(f"workload {workload_id} {_standing(workload)}; nothing to {verb}")
                if check is not None:
                    check(s, workload, active)
                for w in active:
                    change(s, w)
                s.flush()
                return workload_view(workload), [w.id for w in active]
        except StaleDataError:
            continue  # the control loop changed it at the same moment: read again and decide again
    raise Conflict(f"workload {workload_id} is changing state; try again")


def _cancel_one(s: Session, workload: Workload, reason: str, actor: str) -> None:
    workload.cancel_requested = True
    if workload.state == PENDING:
        transition(s, workload, CANCELLED, reason, actor=actor)


def _removal_rank(workload: Workload, readiness: Ready | None, live: Live | None) -> int:
    """How much a replica serves, for a scale-down, which removes the least first: 0 running and ready
    (by its probe, or without one), 1 running but not ready (or not probed yet: `readiness` None counts
    every running one alike), 2 waiting out a crash-loop backoff, 3 waiting for the scheduler."""
    last = workload.attempts[-1] if workload.attempts else None
    if workload.state == RUNNING:
        probed = _readiness_of(workload, last, readiness) if readiness is not None else None
        return 1 if probed is not None and not probed.ready else 0
    return 2 if _pending_reason(workload, live)[1] == RESTART_BACKOFF else 3


def scale(
    store: Store,
    workload_id: int,
    replicas: int,
    *,
    actor: str = "admin",
    why: str | None = None,
    readiness: Ready | None = None,
    live: Live | None = None,
) -> dict[str, Any]:
    """Run `replicas` copies of the service `workload_id` names: new ones (the lowest replica numbers
    free) pending for the scheduler, or some cancelled, those that serve least first (`_removal_rank`,
    by the prober's word `readiness` and the loop's `live` reasons), the highest numbers first among
    equals (each running one stopped with its grace period); never replica 0, the service's own (its id
    is the service's, which `gpupool show`, the proxy's address and the service's history go by).
    `why` is the autoscaler's reason (control/autoscale.py); without it, a person asked, which a service
    with `scaling` in its spec refuses (the autoscaler would undo it). Returns the service's detail."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise Invalid(
            f"replicas must be 1..{MAX_REPLICAS}, got {replicas}"
            + ("; to stop a service, cancel it" if replicas < 1 else ""),
            field="replicas",
            example="2",
        )
    for _ in range(5):
        try:
            with store.session() as s:
                workload = _load_service(
                    s, workload_id, "has replicas (kind: service, or `gpupool run --service --replicas N`)"
                )
                group = _replicas(s, workload)
                kept = _kept(group)
                if not kept:
                    raise Conflict(
                        f"service {workload.name} (workload {workload.service_id}) has ended or is "
                        f"stopping ({workload.state}); submit it again with replicas: {replicas}"
                    )
                scaling = kept[0].spec.get("scaling")
                if why is None and scaling:
                    raise Conflict(
                        f"service {workload.name} (workload {workload.service_id}) scales itself between "
                        f"{scaling['min']} and {scaling['max']} replicas by {scaling['metric']} (its spec's "
                        f"scaling); change its range instead, e.g. `gpupool scale {workload.service_id} "
                        f"{replicas}..{max(scaling['max'], replicas)}` for at least {replicas}",
                        field="replicas",
                    )
                reason = why or f"scaled to {replicas_said(replicas)} by {actor}"
                spec = {**kept[0].spec, "replicas": replicas}
                for replica in kept:
                    replica.spec = spec
                held = {w.replica for w in _active(group)}  # a stopping one's number is not free yet
                free = (r for r in range(MAX_REPLICAS + len(held)) if r not in held)
                added = [_replica_like(s, kept[0], next(free)) for _ in range(replicas - len(kept))]
                if added:
                    s.flush()
                    _submitted(s, added, reason, actor)
                # Kept: replica 0 (the service's own id), then those that serve most, the lowest numbers
                # first among equals.
                ranked = sorted(
                    kept, key=lambda w: (w.replica != 0, _removal_rank(w, readiness, live), w.replica)
                )
                removed = ranked[replicas:]
                for replica in removed:
                    _cancel_one(s, replica, reason, actor)
                    if replica.state == RUNNING:  # it stops with its grace period: say why in its history
                        replica.reason = f"stopping: {reason}"
                        note(s, replica, replica.reason, actor=actor)
                head = next((w for w in kept if w.replica == 0), None)
                if head is not None and (added or removed) and head not in removed:
                    note(s, head, reason, actor=actor)  # the service's own history says each change
                if removed or head is not None:
                    s.flush()
                service_id = workload.service_id or workload.id
        except StaleDataError:
            continue  # the control loop changed a replica at the same moment: read again, decide again
        return get_workload(store, service_id)
    raise Conflict(f"service {workload_id} is changing state; try again")


def replicas_said(count: int) -> str:
    """ "1 replica", "3 replicas"."""
    return f"{count} replica" if count == 1 else f"{count} replicas"


def scale_range(
    store: Store, workload_id: int, low: int, high: int, *, actor: str = "admin"
) -> dict[str, Any]:
    """Set the range `low..high` within which the autoscaler keeps the service `workload_id` names (one
    with `scaling` in its spec); a count outside the new range is brought into it at once. Returns the
    service's detail."""
    if not 1 <= low <= high <= MAX_REPLICAS:
        raise Invalid(
            f"replicas {low}..{high} is not a range MIN..MAX with 1 <= MIN <= MAX <= {MAX_REPLICAS}",
            field="replicas",
            example="2..6",
        )
    reason = f"scaling range set to {low}..{high} by {actor}"
    for _ in range(5):
        try:
            with store.session() as s:
                workload = _load_service(s, workload_id, "has replicas to scale")
                kept = _kept(_replicas(s, workload))
                if not kept:
                    raise Conflict(
                        f"service {workload.name} (workload {workload.service_id}) has ended or is "
                        f"stopping ({workload.state}); submit it again with replicas: {low}..{high}"
                    )
                scaling = kept[0].spec.get("scaling")
                if not scaling:
                    raise Conflict(
                        f"service {workload.name} (workload {workload.service_id}) runs a fixed number of "
                        f"replicas (no scaling in its spec): give a number, e.g. `gpupool scale "
                        f"{workload.service_id} {low}`",
                        field="replicas",
                    )
                spec = {**kept[0].spec, "scaling": {**scaling, "min": low, "max": high}}
                for replica in kept:
                    replica.spec = spec
                head = kept[0]
                note(s, head, reason, actor=actor)
                count, service_id = len(kept), head.service_id or head.id
        except StaleDataError:
            continue  # the control loop changed a replica at the same moment: read again, decide again
        clamped = min(high, max(low, count))
        if clamped != count:
            return scale(
                store, service_id, clamped, actor=actor, why=f"scaled to {replicas_said(clamped)}: {reason}"
            )
        return get_workload(store, service_id)
    raise Conflict(f"service {workload_id} is changing state; try again")


@dataclass(frozen=True, slots=True)
class Autoscaled:
    """A service whose spec has `scaling`, as the autoscaler sees it."""

    service_id: int
    name: str
    ids: tuple[int, ...]  # its replicas' ids, pending or running: a request may name any of them
    replicas: int  # pending or running, not asked to stop
    scaling: dict[str, Any]  # the spec's `scaling`, as stored


def autoscaled(store: Store) -> list[Autoscaled]:
    """The services with `scaling` in their spec that still run (some replica not asked to stop)."""
    groups: dict[int, list[Workload]] = {}
    with store.read() as s:
        for w in s.scalars(
            select(Workload)
            .where(Workload.kind == SERVICE, Workload.state.in_(sorted(ACTIVE)))
            .order_by(Workload.id)
        ):
            groups.setdefault(w.service_id or w.id, []).append(w)
    found = []
    for service_id, group in groups.items():
        kept = _kept(group)
        scaling = kept[0].spec.get("scaling") if kept else None
        if scaling:
            ids = tuple(w.id for w in group)
            found.append(Autoscaled(service_id, kept[0].name, ids, len(kept), scaling))
    return found


def read_log(
    store: Store,
    workload_id: int,
    *,
    attempt: int | None = None,
    offset: int = 0,
    limit: int = LOG_CHUNK_MAX,
    rank: int = 0,
) -> dict[str, Any]:
    with store.read() as s:
        workload = _load(s, workload_id)
        if not workload.attempts:
            return {
                "attempt": None,
                "offset": 0,
                "data": "",
                "eof": workload.state in TERMINAL,
                "state": workload.state,
                "path": None,
                "attempt_ended": False,
                "latest_attempt": None,
                "reason": workload.reason,
            }
        if attempt is None:
            chosen = workload.attempts[-1]
        else:
            matches = [a for a in workload.attempts if a.number == attempt]
            if not matches:
                raise NotFound(
                    f"workload {workload_id} has no attempt {attempt} "
                    f"(attempts 0..{len(workload.attempts) - 1})"
                )
            chosen = matches[0]
        finished = chosen.state != RUNNING
        ranks = max(1, len(chosen.pods or []))
        if rank >= ranks:
            raise NotFound(
                f"attempt {chosen.number} of workload {workload_id} has no rank {rank} (ranks 0..{ranks - 1})"
            )
        path = rank_log_path(Path(chosen.log_path), rank)
        data = b""
        size = 0
        if path.exists():
            size = path.stat().st_size
        if max(0, offset) < size:  # past the end nothing is there yet (and a seek past a file's limit fails)
            with open(path, "rb") as fh:
                fh.seek(max(0, offset))
                data = fh.read(max(0, min(limit, LOG_CHUNK_MAX)))
                if fh.tell() < size or not finished:  # more may follow: a cut character comes next time
                    data = _whole_characters(data)
        next_offset = max(0, offset) + len(data)
        return {
            "attempt": chosen.number,
            "offset": next_offset,
            "data": data.decode("utf-8", errors="replace"),
            "eof": finished and next_offset >= size and workload.state != RUNNING,
            "state": workload.state,
            "path": str(path),
            # for a reader following the work: this attempt has ended, and which attempt is the newest
            "attempt_ended": finished,
            "latest_attempt": workload.attempts[-1].number,
            "reason": workload.reason,  # why it waits, while it is pending again
            # an attempt that never wrote a log (its node could not start it): why it ended
            "no_log": not path.exists(),
            "attempt_reason": chosen.reason,
        }


def _whole_characters(data: bytes) -> bytes:
    """`data` without a UTF-8 character cut off at its end (the next chunk starts with it): each chunk is
    decoded alone, and a cut character would come out as two replacement characters."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data" and 0 < exc.start >= len(data) - 3:
            return data[: exc.start]
    return data


# -- nodes -----------------------------------------------------------------------------------------------


def node_view(
    node: Node, allocated: dict[tuple[str, int], list[int]], telemetry: TelemetryCache
) -> dict[str, Any]:
    gpus = []
    for gpu in node.gpus:
        holders = allocated.get((node.name, gpu.index), [])
        gpus.append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "model": gpu.model,
                "name": gpu.product_name,
                "memory_bytes": gpu.memory_bytes,
                "nvlink_island": gpu.nvlink_island,
                "simulated": gpu.simulated,
                "workloads": holders,
                "sample": telemetry.get(node.name, gpu.index),
            }
        )
    models = sorted({g.model for g in node.gpus})
    return {
        "name": node.name,
        "state": node.state,
        "state_reason": node.state_reason,
        "address": node.address,
        "backend": node.backend,
        "cpus": node.cpus,
        "memory_bytes": node.memory_bytes,
        "labels": node.labels,
        "gpu_models": models,
        "gpus_total": len(node.gpus),
        "gpus_allocated": sum(1 for g in gpus if g["workloads"]),
        "last_heartbeat": _iso(node.last_heartbeat),
        "gpus": gpus,
    }


# The health loop's view of one node (name, state, state reason) -> its verdict and evidence
HealthView = Callable[[str, str, str], Mapping[str, Any]]


def list_nodes(
    store: Store, telemetry: TelemetryCache, health: HealthView | None = None
) -> list[dict[str, Any]]:
    """Every node; `health` (the health loop's `view`) adds its verdict and evidence, judged with the state
    read here: a verdict taken from a read of its own could say `unhealthy` of a node this read finds
    returned to service a moment later."""
    with store.read() as s:
        allocated: dict[tuple[str, int], list[int]] = {}
        workloads: dict[str, list[int]] = {}
        for attempt in s.scalars(select(Attempt).where(Attempt.state == RUNNING)):
            pods = attempt.pods or [{"node": attempt.node_name, "gpu_indices": attempt.gpu_indices}]
            for pod in pods:
                workloads.setdefault(pod["node"], []).append(attempt.workload_id)
                for index in pod["gpu_indices"]:
                    allocated.setdefault((pod["node"], int(index)), []).append(attempt.workload_id)
        nodes = []
        for n in s.scalars(select(Node).order_by(Node.name)):
            verdict = health(n.name, n.state, n.state_reason) if health is not None else {}
            nodes.append(
                {
                    **node_view(n, allocated, telemetry),
                    "workloads": sorted(workloads.get(n.name, [])),
                    # a drain is done: nothing runs there any more (Slurm's DRAINED, after DRAINING)
                    "drained": n.state == "draining" and not workloads.get(n.name),
                    "health": verdict.get("health", "unknown"),
                    "health_evidence": verdict.get("evidence", ""),
                }
            )
        return nodes


def drain_node(store: Store, name: str, reason: str, *, actor: str = "admin") -> dict[str, Any]:
    """Take no new work on the node and stop its work (SIGTERM, SIGKILL after the grace period); the control
    loop requeues each stopped workload to resume from its checkpoint elsewhere. Undone by uncordon."""
    with store.session() as s:
        node = s.scalar(select(Node).where(Node.name == name))
        if node is None:
            names = ", ".join(s.scalars(select(Node.name).order_by(Node.name))) or "none"
            raise NotFound(f"no node named {name!r} (nodes: {names})")
        if node.state != "draining":
            node.change_state("draining", reason, actor)
        for attempt in s.scalars(select(Attempt).where(Attempt.state == RUNNING)):
            pods = attempt.pods or [{"node": attempt.node_name}]
            if attempt.stop_requested_at is None and any(p["node"] == name for p in pods):
                # the control loop stops it (observe.STOP_DRAIN); its history says who drained the node
                attempt.stop_reason = "drain"
                said = (
                    "" if not reason or reason == f"drained by {actor}" else f": {reason}"
                )  # the API's default
                attempt.reason = f"node {name} drained by {actor}{said}"
    return next(n for n in list_nodes(store, TelemetryCache()) if n["name"] == name)


def set_node_state(
    store: Store, name: str, state: str, reason: str, *, actor: str = "admin"
) -> dict[str, Any]:
    with store.session() as s:
        node = s.scalar(select(Node).where(Node.name == name))
        if node is None:
            names = ", ".join(s.scalars(select(Node.name).order_by(Node.name))) or "none"
            raise NotFound(f"no node named {name!r} (nodes: {names})")
        if node.state in ("lost", "unhealthy") and state == "ready":
            raise Conflict(f"node {name} is {node.state}; it returns to service when it is healthy again")
        if node.state != state:
            node.change_state(state, reason, actor)
    return next(n for n in list_nodes(store, TelemetryCache()) if n["name"] == name)
