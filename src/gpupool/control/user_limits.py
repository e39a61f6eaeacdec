"""Per-user limits in a queue (the queue spec's `user_limits`, Slurm's MaxTRESPerUser and MaxJobsPerUser):
what one user's running work in a queue may hold at once, so that one person cannot take all of a team's
GPUs while teammates wait.

Each pass gives the scheduler a user's pending work of such a queue, oldest first, only while it fits
under the caps beside what that user already runs there (stopping work counts until it has stopped); the
rest waits with the reason code `user-limit` and counts toward no queue's demand, as an array's `%N` does
(control/arrays.py). Work given to the scheduler that does not start keeps its place: a later, smaller
workload of the same user waits behind it, so the caps hold whatever the scheduler binds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpupool.scheduler import Explanation

USER_LIMIT: Final = "user-limit"  # the reason code of work held back by its queue's user_limits


@dataclass(frozen=True, slots=True)
class Limits:
    gpus: float | None
    workloads: int | None


def limits_of(specs: Iterable[tuple[str, Mapping[str, Any] | None]]) -> dict[str, Limits]:
    """The queues with user limits, from (name, spec) pairs."""
    found: dict[str, Limits] = {}
    for name, spec in specs:
        caps = (spec or {}).get("user_limits")
        if isinstance(caps, Mapping) and (caps.get("gpus") is not None or caps.get("workloads") is not None):
            gpus = caps.get("gpus")
            workloads = caps.get("workloads")
            found[name] = Limits(
                None if gpus is None else float(gpus), None if workloads is None else int(workloads)
            )
    return found


def held_back(
    pending: Iterable[tuple[int, str, str, float]],
    running: Iterable[tuple[str, str, float]],
    limits: Mapping[str, Limits],
    parents: Mapping[str, str | None] | None = None,
) -> dict[int, Explanation]:
    """The pending workloads (id, queue, user, GPUs), in the order the scheduler is to see them, that their
    queue's user limits hold back beside the running work (queue, user, GPUs), and why. A queue's limits
    hold for a user's work in it and in every queue below it (`parents`: queue -> its parent), as Slurm's
    association limits hold for the associations under one."""
    chains: dict[str, tuple[str, ...]] = {}  # queue -> the capped queues it counts in: itself and above

    def capped(queue: str) -> tuple[str, ...]:
        chain = chains.get(queue)
        if chain is None:
            above, seen = [], set()
            at: str | None = queue
            while at is not None and at not in seen:  # a loop in bad data ends the walk
                seen.add(at)
                if at in limits:
                    above.append(at)
                at = (parents or {}).get(at)
            chain = chains[queue] = tuple(above)
        return chain

    used: dict[tuple[str, str], list[float]] = {}  # (capped queue, user) -> [GPUs, workloads]
    for queue, user, gpus in running:
        for cap in capped(queue):
            row = used.setdefault((cap, user), [0.0, 0.0])
            row[0] += gpus
            row[1] += 1
    held: dict[int, Explanation] = {}
    for wid, queue, user, gpus in pending:
        chain = capped(queue)
        rows = [used.setdefault((cap, user), [0.0, 0.0]) for cap in chain]
        why = next(
            (
                said
                for cap, row in zip(chain, rows, strict=True)
                if (said := _over(limits[cap], row, gpus, cap, user))
            ),
            None,
        )
        if why is not None:
            held[wid] = Explanation(USER_LIMIT, why)
            continue
        for row in rows:  # given to the scheduler this pass: it may start
            row[0] += gpus
            row[1] += 1
    return held


def _over(caps: Limits, row: list[float], gpus: float, queue: str, user: str) -> str | None:
    if caps.gpus is not None and gpus > caps.gpus + 1e-9:
        return (
            f"asks for {gpus:g} GPUs, more than the {caps.gpus:g} one user may hold in queue {queue} "
            f"(user_limits.gpus): it starts only once an admin raises the cap (`gpupool queue update {queue} "
            f"--user-gpus {gpus:g}`) or it asks for less"
        )
    if caps.gpus is not None and row[0] + gpus > caps.gpus + 1e-9:
        return (
            f"{user} holds or is next in line for {row[0]:g} of the {caps.gpus:g} GPUs one user may hold "
            f"in queue {queue} and the queues below it (user_limits.gpus), and this needs {gpus:g}; it "
            f"starts as {user}'s earlier work there ends"
        )
    if caps.workloads is not None and row[1] + 1 > caps.workloads:
        return (
            f"{user} runs or is next in line for {int(row[1])} of the {caps.workloads} workloads one user "
            f"may run in queue {queue} and the queues below it (user_limits.workloads); it starts as "
            f"{user}'s earlier work there ends"
        )
    return None
