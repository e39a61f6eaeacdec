"""/api/v1/workloads: submit, list, get, update (priority), cancel, hold and release, scale (a service's
replicas), logs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool

from gpupool.api.auth import may_change, require_token
from gpupool.api.body import fields
from gpupool.api.errors import ApiError
from gpupool.control import access, attempt_logs, budgets, changes, service_replicas, submission, workloads
from gpupool.control.notify import check_allowed
from gpupool.control.tokens import Caller
from gpupool.spec import parse_duration, parse_workload_spec
from gpupool.spec.priority import PRIORITY_CLASSES
from gpupool.spec.queue import SYSTEM_QUEUE
from gpupool.spec.replicas import RANGE

router = APIRouter(prefix="/workloads", tags=["workloads"])


@router.post("", status_code=201, summary="Submit a job or service (the YAML spec as JSON)")
def submit(
    request: Request,
    body: Any = Body(..., description="A workload spec: see docs/specs.md"),
    hold: bool = Query(False, description="submit it held: it waits until released (Slurm's sbatch --hold)"),
    caller: Caller = Depends(require_token),
) -> dict[str, Any]:
    spec = parse_workload_spec(body)
    if "queue" not in spec.model_fields_set and len(caller.queues) == 1:
        # no queue named: a token for one queue submits to it, as Slurm's default account is used
        spec = spec.model_copy(update={"queue": caller.queues[0]})
    _may_submit_to(caller, spec.queue)
    runtime = request.app.state.runtime
    check_allowed(spec.model_dump(mode="json"), runtime.settings.notify_hosts)
    refuse = getattr(runtime.backend, "refuse", None)  # what this backend can never run: said at submit
    if refuse is not None:
        refuse(spec)
    created = submission.submit(runtime.store, spec, user=caller.name, held=hold, admin=caller.admin)
    warnings = budgets.spent_warning(
        runtime.store, runtime.reconciler.budgets.state, spec.queue, created["id"]
    )
    warn = getattr(runtime.backend, "submit_warnings", None)  # what this backend sees wrong, said at once
    if warn is not None:
        warnings += warn(spec, created["id"])
    created["warnings"] = [*created.get("warnings", []), *warnings]
    runtime.wake()
    return created


@router.get("", summary="List workloads (active ones unless `all` or `state` is given)")
def list_workloads(
    request: Request,
    all: bool = Query(False, description="include finished workloads"),
    state: str | None = Query(
        None, description="only work in this state, or these (comma-separated: pending,running)"
    ),
    queue: str | None = Query(None, description="only this queue"),
    user: str | None = Query(None, description="only work this user (token name) submitted"),
    name: str | None = Query(
        None, description="only workloads of this name (a service's replicas and an array's tasks share it)"
    ),
    since: datetime | None = Query(
        None, description="only those submitted at or after this time (ISO 8601; without a zone, UTC)"
    ),
    id: list[int] | None = Query(
        None, description=f"only these workloads (repeat: id=3&id=4; at most {workloads.MAX_LISTED_IDS})"
    ),
    limit: int = Query(1000, ge=1, le=100_000, description="at most this many, newest first"),
) -> list[dict[str, Any]]:
    runtime = request.app.state.runtime
    return workloads.list_workloads(
        runtime.store, include_finished=all, state=state, queue=queue, user=user, name=name, since=since,
        ids=id, limit=limit,
        live=runtime.reconciler.explanations, readiness=runtime.readiness.state,
    )  # fmt: skip


@router.get("/{workload_id}", summary="One workload with its attempts and history")
def get_workload(
    request: Request, workload_id: int, caller: Caller = Depends(require_token)
) -> dict[str, Any]:
    runtime = request.app.state.runtime
    view = workloads.get_workload(
        runtime.store, workload_id, live=runtime.reconciler.explanations, readiness=runtime.readiness.state
    )
    # secrets: a notification's signing secret from everyone, env values and a webhook's path from others
    view["spec"] = workloads.redacted_spec(view["spec"], whole=caller.admin or caller.name == view["user"])
    if view["spec"].get("scaling"):  # what the autoscaler last measured (control/autoscale.py)
        word = runtime.autoscaler.words.get(view["service_id"])
        view["autoscaling"] = word.as_dict() if word is not None else None
    return view


def _task_query(verb: str) -> Any:
    """The `task` query parameter of an action on a workload or on a job array's first task alone."""
    return Query(False, description=f"a job array's id: {verb} its first task alone, not the whole array")


@router.post(
    "/{workload_id}/cancel", status_code=202, summary="Cancel: SIGTERM, then SIGKILL after the grace period"
)
def cancel(
    request: Request,
    workload_id: int,
    task: bool = _task_query("cancel"),
    caller: Caller = Depends(require_token),
) -> dict[str, Any]:
    return _act(request, caller, workload_id, changes.cancel, task)


@router.post(
    "/{workload_id}/hold",
    summary="Hold: keep it pending until released (a running one is stopped first, then waits)",
)
def hold(
    request: Request,
    workload_id: int,
    task: bool = _task_query("hold"),
    caller: Caller = Depends(require_token),
) -> dict[str, Any]:
    return _act(request, caller, workload_id, functools.partial(changes.hold, admin=caller.admin), task)


@router.post(
    "/{workload_id}/requeue",
    summary="Requeue running work: stop it (grace period) and let the scheduler place it again",
)
def requeue(
    request: Request,
    workload_id: int,
    task: bool = _task_query("requeue"),
    caller: Caller = Depends(require_token),
) -> dict[str, Any]:
    return _act(request, caller, workload_id, changes.requeue, task, adding="requeue")


@router.post("/{workload_id}/release", summary="Release held work: the scheduler may start it again")
def release(
    request: Request,
    workload_id: int,
    task: bool = _task_query("release"),
    caller: Caller = Depends(require_token),
) -> dict[str, Any]:
    release = functools.partial(changes.release, admin=caller.admin)
    return _act(request, caller, workload_id, release, task, adding="release")


@router.patch(
    "/{workload_id}", summary="Change work: its priority, its time limit, and while it waits its queue"
)
def update(
    request: Request,
    workload_id: int,
    body: dict[str, Any] | None = Body(
        None,
        description='{"priority": 100} (0..1000, or a class name), {"max_duration": "12h"} (seconds or '
        'text like 1h30m; null or "none": no limit) and/or {"queue": "nlp"} (pending work only)',
    ),
    task: bool = _task_query("change"),
    caller: Caller = Depends(require_token),
) -> dict[str, Any]:
    given = fields(body, ("priority", "max_duration", "queue"))
    if not given.keys() & {"priority", "max_duration", "queue"}:
        raise ApiError(
            422,
            "invalid",
            'priority: required, or max_duration, or queue; e.g. {"priority": 100}, {"max_duration": "12h"} '
            'or {"queue": "nlp"}',
            field="priority",
        )
    priority = _priority(given["priority"]) if "priority" in given else None
    queue = _queue(given["queue"], caller) if "queue" in given else None
    wanted = given.get("max_duration")  # null or "none": no limit
    seconds: float | None = None
    if wanted is not None and not (isinstance(wanted, str) and wanted.strip().lower() in NO_LIMIT):
        seconds = parse_duration(wanted, "max_duration")
    runtime = request.app.state.runtime
    _owned(runtime, caller, workload_id)
    limit = changes.TimeLimit(seconds) if "max_duration" in given else None
    result = changes.update(
        runtime.store, workload_id, priority=priority, limit=limit, queue=queue, task=task, actor=caller.name,
        admin=caller.admin, refuse=getattr(runtime.backend, "refuse", None),  # as at submit
    )  # fmt: skip
    runtime.wake()
    return result


NO_LIMIT = ("none", "unlimited", "infinite")  # Slurm's TimeLimit=UNLIMITED and INFINITE


def _queue(given: object, caller: Caller) -> str:
    """The queue work moves to: a name the caller's token may submit to (whether it exists is the
    store's to say)."""
    if not isinstance(given, str) or not given.strip():
        raise ApiError(
            422, "invalid", 'queue: a queue name is required; e.g. {"queue": "nlp"}', field="queue"
        )
    name = given.strip()
    _may_submit_to(caller, name)
    return name


def _may_submit_to(caller: Caller, queue: str, why: str = "") -> None:
    """Refuse (403) work in a queue the caller's token is not for (tokens limited to some queues), and
    anyone's in gpupool's own queue: the head submits its node health checks there, outside the scheduler,
    with no quota (a person's work there would never be given GPUs). `why`: what would add work to `queue`,
    when it is not a submission naming it."""
    if queue == SYSTEM_QUEUE:
        raise ApiError(
            403,
            "forbidden",
            f"queue: {SYSTEM_QUEUE} is gpupool's own (its node health checks; `gpupool health run` starts "
            "them); submit to a team's queue (gpupool queues)",
            field="queue",
        )
    if not caller.may_submit_to(queue):
        fix = f"{why}; ask an admin" if why else "name one of those, or ask an admin"
        raise ApiError(
            403,
            "forbidden",
            f"queue: the token {caller.name!r} may submit only to {', '.join(caller.queues)}, not "
            f"{queue!r}; {fix}",
            field="queue",
        )


def _priority(given: object) -> int:
    priority = PRIORITY_CLASSES.get(given.strip().lower()) if isinstance(given, str) else given
    if not isinstance(priority, int) or isinstance(priority, bool):
        said = "required" if given is None else f"{given!r} is not a number 0..1000 or a class name"
        raise ApiError(
            422,
            "invalid",
            f'priority: {said} ({", ".join(PRIORITY_CLASSES)}); e.g. {{"priority": 100}}',
            field="priority",
        )
    return priority


@router.post(
    "/{workload_id}/scale",
    summary="A service's replicas: add some (pending for the scheduler) or cancel some",
)
def scale(
    request: Request,
    workload_id: int,
    body: dict[str, Any] | None = Body(
        None,
        description='{"replicas": N}, 1..64; or {"replicas": "MIN..MAX"}: an autoscaled service\'s range',
    ),
    caller: Caller = Depends(require_token),
) -> dict[str, Any]:
    replicas = fields(body, ("replicas",)).get("replicas")
    runtime = request.app.state.runtime
    _owned(runtime, caller, workload_id, adding="scale")
    found = RANGE.fullmatch(replicas) if isinstance(replicas, str) else None
    if found is not None:  # an autoscaled service's new range
        low, high = int(found.group(1)), int(found.group(2))
        result = service_replicas.scale_range(runtime.store, workload_id, low, high, actor=caller.name)
        runtime.wake()
        return result
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        said = "required" if replicas is None else f"{replicas!r} is not a whole number or a range MIN..MAX"
        raise ApiError(
            422,
            "invalid",
            f'replicas: {said}; e.g. {{"replicas": 2}} or {{"replicas": "1..4"}}',
            field="replicas",
        )
    result = service_replicas.scale(
        runtime.store, workload_id, replicas, actor=caller.name, readiness=runtime.readiness.state,
        live=runtime.reconciler.explanations,
    )  # fmt: skip
    runtime.wake()
    return result


@router.get("/{workload_id}/logs", summary="A chunk of an attempt's output from `offset`")
async def logs(
    request: Request,
    workload_id: int,
    attempt: int | None = Query(None, ge=0, description="attempt number; default the latest"),
    offset: int = Query(0, ge=0, description="byte offset to read from"),
    limit: int = Query(attempt_logs.LOG_CHUNK_MAX, ge=1, le=attempt_logs.LOG_CHUNK_MAX),
    rank: int = Query(0, ge=0, description="rank of a multi-node gang (NODE_RANK); default 0"),
    caller: Caller = Depends(require_token),
) -> dict[str, Any]:
    runtime = request.app.state.runtime
    if runtime.settings.private_logs and not caller.admin:
        owner = await run_in_threadpool(access.owner_of, runtime.store, workload_id)
        if owner != caller.name:
            raise ApiError(
                403,
                "forbidden",
                f"workload {workload_id}'s output is private to its owner ({owner}) and admins on this head "
                f"(gpupool server --private-logs); your token: {caller.name}",
            )
    return await run_in_threadpool(
        attempt_logs.read_log,
        request.app.state.runtime.store,
        workload_id,
        attempt=attempt,
        offset=offset,
        limit=limit,
        rank=rank,
    )


def _act(
    request: Request,
    caller: Caller,
    workload_id: int,
    act: Callable[..., dict[str, Any]],
    task: bool,
    adding: str | None = None,
) -> dict[str, Any]:
    """`act` (changes.cancel, hold, requeue, release) on what `workload_id` names, by its owner or an admin
    (`adding`: see `_owned`); the control loop is woken to carry it out."""
    runtime = request.app.state.runtime
    _owned(runtime, caller, workload_id, adding)
    result = act(runtime.store, workload_id, task=task, actor=caller.name)
    runtime.wake()
    return result


def _owned(runtime: Any, caller: Caller, workload_id: int, adding: str | None = None) -> None:
    """Refuse (403) a change of someone else's work to anyone but an admin (404 when there is none). A
    change that puts work before the scheduler (`adding`: scale, release, requeue) is refused too where
    the caller's token may not submit to the work's queue: such a token could otherwise add work to a
    queue that is not its own, through work it once submitted there."""
    if caller.admin:
        return
    if adding is None:
        may_change(caller, access.owner_of(runtime.store, workload_id), f"workload {workload_id}")
        return
    view = workloads.get_workload(runtime.store, workload_id)
    may_change(caller, view["user"], f"workload {workload_id}")
    _may_submit_to(
        caller,
        view["queue"],
        f"workload {workload_id} is in queue {view['queue']!r}, and to {adding} it adds work there",
    )
