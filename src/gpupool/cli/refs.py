"""Workloads as the command line names them: by id, or by the name they were submitted with.

An argument made only of digits is an id (the spec refuses such a name; one stored before that is given by
its id). Any other is a name, standing for the one pending or running workload of that name. A service's
replicas and a job array's tasks share their name, so they count as one, by the id that names them whole:
the service's (replica 0's) or the array's (its first task's). `NAME#N`, as `gpupool ps` shows a replica,
is replica N of the service NAME, and `NAME[N]`, as it shows an array's task, is task N of the array NAME.
Commands that only read (`show`, `why`, `logs`, `wait`) take the newest finished workload of the name when
none is pending or running; commands that change something refuse it, so that a name never reaches ended
work by surprise. Where several users run work of one name, a name stands for the caller's own when only
one of them is theirs.
"""

from __future__ import annotations

import re
from typing import Any, Final

from gpupool.cli.errors import CliError
from gpupool.client import Client

ID_HELP: Final = "a workload's id or name (a name made only of digits: give its id)"
IDS_HELP: Final = "one or more workload ids or names (a name made only of digits: give its id)"
_SHOWN: Final = 10  # the ids an ambiguous name's error lists
_MEMBER_PAGE: Final = 1000  # finished workloads of a name looked through for the newest member N


def workload_ids(c: Client, refs: list[str], *, reading: bool) -> list[int]:
    """The ids `refs` stand for, in their order: every one resolved before the caller acts on any."""
    return [workload_id(c, ref, reading=reading) for ref in refs]


def workload_refs(c: Client, refs: list[str], *, reading: bool) -> list[tuple[int, bool]]:
    """As `workload_ids`, each with whether it names a job array's first task alone: `NAME[N]` of the
    array's first index, whose id is also the array's (which names the whole array); the caller acts on
    that task alone (the API's `task=true`)."""
    return [_resolved(c, ref, reading=reading) for ref in refs]


def workload_id(c: Client, ref: str, *, reading: bool) -> int:
    """The id `ref` stands for (the module docstring says how). `reading`: the command only reads, so a
    name with no pending or running workload stands for its newest finished one."""
    return _resolved(c, ref, reading=reading)[0]


def _resolved(c: Client, ref: str, *, reading: bool) -> tuple[int, bool]:
    if re.fullmatch(r"[0-9]+", ref):
        return int(ref), False
    name, member = _member(ref)
    found, first_task = _found(c, ref, name, member, reading=reading)
    return found, member is not None and member[0] == "array_id" and first_task


def _found(c: Client, ref: str, name: str, member: Member | None, *, reading: bool) -> tuple[int, bool]:
    """The id of the workload `ref` names, and whether it is a job array's first task (its id the array's)."""
    listed = _of_member(c.workloads(name=name), member)
    firsts = {int(w["id"]) for w in listed if w.get("array_id") == w.get("id")}
    found = _one_of(c, ref, listed, member)
    if found is not None:
        return found, found in firsts
    page = 1 if member is None else _MEMBER_PAGE
    newest = _of_member(c.workloads(all=True, name=name, limit=page), member)
    if not newest:
        several = "," in ref or " " in ref.strip()
        hint = "; give each id or name as an argument of its own (--after: repeat it)" if several else ""
        raise CliError(f"no workload is named {ref!r} (gpupool ps lists them){hint}")
    if not reading:
        raise CliError(
            f"no pending or running workload is named {ref!r} (gpupool ps --all lists finished ones)"
        )
    last = newest[-1]
    return _id_of(last, member), last.get("array_id") == last.get("id")


def _one_of(c: Client, ref: str, found: list[dict[str, Any]], member: Member | None) -> int | None:
    """The id the pending or running workloads `found` of a name stand for; None when there are none."""
    active = sorted({_id_of(w, member) for w in found})
    if len(active) == 1:
        return active[0]
    if active:
        # several users may run work of one name: the caller's own, when only one is theirs
        me = str(c.whoami().get("name") or "")
        mine = sorted({_id_of(w, member) for w in found if w.get("user") == me})
        if len(mine) == 1:
            return mine[0]
        whose, ids = ("of your ", mine) if mine and len(mine) < len(active) else ("", active)
        listed = ", ".join(map(str, ids[:_SHOWN])) + (", ..." if len(ids) > _SHOWN else "")
        raise CliError(
            f"{len(ids)} {whose}pending or running workloads are named {ref!r} (ids {listed}): give an id"
        )
    return None


# A member of a service or a job array by its number: (the key naming the whole, the key of the number, N)
Member = tuple[str, str, int]


def _member(ref: str) -> tuple[str, Member | None]:
    """The name in `ref`, and the member it asks for: `NAME#N` (a service's replica N) or `NAME[N]` (an
    array's task N); names have neither '#' nor '['."""
    if match := re.fullmatch(r"(.+)#([0-9]+)", ref):
        return match[1], ("service_id", "replica", int(match[2]))
    if match := re.fullmatch(r"(.+)\[([0-9]+)\]", ref):
        return match[1], ("array_id", "array_index", int(match[2]))
    return ref, None


def _of_member(listed: list[dict[str, Any]], member: Member | None) -> list[dict[str, Any]]:
    """Those of `listed` that are the member asked for (all of them when None)."""
    if member is None:
        return listed
    whole, number, n = member
    return [w for w in listed if w.get(whole) is not None and w.get(number) == n]


def _id_of(w: dict[str, Any], member: Member | None) -> int:
    """The id a name stands for: a replica or task asked for by number, its own; else the id that names
    `w`'s service or job array whole (a plain job's own)."""
    if member is None:
        for key in ("service_id", "array_id"):
            if w.get(key) is not None:
                return int(w[key])
    return int(w["id"])
