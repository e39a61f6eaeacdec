"""The one door through which a workload changes state.

Every change is checked by a short, ordered policy of rules (in the manner of Prefect's orchestration
rules): each rule that governs the transition may refuse it with a reason; the first refusal wins.
Accepted changes update the row and append an audit event in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session

from gpupool.store.models import Attempt, Event, Workload
from gpupool.timeutil import utcnow

PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED = "pending", "running", "succeeded", "failed", "cancelled"
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
ACTIVE = frozenset({PENDING, RUNNING})
STATES = (PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED)
EVICTED = "evicted"  # an attempt stopped by the control plane (evicted, drained, held, requeued); its
# workload went back to pending
# `gpupool hold`: the reason code of held pending work, and the stop reason of a held workload's running
# attempt (control/observe.py stops it and requeues it pending)
HELD = STOP_HOLD = "held"
# How a held running attempt's reason goes on after who held it ("held by alice", the idle rule's words):
# the requeued workload's reason keeps that first part (control/observe.py).
HOLD_STOPPING = ": stopping it, to wait pending until released"
# `gpupool requeue` (Slurm's scontrol requeue): the stop reason of a running attempt sent back to pending, and
# how its reason goes on after who asked ("requeued by alice").
STOP_REQUEUE = "requeue"
REQUEUE_STOPPING = ": stopping it, to wait pending for the scheduler"
# How a running attempt's reason begins while it ends of itself (a gang whose rank failed, its other ranks
# being stopped: backends' Status.ending); the workload reads "stopping" with it meanwhile.
ENDING = "ending: "
SERVICE = "service"  # the workload kind that runs until cancelled
# The reason code of work that failed because its max_duration ended it (Slurm's TIMEOUT state): a script
# tells it from work that failed by itself, whatever exit code SIGTERM made.
TIMEOUT = "timeout"

# The actor the head records for its own decisions (its control loop): attempts settled, work requeued, a
# node's lease run out. `gpupool audit --actor control` lists them (docs/operations.md, "Audit log").
CONTROL = "control"

# The lifecycle graph. running -> pending is a retry (a new attempt follows).
ALLOWED: dict[str, frozenset[str]] = {
    PENDING: frozenset({RUNNING, CANCELLED, FAILED}),
    RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLED, PENDING}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class Transition:
    """A proposed change and the facts the rules may consult."""

    workload_id: int
    from_state: str
    to_state: str
    cancel_requested: bool
    restarts: int
    max_restarts: int
    is_retry: bool = False
    kind: str = "job"  # a service restarts whenever it stops, with no budget (control/restarts.py)


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: bool
    reason: str = ""


Rule = Callable[[Transition], str | None]  # returns a refusal reason, or None to let it pass


def terminal_states_are_final(t: Transition) -> str | None:
    if t.from_state in TERMINAL:
        return f"workload {t.workload_id} already {t.from_state}"
    return None


def only_known_transitions(t: Transition) -> str | None:
    if t.to_state not in ALLOWED.get(t.from_state, frozenset()):
        return f"workload {t.workload_id} cannot go from {t.from_state} to {t.to_state}"
    return None


def cancelled_work_does_not_start(t: Transition) -> str | None:
    if t.cancel_requested and t.to_state in (RUNNING, PENDING):
        return f"workload {t.workload_id} has a pending cancel request"
    return None


def retries_stay_within_budget(t: Transition) -> str | None:
    if t.kind == SERVICE:
        return None
    if t.from_state == RUNNING and t.to_state == PENDING and t.is_retry and t.restarts >= t.max_restarts:
        return f"workload {t.workload_id} used all {t.max_restarts} restarts"
    return None


POLICY: tuple[Rule, ...] = (
    terminal_states_are_final,
    only_known_transitions,
    cancelled_work_does_not_start,
    retries_stay_within_budget,
)


def check(t: Transition, policy: tuple[Rule, ...] = POLICY) -> Verdict:
    """Apply the rules in order; the first refusal wins."""
    for rule in policy:
        refusal = rule(t)
        if refusal is not None:
            return Verdict(False, refusal)
    return Verdict(True)


def transition(
    session: Session,
    workload: Workload,
    to_state: str,
    reason: str,
    *,
    actor: str = "system",
    is_retry: bool = False,
) -> Verdict:
    """Move `workload` to `to_state` if the policy accepts; record the event. Never raises on refusal."""
    max_restarts = int(workload.spec.get("retry", {}).get("max_restarts", 0))
    verdict = check(
        Transition(
            workload.id,
            workload.state,
            to_state,
            workload.cancel_requested,
            workload.restarts,
            max_restarts,
            is_retry,
            workload.kind,
        )
    )
    if not verdict.accepted:
        return verdict
    now = utcnow()
    session.add(
        Event(
            object_kind="workload",
            object_id=str(workload.id),
            from_state=workload.state,
            to_state=to_state,
            reason=reason,
            actor=actor,
            at=now,
        )
    )
    workload.state = to_state
    workload.reason = reason
    workload.reason_code = ""
    workload.updated_at = now
    if to_state == RUNNING and workload.started_at is None:
        workload.started_at = now
    if to_state == PENDING and is_retry:
        workload.restarts += 1
    if to_state in TERMINAL:
        workload.finished_at = now
    return verdict


def note(session: Session, workload: Workload, reason: str, *, actor: str) -> None:
    """Record in `workload`'s history something that changes no state (an eviction asked of running work,
    a replica asked to stop, a service's scaling range changed)."""
    session.add(
        Event(
            object_kind="workload",
            object_id=str(workload.id),
            from_state=workload.state,
            to_state=workload.state,
            reason=reason,
            actor=actor,
            at=utcnow(),
        )
    )


def running_unstopped() -> tuple[ColumnElement[bool], ...]:
    """The conditions (on Attempt joined to its Workload) of a running attempt nobody has asked to stop:
    no stop requested or marked, its workload not being cancelled. What a rule that stops work (a spent
    budget, an idle timeout) may still act on."""
    return (
        Attempt.state == RUNNING,
        Attempt.stop_requested_at.is_(None),
        Attempt.stop_reason == "",
        Workload.cancel_requested.is_(False),
    )
