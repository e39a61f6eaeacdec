"""Workloads and their attempts as the API shows them: one in detail, or a listing. No HTTP here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.errors import Conflict, Invalid, NotFound
from gpupool.control.lifecycle import (
    ACTIVE,
    ENDING,
    EVICTED,
    HOLD_STOPPING,
    PENDING,
    REQUEUE_STOPPING,
    RUNNING,
    SERVICE,
    STATES,
    TERMINAL,
)
from gpupool.control.notify import redacted_url
from gpupool.control.readiness import Readiness, word_on
from gpupool.control.reclaim_blockers import NOTHING_TO_RECLAIM, reclaim_blockers
from gpupool.control.tokens import known_user
from gpupool.scheduler import Explanation
from gpupool.store.db import Store
from gpupool.store.models import MAX_ID, Attempt, Event, Workload
from gpupool.timeutil import age_seconds, as_utc, iso, utcnow


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
        "started_at": iso(attempt.started_at),
        "finished_at": iso(attempt.finished_at),
        # GPU efficiency from telemetry (control/efficiency.py); None: no GPU telemetry for this attempt.
        "gpu_utilization_pct": attempt.gpu_utilization_pct,
        "gpu_memory_peak_bytes": attempt.gpu_memory_peak_bytes,
        "gpu_memory_total_bytes": attempt.gpu_memory_total_bytes,
        "gpu_seconds_sampled": attempt.gpu_seconds_sampled,
    }


Live = Mapping[int, Explanation]  # the control loop's latest explanation of each pending workload
Ready = Mapping[int, Readiness]  # the readiness prober's last word on each running service with a probe


def readiness_of(workload: Workload, last: Attempt | None, readiness: Ready | None) -> Readiness | None:
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
    elif running and last is not None and last.reason.startswith(ENDING):
        reason, reason_code = f"stopping: {last.reason.removeprefix(ENDING)}", STOPPING
    probed = readiness_of(workload, last, readiness)  # None: no probe, or not running
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
        "created_at": iso(workload.created_at),
        "started_at": iso(workload.started_at),
        "finished_at": iso(workload.finished_at),
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


def replica_view(workload: Workload, readiness: Ready | None = None) -> dict[str, Any]:
    """One replica as a service's detail lists it."""
    last = workload.attempts[-1] if workload.attempts else None
    running = last is not None and last.state == RUNNING
    probed = readiness_of(workload, last, readiness)
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


def pending_reason(workload: Workload, live: Live | None) -> tuple[str, str]:
    """Why pending work waits, as the control loop explains it now (`live`), else as last stored: the
    reason and its code."""
    explained = live.get(workload.id) if live is not None else None
    if explained is not None:
        return explained.message, explained.code
    return workload.reason, workload.reason_code


def load_workload(s: Session, workload_id: int) -> Workload:
    # An id past a 64-bit integer would reach the database as an error instead of a miss.
    workload = s.get(Workload, workload_id) if 0 < workload_id <= MAX_ID else None
    if workload is None:
        raise NotFound(f"no workload with id {workload_id}; list them with `gpupool ps --all`")
    return workload


def load_service(s: Session, workload_id: int, what_only_a_service: str) -> Workload:
    """The workload `workload_id`, refused (409, naming the field `kind`) when it is a job."""
    workload = load_workload(s, workload_id)
    if workload.kind != SERVICE:
        raise Conflict(
            f"workload {workload.id} ({workload.name}) is a job; only a service {what_only_a_service}",
            field="kind",
        )
    return workload


def replicas_of(s: Session, workload: Workload) -> list[Workload]:
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


def tasks_of(s: Session, array_id: int) -> list[Workload]:
    """Every task of the job array `array_id`, by index."""
    return list(
        s.scalars(select(Workload).where(Workload.array_id == array_id).order_by(Workload.array_index))
    )


def _count_states(workloads: list[Workload]) -> dict[str, int]:
    """How many of `workloads` are in each state, "total" too."""
    counts = {"total": len(workloads)}
    for w in workloads:
        counts[w.state] = counts.get(w.state, 0) + 1
    return counts


def pending_or_running(replicas: list[Workload]) -> list[Workload]:
    """Those pending or running, stopping ones included."""
    return [w for w in replicas if w.state not in TERMINAL]


def kept_replicas(replicas: list[Workload]) -> list[Workload]:
    """Those pending or running that nobody asked to stop: the replicas a service has."""
    return [w for w in replicas if w.state not in TERMINAL and not w.cancel_requested]


def get_workload(
    store: Store, workload_id: int, live: Live | None = None, readiness: Ready | None = None
) -> dict[str, Any]:
    with store.read() as s:
        workload = load_workload(s, workload_id)
        view = workload_view(workload, detail=True, live=live, readiness=readiness)
        if view["state"] == PENDING and NOTHING_TO_RECLAIM in (view["reason"] or ""):
            # which work of other queues reclaim may not take, and until when (`gpupool why`)
            view["reclaim_blockers"] = reclaim_blockers(s, workload.queue)
        if workload.kind == SERVICE:
            replicas = replicas_of(s, workload)
            view["replicas"] = len(kept_replicas(replicas))
            view["replica_list"] = [replica_view(w, readiness) for w in replicas]
        if workload.array_id is not None:
            tasks = tasks_of(s, workload.array_id)
            view["array_tasks"] = _count_states(tasks)
            if workload.array_id == workload.id:  # the array's own id: its tasks listed
                view["task_list"] = [
                    {"id": t.id, "index": t.array_index, "state": t.state, "reason": t.reason} for t in tasks
                ]
        view["events"] = [
            {"at": iso(e.at), "from": e.from_state, "to": e.to_state, "reason": e.reason, "actor": e.actor}
            for e in s.scalars(
                select(Event)
                .where(Event.object_kind == "workload", Event.object_id == str(workload_id))
                .order_by(Event.id)
            )
        ]
        return view


MAX_LISTED_IDS: Final = 1000  # ids one listing may name (`id=` repeated in the query)


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
        found = s.scalars(query).all()
        if not found and user is not None and not known_user(s, user):  # a typo is not "no work"
            raise Invalid(
                f"user: no work was ever submitted by {user!r} and no token has that name; check the "
                "spelling (`gpupool ps --all` shows who submitted what)",
                field="user",
            )
        return [workload_view(w, live=live, readiness=readiness) for w in reversed(found)]


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
