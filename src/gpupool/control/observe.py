"""The reconcile loop's first phase (control/loop.py): observe every running attempt and settle it.

A pass looks at every running attempt read-only and writes only for those that need something done:
a stop to carry out (cancel, max_duration, a draining node, the grace period run out), or an attempt that
ended, which is settled and its workload moved on (done, requeued after an eviction, retried, or failed).
At start, `recover` re-adopts or settles every attempt the store says is running.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from gpupool.backends.base import (
    HANDLE_ID,
    Backend,
    BackendUnavailable,
    Handle,
    Phase,
    Status,
    recorded_exit_code,
)
from gpupool.control.budgets import STOP_BUDGET
from gpupool.control.lifecycle import (
    CANCELLED,
    ENDING,
    EVICTED,
    FAILED,
    HELD,
    HOLD_STOPPING,
    PENDING,
    REQUEUE_STOPPING,
    RUNNING,
    SERVICE,
    STOP_HOLD,
    STOP_REQUEUE,
    SUCCEEDED,
    TIMEOUT,
    note,
    transition,
)
from gpupool.control.settings import ControlSettings
from gpupool.spec.sections import DEFAULT_MAX_NODE_FAILURES
from gpupool.store import head_state
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Node, Workload
from gpupool.timeutil import age_seconds, as_utc, utcnow

log = logging.getLogger("gpupool.control")

STOP_CANCEL, STOP_TIMEOUT = "cancelled", "max_duration"
# Seconds at most a stopping service replica's SIGTERM waits for the requests the proxy gave it.
DRAIN_MAX = 30.0
STOP_DRAIN = "drain"  # set by nodes.drain_node on the attempts of a draining node; the loop stops them
# Stops written down by others (a drain, `gpupool hold` or `requeue`, a used budget: control/budgets.py)
# that observe carries out.
ASKED_STOPS = (STOP_DRAIN, STOP_HOLD, STOP_REQUEUE, STOP_BUDGET)
EVICTIONS = frozenset({"reclaim", "preempt", "consolidate", "stale-gang"})
PID_GRACE = 10.0  # seconds an attempt may exist without a pid before it counts as never started
NEVER_STARTED = "never started"  # how such an attempt's reason begins
START_TRIES = 3  # attempts in a row that never start before the workload fails instead of requeueing
# How often a head writes down that it runs (head_state "alive:NODE"): an attempt that vanished while the
# head was down, leaving no end of its own, is charged until then (or its log's last write), not the restart.
ALIVE_INTERVAL = 10.0


def resumes(workload: Workload) -> str:
    """How a stopped workload's next attempt starts, for the sentence that requeues it: from its checkpoint
    where its spec declares one, else over, unless its program saved one in $GPUPOOL_CHECKPOINT_DIR."""
    if workload.spec.get("checkpoint"):
        return "it resumes from its checkpoint"
    return "it starts over, unless it saved a checkpoint in $GPUPOOL_CHECKPOINT_DIR"


def stored_handle(attempt: Attempt) -> Handle:
    """The handle recorded for a launched attempt (`pid` set)."""
    assert attempt.pid is not None
    return Handle(attempt.pid, attempt.pid_start_time or 0.0, boot=attempt.pid_boot_id or "")


def store_handle(attempt: Attempt, handle: Handle) -> None:
    """Record how to find the attempt's process again (its endpoint is the caller's to record)."""
    attempt.pid, attempt.pid_start_time, attempt.pid_boot_id = (
        handle.pid,
        handle.start_time,
        handle.boot or None,
    )


class Observation:
    """The observe phase of `Reconciler` (control/loop.py), which sets these attributes."""

    store: Store
    backend: Backend
    settings: ControlSettings
    _inventory_generation: int
    # Whether the head's proxy still has requests in flight to a service replica (autoscale.Load.draining;
    # the API's runtime sets it) and since when a cancelled replica's SIGTERM has waited for them.
    draining: Callable[[int], bool]
    _drains_since: dict[int, float]

    # -- restart safety -------------------------------------------------------------------------------

    def record_alive(self, now: float) -> None:
        with self.store.session() as s:
            head_state.write(s, self._alive_key(), f"{now:.3f}")

    def _alive_key(self) -> str:
        return f"alive:{self.settings.node_name}"

    def recover(self) -> None:
        """At start: every attempt the store says is running is re-adopted or settled with a reason."""
        with self.store.read() as s:
            saved = head_state.read(s, self._alive_key())
        last_alive = float(saved) if saved else None  # the last head's, before this one writes its own
        with self.store.session() as s:
            attempts = s.scalars(select(Attempt).where(Attempt.state == RUNNING)).all()
            for attempt in attempts:
                handle = self._handle(attempt)
                if handle is None:
                    continue
                state = self.backend.status(handle, Path(attempt.run_dir))
                if state.phase is Phase.RUNNING:
                    log.info(
                        "event=attempt_adopted workload=%d attempt=%d %s=%d",
                        attempt.workload_id,
                        attempt.number,
                        HANDLE_ID.get(self.backend.name, "pid"),
                        handle.pid,
                    )
                    if attempt.stop_requested_at is not None:
                        # Its stop was recorded, and the signal goes out only after that (observe): the
                        # last head may have died in between, so the work may not have heard it.
                        signum = signal.SIGKILL if attempt.killed_at is not None else signal.SIGTERM
                        self.backend.signal(handle, signum)
                        log.info(
                            "event=stop_resent workload=%d attempt=%d signal=%s",
                            attempt.workload_id, attempt.number, signal.Signals(signum).name,
                        )  # fmt: skip
                else:
                    self._finish(s, attempt, _while_down(attempt, state, last_alive), time.time())

    # -- observe --------------------------------------------------------------------------------------

    def observe(self, now: float) -> None:
        """Look at every running attempt read-only; write only for those that need something done."""
        with self.store.read() as s:
            rows = s.execute(
                select(Attempt, Workload.cancel_requested, Workload.spec)
                .join(Workload, Attempt.workload_id == Workload.id)
                .where(Attempt.state == RUNNING, self._observed())
            ).all()
            due = [attempt.id for attempt, cancel, spec in rows if self._needs_action(attempt, cancel, spec)]
        if not due:
            return
        sends: list[tuple[Handle, int]] = []
        with self.store.session() as s:
            for attempt_id in due:
                attempt = s.get(Attempt, attempt_id)
                if attempt is None or attempt.state != RUNNING:
                    continue
                try:
                    with s.begin_nested():
                        sent = self._observe_one(s, attempt, now)
                    sends.extend(sent)
                except StaleDataError:
                    log.info("event=observe_conflict workload=%d", attempt.workload_id)
        # Signals go out once the stops are on record: a head that dies in between finds the stop at its
        # restart (`recover` sends it again), not work that ended on its own with code 143.
        for handle, signum in sends:
            self.backend.signal(handle, signum)

    def _observed(self) -> Any:
        """Which running attempts this head observes: those on its own node, or on the backend's nodes."""
        if not self._inventory_generation:
            return Attempt.node_name == self.settings.node_name
        return Attempt.node_name.in_(select(Node.name).where(Node.backend == self.backend.name))

    def _needs_action(self, attempt: Attempt, cancel_requested: bool, spec: dict[str, Any]) -> bool:
        if attempt.pid is None:
            return True
        handle = stored_handle(attempt)
        state = self.backend.status(handle, Path(attempt.run_dir))
        if state.phase is not Phase.RUNNING or (state.ending and attempt.reason != ENDING + state.ending):
            return True
        if attempt.stop_requested_at is None:
            max_duration = spec.get("max_duration")
            return (
                cancel_requested
                or attempt.stop_reason in ASKED_STOPS
                or bool(max_duration and age_seconds(attempt.started_at) > float(max_duration))
            )
        if attempt.killed_at is None:
            return age_seconds(attempt.stop_requested_at) >= float(spec.get("grace_period", 30.0))
        return False

    def _drains(self, workload: Workload, now: float) -> bool:
        """Whether a service replica asked to stop (a scale-down, a cancel) still answers requests the
        head's proxy gave it, which gets no new ones: its SIGTERM waits for them, at most its grace period
        (DRAIN_MAX at most), so that a server that exits on SIGTERM loses none."""
        if workload.kind != SERVICE or not self.draining(workload.id):
            self._drains_since.pop(workload.id, None)
            return False
        if workload.id not in self._drains_since:
            # a replica that ended while it drained is never looked at again: forget those long past
            stale = [i for i, at in self._drains_since.items() if now - at > 2 * DRAIN_MAX]
            for i in stale:
                del self._drains_since[i]
        since = self._drains_since.setdefault(workload.id, now)
        if now - since < min(float(workload.spec.get("grace_period", 30.0)), DRAIN_MAX):
            return True
        del self._drains_since[workload.id]
        return False

    def _observe_one(self, s: Session, attempt: Attempt, now: float) -> list[tuple[Handle, int]]:
        """Settle or stop one attempt; the signals to send once this is committed."""
        try:
            handle = self._handle(attempt, strict=True)
        except BackendUnavailable as exc:
            log.warning("event=attempt_lookup_failed workload=%d error=%s", attempt.workload_id, exc)
            return []
        if handle is None:
            if age_seconds(attempt.started_at) > PID_GRACE:
                self._never_started(s, attempt, now)
            return []
        state = self.backend.status(handle, Path(attempt.run_dir))
        if state.phase is not Phase.RUNNING:
            self._finish(s, attempt, state, now)
            return []
        workload = attempt.workload
        if state.ending and attempt.reason != ENDING + state.ending:
            # ending of itself (a gang's rank failed, the others are being stopped): said while it lasts
            attempt.reason = ENDING + state.ending
            note(s, workload, attempt.reason, actor="control")
        spec = workload.spec
        if attempt.stop_requested_at is None:
            max_duration = spec.get("max_duration")
            if workload.cancel_requested:
                if self._drains(workload, now):
                    return []  # still cancel_requested: looked at again at the next pass
                return [self._request_stop(attempt, handle, STOP_CANCEL)]
            if max_duration and age_seconds(attempt.started_at) > float(max_duration):
                return [self._request_stop(attempt, handle, STOP_TIMEOUT)]
            if attempt.stop_reason in ASKED_STOPS:
                return [self._request_stop(attempt, handle, attempt.stop_reason)]
        elif attempt.killed_at is None:
            grace = float(spec.get("grace_period", 30.0))
            if age_seconds(attempt.stop_requested_at) >= grace:
                attempt.killed_at = utcnow()
                log.info(
                    "event=attempt_killed workload=%d attempt=%d grace=%s",
                    attempt.workload_id,
                    attempt.number,
                    grace,
                )
                return [(handle, signal.SIGKILL)]
        return []

    def _never_started(self, s: Session, attempt: Attempt, now: float) -> None:
        """An attempt recorded but never launched: the head stopped (a crash, kill -9) between writing it
        down and starting its process, or the backend lost the launch. The work never ran, so it waits
        pending again without using a restart, and the attempt costs nothing (it held its GPUs for no
        time). A workload whose launches keep vanishing fails after START_TRIES of them in a row. One
        whose run dir holds an exit code ran after all (a backend that cannot find finished attempts,
        as Slurm's squeue): it is settled by that code."""
        code = recorded_exit_code(Path(attempt.run_dir))
        if code is not None:
            self._finish(s, attempt, Status(Phase.EXITED, code), now)
            return
        workload = attempt.workload
        attempt.finished_at = attempt.started_at
        earlier = [a for a in workload.attempts if a.id != attempt.id and a.finished_at is not None]
        earlier.sort(key=lambda a: a.number)
        streak = 1
        for previous in reversed(earlier):
            if not (previous.reason or "").startswith(NEVER_STARTED):
                break
            streak += 1
        if streak >= START_TRIES:
            attempt.state = FAILED
            attempt.reason = f"{NEVER_STARTED}: no process after {PID_GRACE:g}s"
            transition(
                s, workload, FAILED, f"lost: the attempt never started ({streak} attempts in a row)",
                actor="control",
            )  # fmt: skip
            return
        log.warning("event=attempt_never_started workload=%d attempt=%d", attempt.workload_id, attempt.number)
        if workload.cancel_requested:
            attempt.state, attempt.reason = CANCELLED, f"{NEVER_STARTED}: cancelled"
            transition(s, workload, CANCELLED, "cancelled before its attempt started", actor="control")
            return
        attempt.state = EVICTED
        attempt.reason = f"{NEVER_STARTED}: no process after {PID_GRACE:g}s; requeued"
        transition(
            s, workload, PENDING,
            f"attempt {attempt.number} never started (the head stopped while starting it?); requeued, "
            "no restart used", actor="control",
        )  # fmt: skip
        if workload.held:  # held while it was starting: it waits for `gpupool release`, as in _finish
            workload.reason_code = HELD

    def _request_stop(self, attempt: Attempt, handle: Handle, why: str) -> tuple[Handle, int]:
        """Record the stop; the SIGTERM to send once it is committed."""
        attempt.stop_requested_at = utcnow()
        attempt.stop_reason = why
        log.info(
            "event=attempt_stopping workload=%d attempt=%d why=%s", attempt.workload_id, attempt.number, why
        )
        return handle, signal.SIGTERM

    def _handle(self, attempt: Attempt, *, strict: bool = False) -> Handle | None:
        """The attempt's handle: its stored pid, or what the backend finds of it (then stored). None if it
        was never launched, and, unless `strict` (then it raises), while the backend cannot tell."""
        if attempt.pid is not None:
            return stored_handle(attempt)
        try:
            found = self.backend.find(Path(attempt.run_dir))
        except BackendUnavailable as exc:
            if strict:
                raise
            log.warning("event=attempt_lookup_failed workload=%d error=%s", attempt.workload_id, exc)
            return None
        if found is not None:
            store_handle(attempt, found)
        return found

    def _finish(self, s: Session, attempt: Attempt, state: Status, now: float) -> None:
        """Settle an attempt that ended, and move its workload on (done, retry, or failed)."""
        del now
        handle = self._handle(attempt)
        if handle is not None:
            self.backend.cleanup(handle)
        workload = attempt.workload
        code = state.exit_code
        attempt.exit_code = code
        attempt.finished_at = _ended_at(attempt, state)
        workload.exit_code = code
        ended = _how_it_ended(code, killed=attempt.killed_at is not None)
        if attempt.stop_reason == STOP_CANCEL or (workload.cancel_requested and code != 0):
            attempt.state = CANCELLED
            # who asked, as `cancel` wrote it down ("cancelled by alice"; "cancelled by idle: ...")
            asked = attempt.reason if attempt.reason.startswith("cancelled by ") else "cancelled"
            attempt.reason = f"{asked}; {ended}"
            transition(s, workload, CANCELLED, attempt.reason, actor="control")
            return
        if attempt.stop_reason == STOP_DRAIN:
            # who or what drained the node ("node gpu-3 unhealthy (health: ...)"), as the drain wrote it
            drained = attempt.reason or "node drained"
            attempt.state = EVICTED
            attempt.reason = f"{drained}; {ended}"
            transition(s, workload, PENDING, f"{drained}; requeued ({resumes(workload)})", actor="control")
            return
        if attempt.stop_reason == STOP_HOLD:
            who = (attempt.reason or "held").partition(HOLD_STOPPING)[0]  # "held by alice", the idle rule
            attempt.state = EVICTED
            attempt.reason = f"{attempt.reason or 'held'}; {ended}"
            said = (
                f"{who}: stopped, and waits pending until `gpupool release {workload.id}`"
                if workload.held
                else "stopped for a hold, released since: requeued"
            )
            transition(s, workload, PENDING, f"{said} ({resumes(workload)})", actor="control")
            if workload.held:  # its reason until released (the loop keeps a held workload's reason)
                workload.reason_code = HELD
            return
        if attempt.stop_reason == STOP_REQUEUE:
            who = (attempt.reason or "requeued").partition(REQUEUE_STOPPING)[0]  # "requeued by alice"
            attempt.state = EVICTED
            attempt.reason = f"{who}; {ended}"
            transition(s, workload, PENDING, f"{who}: stopped, and waits pending for the scheduler "
                       f"({resumes(workload)})", actor="control")  # fmt: skip
            return
        if attempt.stop_reason == STOP_BUDGET:
            used = attempt.reason or "its queue's budget is used"  # "queue nlp's budget of 200 ... is used"
            attempt.state = EVICTED
            attempt.reason = f"{used}; {ended}"
            transition(s, workload, PENDING, f"stopped: {used}; it waits pending until the budget lets it "
                       f"start again (the next period, or an admin raising it), with no restart used "
                       f"({resumes(workload)})", actor=STOP_BUDGET)  # fmt: skip
            if workload.held:  # held while it stopped: it waits for `gpupool release` too
                workload.reason_code = HELD
            return
        if attempt.stop_reason in EVICTIONS:
            attempt.state = EVICTED
            attempt.reason = f"{attempt.reason}; {ended}"
            cause = "node-failure" if attempt.stop_reason == "stale-gang" else "preemption"
            self._requeue_after_eviction(s, workload, attempt.stop_reason, cause)
            return
        if attempt.stop_reason == STOP_TIMEOUT:
            attempt.state = FAILED
            limit = workload.spec.get("max_duration")  # removed since the stop (`gpupool update`): none
            said = "its limit, since removed" if limit is None else f"{limit:g}s"
            attempt.reason = f"exceeded max_duration ({said}); {ended}"
            transition(s, workload, FAILED, attempt.reason, actor="control")
            workload.reason_code = TIMEOUT
            return
        if state.phase is Phase.EXITED and code == 0:
            attempt.state = SUCCEEDED
            attempt.reason = "exit code 0"
            if workload.kind == SERVICE:  # a service that ends on its own starts again (see _retry_or_fail)
                self._retry_or_fail(s, workload, attempt.reason, state.cause)
                return
            transition(s, workload, SUCCEEDED, "exit code 0", actor="control")
            return
        attempt.state = FAILED
        if state.phase is Phase.EXITED:  # which rank or Slurm state, where the backend says
            attempt.reason = f"exit code {code}" + (f" ({state.detail})" if state.detail else "")
        else:
            attempt.reason = f"lost: {state.detail}"
        self._retry_or_fail(s, workload, attempt.reason, state.cause)

    def _requeue_after_eviction(self, s: Session, workload: Workload, code: str, cause: str) -> None:
        """Preempted work goes back to pending (it resumes from its checkpoint) unless its retry policy
        leaves `preemption` out; a preemption uses no restart from `max_restarts`, nor does a node failure
        (`stale-gang`) while `max_node_failures` lasts (`_retry_or_fail`)."""
        retry = workload.spec.get("retry") or {}
        if cause == "preemption" and (workload.kind == SERVICE or cause in (retry.get("on") or [])):
            transition(
                s,
                workload,
                PENDING,
                f"evicted ({code}); requeued ({resumes(workload)})",
                actor="control",
            )
            return
        self._retry_or_fail(s, workload, f"evicted ({code})", cause)

    def _retry_or_fail(self, s: Session, workload: Workload, why: str, cause: str) -> None:
        """A new attempt if the retry policy allows one, else failed. A service always gets one: it runs
        until cancelled, and after a quick exit its next attempt waits (control/restarts.py)."""
        if workload.kind == SERVICE:
            if workload.cancel_requested:
                transition(s, workload, CANCELLED, f"cancelled; {why}", actor="control")
                return
            transition(
                s,
                workload,
                PENDING,
                f"{why}; a service starts again when it stops (restart {workload.restarts + 1})",
                actor="control",
                is_retry=True,
            )
            return
        retry = workload.spec.get("retry") or {}
        retried_on = retry.get("on") or []
        max_failures = int(retry.get("max_node_failures", DEFAULT_MAX_NODE_FAILURES))
        if cause == "node-failure" and cause in retried_on and workload.node_failures < max_failures:
            # Not the work's fault: back to pending, as after a preemption, and no restart used.
            verdict = transition(
                s,
                workload,
                PENDING,
                f"{why}; requeued after node failure {workload.node_failures + 1} of {max_failures} "
                f"({resumes(workload)})",
                actor="control",
            )
            if verdict.accepted:
                workload.node_failures += 1
                return
        max_restarts = int(retry.get("max_restarts", 0))
        if cause in retried_on and workload.restarts < max_restarts:
            verdict = transition(
                s,
                workload,
                PENDING,
                f"{why}; restarting ({workload.restarts + 1}/{max_restarts})",
                actor="control",
                is_retry=True,
            )
            if verdict.accepted:
                return
        transition(s, workload, FAILED, why, actor="control")


def _how_it_ended(code: int | None, *, killed: bool) -> str:
    """An ended attempt's exit, in words: its code, or that none was recorded (SIGKILL leaves none)."""
    if code is None:
        return "killed after the grace period (SIGKILL: no exit code)" if killed else "no exit code recorded"
    return f"exit code {code}" + (" (killed after the grace period)" if killed else "")


def _while_down(attempt: Attempt, state: Status, last_alive: float | None) -> Status:
    """The status of an attempt that ended while the head was down: where it left no end of its own (it
    vanished without its shim's record), the last moment it was seen running, the later of the last head's
    last `record_alive` and its log's last write, is its end, and its reason says so. Unchanged where that
    is unknown (no head wrote one: it is then charged until now, as before)."""
    if state.ended_at is not None or last_alive is None:
        return state
    try:
        written = os.stat(attempt.log_path).st_mtime if attempt.log_path else 0.0
    except OSError:
        written = 0.0
    seen = max(last_alive, written)
    shown = datetime.fromtimestamp(seen, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return replace(
        state, ended_at=seen, detail=f"{state.detail}, while the head was down (last seen running {shown})"
    )


def _ended_at(attempt: Attempt, state: Status) -> datetime:
    """When the attempt ended: as its wrapper recorded it (an attempt that ended while the head was down
    is not charged for the outage), else now, when the head learns it."""
    now, started = utcnow(), as_utc(attempt.started_at)
    if state.ended_at is None or started is None:
        return now
    return min(max(datetime.fromtimestamp(state.ended_at, UTC), started), now)
