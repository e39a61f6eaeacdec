"""When work that waits for other workloads may start: dependencies (Slurm's `--dependency`).

A workload whose spec lists `after` stays out of the scheduler's snapshot until every workload it lists has
done what it waits for: succeeded (Slurm's afterok), failed (afternotok), ended in any way (afterany), or
started (after). Until then it is pending with the reason code `dependency`, and counts toward no queue's
demand. Once a workload it waits for can no longer do that (it failed, and this one waits for its success),
the control loop cancels it, which may cancel work waiting for it in turn (Slurm's `kill_invalid_depend`).

Everything here is read from the store each pass, so a restarted head keeps every dependency. A condition
once met stays met (an ended workload never changes state again; one that started keeps its start time),
so a workload whose dependencies were all met is not asked about again.

A job array's id (its first task's, control/arrays.py) names the whole array, as in Slurm: waiting for it
waits for every task.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control.errors import Invalid
from gpupool.control.lifecycle import CANCELLED, FAILED, SERVICE, SUCCEEDED, TERMINAL
from gpupool.scheduler import Explanation
from gpupool.spec.sections import DependencySpec
from gpupool.store.models import MAX_ID, Workload

DEPENDENCY: Final = "dependency"  # the reason code of work waiting for other workloads
CHUNK: Final = 500
# What each condition waits for, as people read it ("waits for workload 12 (prep) to succeed").
WAITS_TO: Final[dict[str, str]] = {
    "succeeded": "succeed",
    "failed": "fail",
    "ended": "end",
    "started": "start",
}

Dependency = tuple[int, str]  # (workload id, condition)
NEVER: Final = "dependency never satisfied"  # how the reason of work cancelled for it begins


@dataclass(frozen=True, slots=True)
class Facts:
    """What the conditions read of a workload waited for."""

    name: str
    kind: str
    state: str
    started: bool  # it has run (an attempt began) at some time
    # A job array's id names the whole array (as in Slurm): each of its tasks' (state, started)
    tasks: tuple[tuple[str, bool], ...] = ()

    def summary(self) -> str:
        """Where it stands, for a sentence: "it is running"; an array's "its tasks: 3 running, 1 pending"."""
        if not self.tasks:
            return f"it is {self.state}"
        counts: dict[str, int] = {}
        for state, _ in self.tasks:
            counts[state] = counts.get(state, 0) + 1
        return "its tasks: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


GONE: Final = Facts("", "", CANCELLED, False)  # a workload waited for that the store no longer holds


def verdict(when: str, facts: Facts) -> bool | None:
    """Whether `when` holds for a workload as `facts` say: True met, False never will be, None not yet.
    For a job array, over its tasks: every one succeeded, or started, or ended; failed once all have
    ended and one failed (Slurm's afternotok)."""
    if facts.tasks:
        each = [verdict(when, Facts("", "", state, started)) for state, started in facts.tasks]
        if when == "failed":
            if any(state not in TERMINAL for state, _ in facts.tasks):
                return None
            return any(held is True for held in each)
        if any(held is False for held in each):
            return False
        return True if all(held is True for held in each) else None
    ended = facts.state in TERMINAL
    if when == "started":
        return True if facts.started else (False if ended else None)
    if not ended:
        return None
    if when == "ended":
        return True
    return facts.state == (SUCCEEDED if when == "succeeded" else FAILED)


def _named(workload_id: int, facts: Facts) -> str:
    what = f"array {workload_id}" if facts.tasks else f"workload {workload_id}"
    return f"{what} ({facts.name})" if facts.name else what


def never_reason(workload_id: int, when: str, facts: Facts) -> str:
    """Why `when` can no longer hold for `workload_id`: "workload 12 (prep) failed, and this one was to
    start after it succeeded"."""
    if facts is GONE:
        did = "is no longer in the store"
    elif facts.tasks:
        did = f"can no longer {WAITS_TO[when]} ({facts.summary()})"  # an array: all its tasks
    elif facts.state == CANCELLED:
        did = "was cancelled" + (" before it started" if not facts.started else "")
    else:
        did = facts.state
    return f"{_named(workload_id, facts)} {did}, and this one was to start after it {when}"


def waiting_explanation(unmet: list[tuple[int, str, Facts]]) -> Explanation:
    """Why a workload waits: each workload it still waits for, what for, and where that one is now."""
    parts = [f"{_named(wid, facts)} to {WAITS_TO[when]} ({facts.summary()})" for wid, when, facts in unmet]
    return Explanation(DEPENDENCY, "waits for " + "; and for ".join(parts))


def read_facts(s: Session, ids: Iterable[int]) -> dict[int, Facts]:
    """The facts of the workloads `ids` that exist, by id (an id past a 64-bit column exists nowhere)."""
    wanted = sorted({i for i in ids if 0 < i <= MAX_ID})
    found: dict[int, Facts] = {}
    arrays: list[int] = []
    for start in range(0, len(wanted), CHUNK):
        rows = s.execute(
            select(
                Workload.id,
                Workload.name,
                Workload.kind,
                Workload.state,
                Workload.started_at,
                Workload.array_id,
            ).where(Workload.id.in_(wanted[start : start + CHUNK]))
        )
        for wid, name, kind, state, started_at, array_id in rows:
            found[int(wid)] = Facts(name, kind, state, started_at is not None)
            if array_id == wid:
                arrays.append(int(wid))
    for start in range(0, len(arrays), CHUNK):
        tasks: dict[int, list[tuple[str, bool]]] = {}
        for array_id, state, started_at in s.execute(
            select(Workload.array_id, Workload.state, Workload.started_at)
            .where(Workload.array_id.in_(arrays[start : start + CHUNK]))
            .order_by(Workload.array_id, Workload.array_index)
        ):
            tasks.setdefault(int(array_id or 0), []).append((state, started_at is not None))
        for array_id, listed in tasks.items():
            found[array_id] = replace(found[array_id], tasks=tuple(listed))
    return found


def check_at_submit(s: Session, after: list[DependencySpec]) -> None:
    """Refuse (422, naming the entry) a dependency on no workload, one a service can never satisfy, or one
    that can no longer be met: such work would never start."""
    facts = read_facts(s, (d.workload for d in after))
    for index, dependency in enumerate(after):
        field = f"after[{index}]"
        found = facts.get(dependency.workload)
        if found is None:
            raise Invalid(
                f"{field}: no workload with id {dependency.workload}; list them with `gpupool ps --all`",
                field=f"{field}.workload",
                example="12",
            )
        if found.kind == SERVICE and dependency.when in ("succeeded", "failed"):
            raise Invalid(
                f"{field}: workload {dependency.workload} ({found.name}) is a service, which runs until "
                f"cancelled and never ends by itself; wait for it with when: started or when: ended",
                field=f"{field}.when",
                example="started",
            )
        if verdict(dependency.when, found) is False:
            raise Invalid(
                f"{field}: {never_reason(dependency.workload, dependency.when, found)}: it would never "
                "start; drop the entry, or wait with when: ended",
                field=field,
                example="ended:12",
            )


def dependencies_of(spec: Mapping[str, object]) -> tuple[Dependency, ...]:
    """The (workload id, condition) pairs a stored spec lists under `after`."""
    listed = spec.get("after")
    if not isinstance(listed, list):
        return ()
    return tuple((int(d["workload"]), str(d.get("when", "succeeded"))) for d in listed)


class Dependencies:
    """The pass's view of the pending work that waits for other workloads (see the module's docstring)."""

    def __init__(self) -> None:
        self._met: set[int] = set()  # workloads whose dependencies were all met: not asked about again
        self.waiting: dict[int, Explanation] = {}  # left out of the last snapshot, and why
        self.never: dict[int, str] = {}  # to cancel, and why: a dependency can no longer be met

    def sort(self, s: Session, listed: Mapping[int, tuple[Dependency, ...]]) -> None:
        """Sort the pending workloads `listed` (each with its dependencies) into met, `waiting` and
        `never`."""
        self.waiting, self.never = {}, {}
        asked = {wid: deps for wid, deps in listed.items() if wid not in self._met}
        if len(self._met) > 2 * len(listed) + 1000:
            self._met &= set(listed)
        if not asked:
            return
        facts = read_facts(s, (dep for deps in asked.values() for dep, _ in deps))
        for wid, deps in asked.items():
            unmet: list[tuple[int, str, Facts]] = []
            never: str | None = None
            for dep, when in deps:
                found = facts.get(dep, GONE)
                held = verdict(when, found)
                if held is False:
                    never = f"{NEVER}: {never_reason(dep, when, found)}"
                    break
                if held is None:
                    unmet.append((dep, when, found))
            if never is not None:
                self.never[wid] = never
            elif unmet:
                self.waiting[wid] = waiting_explanation(unmet)
            else:
                self._met.add(wid)
