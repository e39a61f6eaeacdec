"""Where the head's proxy reaches a service's running replicas, or why none takes requests now."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.control.errors import Conflict, ServiceError, Unavailable
from gpupool.control.lifecycle import FAILED, PENDING, RUNNING, TERMINAL
from gpupool.control.restarts import DEFAULT_BASE, RESTART_BACKOFF, Ended, backoff
from gpupool.control.workloads import (
    Live,
    Ready,
    load_service,
    pending_or_running,
    pending_reason,
    readiness_of,
    replicas_of,
)
from gpupool.store.db import Store
from gpupool.store.models import Workload


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
        workload = load_service(
            s, workload_id, "has an endpoint to reach through the proxy: submit it with kind: service "
            "(or `gpupool run --service`)"
        )  # fmt: skip
        replicas = replicas_of(s, workload)
        active = pending_or_running(replicas)
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
        reason, code = pending_reason(workload, live) if workload.state == PENDING else ("", "")
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
    probed = readiness_of(workload, last, readiness)
    if probed is not None and not probed.ready:
        path = workload.spec["readiness_probe"]
        raise Unavailable(
            f"{name} is not ready: its readiness probe, for attempt {last.number}, {probed.detail}; the "
            f"proxy passes requests on once GET {path} answers 2xx or 3xx"
        )
    described = f"{name}, attempt {last.number} on {last.node_name} at {last.endpoint}"
    return ServiceTarget(last.endpoint, described, workload.id, last.number, probed is not None)
