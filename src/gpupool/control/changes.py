"""Changes to pending or running work that an id names: cancel, hold, release, requeue, update. No HTTP
here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from gpupool.control.errors import Conflict, Forbidden, Invalid
from gpupool.control.lifecycle import (
    CANCELLED,
    HELD,
    HOLD_STOPPING,
    PENDING,
    REQUEUE_STOPPING,
    RUNNING,
    SERVICE,
    STOP_HOLD,
    STOP_REQUEUE,
    TERMINAL,
    note,
    transition,
)
from gpupool.control.queues import check_priority_cap, require_queue
from gpupool.control.workloads import load_workload, pending_or_running, replicas_of, tasks_of, workload_view
from gpupool.spec import SpecError, WorkloadSpec, parse_workload_spec
from gpupool.spec.priority import MAX_PRIORITY, PRIORITY_CLASSES
from gpupool.spec.quantities import format_duration
from gpupool.store.db import Store
from gpupool.store.models import Workload


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
                workload = load_workload(s, workload_id)
                group, whole_array = _named(s, workload, task)
                active = pending_or_running(group)
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
                    cancel_one(s, replica, why or f"cancelled by {actor} {waited}", actor)
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
                check_priority_cap(s, queue, max(moving), "move")
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
    require_queue(s, queue)
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


def _named(s: Session, workload: Workload, task: bool) -> tuple[list[Workload], bool]:
    """What an id names for cancel, hold, release and update: a service's replicas, a job array's tasks
    by the array's id (unless `task`: its first task alone), else the workload; and whether it named a
    whole array."""
    if workload.array_id == workload.id and not task:
        return tasks_of(s, workload.id), True
    return replicas_of(s, workload), False


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
                workload = load_workload(s, workload_id)
                group, _ = _named(s, workload, task)
                active = [w for w in pending_or_running(group) if not w.cancel_requested]
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


def cancel_one(s: Session, workload: Workload, reason: str, actor: str) -> None:
    workload.cancel_requested = True
    if workload.state == PENDING:
        transition(s, workload, CANCELLED, reason, actor=actor)
