"""Queues as the API manages them: create, update, delete, list, and what each runs and waits for. No
HTTP here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.control import audit
from gpupool.control.accounting import gpu_quota
from gpupool.control.arrays import ARRAY_LIMIT
from gpupool.control.budgets import BUDGET
from gpupool.control.dependencies import DEPENDENCY
from gpupool.control.errors import Conflict, Forbidden, Invalid, NotFound
from gpupool.control.lifecycle import ACTIVE, HELD, PENDING, RUNNING
from gpupool.control.restarts import RESTART_BACKOFF
from gpupool.control.usage import attempt_gpus
from gpupool.control.user_limits import USER_LIMIT
from gpupool.control.workloads import Live
from gpupool.scheduler import explain
from gpupool.spec import QueueSpec, parse_gpu_request, parse_queue_spec
from gpupool.spec.queue import SYSTEM_QUEUE
from gpupool.store.db import Store
from gpupool.store.models import ApiToken, Attempt, Gpu, Queue, Workload
from gpupool.timeutil import iso

DEFAULT_QUEUE = "default"
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
        "created_at": iso(queue.created_at),
        "updated_at": iso(queue.updated_at),
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


def require_queue(s: Session, name: str) -> None:
    """Refuse (422, naming the queues there are) work submitted or moved to a queue that does not exist."""
    if s.scalar(select(Queue.id).where(Queue.name == name)) is None:
        names = ", ".join(s.scalars(select(Queue.name).order_by(Queue.name))) or "none"
        raise Invalid(
            f"queue {name!r} does not exist (queues: {names}); create it with `gpupool queue create {name}`",
            field="queue",
            example=DEFAULT_QUEUE,
        )


def check_priority_cap(s: Session, queue: str, priority: int, done: str) -> None:
    """Refuse (403) a user's work above its queue's `max_priority`."""
    spec = s.scalar(select(Queue.spec).where(Queue.name == queue)) or {}
    cap = spec.get("max_priority")
    if cap is not None and priority > cap:
        raise Forbidden(
            f"priority: queue {queue} takes work up to priority {cap} from users (its max_priority), and "
            f"this would {done} work at {priority}; ask for {cap} or less, or ask an admin",
            field="priority",
        )
