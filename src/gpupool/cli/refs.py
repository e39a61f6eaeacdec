"""Workloads as the command line names them: by id, or by the name they were submitted with.

An argument made only of digits is an id (the spec refuses such a name; one stored before that is given by
its id). Any other is a name, standing for the one pending or running workload of that name. A service's
replicas and a job array's tasks share their name, so they count as one, by the id that names them whole:
the service's (replica 0's) or the array's (its first task's). `NAME#N`, as `gpupool ps` shows a replica,
is replica N of the service NAME, and `NAME[N]`, as it shows an array's task, is task N of the array NAME;
`ID_N`, as Slurm writes it, is task N of the array whose id is ID. Commands that take several workloads
take several tasks in one argument, as Slurm's scancel does: `NAME[1-3,7]`, `ID_[1-3,7]`.
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
IDS_HELP: Final = (
    "one or more workload ids or names (a name made only of digits: give its id); an array's tasks as "
    "NAME[1-3,7] or ID_[1-3]"
)
_SHOWN: Final = 10  # the ids an ambiguous name's error lists
_MEMBER_PAGE: Final = 1000  # finished workloads of a name looked through for the newest member N
MAX_TASKS: Final = 1000  # the tasks one `NAME[1-3]` may name (as many as an array may have)
# NAME[1-3,7], NAME[1..3] (as ps shows them), ID_[1-3]; NAME[3], one task, as `_member` reads it
_TASKS = re.compile(r"(.+?)(\[|_\[)([^\]]*)\]")
_MEMBER_TASK = re.compile(r".+\[[0-9]+\]")
_SLURM_TASK = re.compile(r"([0-9]+)_([0-9]+)")  # ID_N


def workload_ids(c: Client, refs: list[str], *, reading: bool) -> list[int]:
    """The ids `refs` stand for, in their order: every one resolved before the caller acts on any."""
    return [found for found, _ in workload_refs(c, refs, reading=reading)]


def workload_refs(c: Client, refs: list[str], *, reading: bool) -> list[tuple[int, bool]]:
    """As `workload_ids`, each with whether it names a job array's first task alone: `NAME[N]` of the
    array's first index, whose id is also the array's (which names the whole array); the caller acts on
    that task alone (the API's `task=true`). A range of tasks (`NAME[1-3,7]`) stands for each of them."""
    reads = _Reads(c)
    found: list[tuple[int, bool]] = []
    for ref in refs:
        tasks = _tasks(ref)
        if len(tasks) == 1:
            found.append(_resolved(reads, ref, reading=reading))
            continue
        # a range takes the tasks it can (scancel 12_[0-9] cancels those not yet done): one that has
        # ended, or that the array never had, is passed over, unless none can be taken
        taken: list[tuple[int, bool]] = []
        missed: list[CliError] = []
        for task in tasks:
            try:
                taken.append(_resolved(reads, task, reading=reading))
            except CliError as error:
                missed.append(error)
        if not taken:
            raise CliError(f"{ref}: none of its tasks can be taken ({missed[0]})")
        found += taken
    return found


def workload_id(c: Client, ref: str, *, reading: bool) -> int:
    """The id `ref` stands for (the module docstring says how). `reading`: the command only reads, so a
    name with no pending or running workload stands for its newest finished one."""
    if len(_tasks(ref)) > 1:
        raise CliError(f"{ref} names several tasks; this command takes one (e.g. {_tasks(ref)[0]})")
    return _resolved(_Reads(c), ref, reading=reading)[0]


class _Reads:
    """One command's reads of the API, each made once: the tasks of a range (`sweep[1-300]`) are found in
    one listing of their name, not one each (each token may make 50 calls a second)."""

    def __init__(self, c: Client) -> None:
        self._c = c
        self._listed: dict[tuple[str, bool, int | None], list[dict[str, Any]]] = {}
        self._shown: dict[int, dict[str, Any]] = {}
        self._me: dict[str, Any] | None = None

    def workloads(self, *, name: str, all: bool = False, limit: int | None = None) -> list[dict[str, Any]]:
        key = (name, all, limit)
        if key not in self._listed:
            self._listed[key] = self._c.workloads(name=name, all=all, limit=limit)
        return self._listed[key]

    def workload(self, workload_id: int) -> dict[str, Any]:
        if workload_id not in self._shown:
            self._shown[workload_id] = self._c.workload(workload_id)
        return self._shown[workload_id]

    def whoami(self) -> dict[str, Any]:
        if self._me is None:
            self._me = self._c.whoami()
        return self._me


def _tasks(ref: str) -> list[str]:
    """The one-task references a range of tasks stands for (`sweep[1-3]` or `sweep[1..3]`, as `gpupool ps`
    shows pending tasks -> sweep[1], sweep[2], sweep[3]; `12_[1,4]` -> 12_1, 12_4); any other reference
    alone. A name has no "[", so anything else in brackets is refused, not looked up as a name."""
    if "[" not in ref:
        return [ref]
    match = _TASKS.fullmatch(ref)
    slurm = match is not None and match[2] == "_[" and match[1].isdigit()  # ID_[3], ID_[1-3]
    if _MEMBER_TASK.fullmatch(ref) and not slurm:
        return [ref]
    whole = ref.partition("[")[0].removesuffix("_") or "NAME"
    if match is None:
        raise CliError(
            f"{ref}: not a task or a range of tasks; e.g. {whole}[3], {whole}[1-3,7] or {whole}[2..9]"
        )
    whole, opening, listed = match[1], match[2], match[3]
    if opening == "_[" and not whole.isdigit():  # a name ending in "_": NAME_[1-3]
        whole, opening = f"{whole}_", "["
    indices: dict[int, None] = {}
    for part in listed.split(","):
        low, dash, high = part.replace("..", "-").partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or (dash and int(high) < int(low)):
            raise CliError(f"{ref}: {part!r} is not a task index or range; e.g. {whole}{opening}1-3,7]")
        first, last = int(low), int(high if dash else low)
        if last - first + 1 + len(indices) > MAX_TASKS:  # counted before any is listed: `[0-10**20]`
            raise CliError(f"{ref}: more than {MAX_TASKS:,} tasks; name the array whole by its name or id")
        indices.update(dict.fromkeys(range(first, last + 1)))
    if opening == "_[":
        return [f"{whole}_{i}" for i in indices]
    return [f"{whole}[{i}]" for i in indices]


def _resolved(c: _Reads, ref: str, *, reading: bool) -> tuple[int, bool]:
    if re.fullmatch(r"[0-9]+", ref):
        return int(ref), False
    if slurm := _SLURM_TASK.fullmatch(ref):
        return _slurm_task(c, ref, int(slurm[1]), int(slurm[2]), reading=reading)
    name, member = _member(ref)
    found, first_task = _found(c, ref, name, member, reading=reading)
    return found, member is not None and member[0] == "array_id" and first_task


def _found(c: _Reads, ref: str, name: str, member: Member | None, *, reading: bool) -> tuple[int, bool]:
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


def _slurm_task(c: _Reads, ref: str, array: int, index: int, *, reading: bool) -> tuple[int, bool]:
    """Task `index` of the job array whose id is `array` (`ref` is Slurm's ID_N), and whether it is the
    array's first task."""
    whole = c.workload(array)
    if whole.get("array_id") != array:
        raise CliError(f"{ref}: workload {array} is not a job array (ID_N is task N of the array ID)")
    member: Member = ("array_id", "array_index", index)
    listed = [w for w in _of_member(c.workloads(name=str(whole["name"])), member) if w["array_id"] == array]
    if not listed:
        ended = c.workloads(all=True, name=str(whole["name"]), limit=_MEMBER_PAGE)
        listed = [w for w in _of_member(ended, member) if w["array_id"] == array]
        if not listed:
            raise CliError(f"{ref}: job array {array} ({whole['name']}) has no task {index}")
        if not reading:
            raise CliError(f"{ref}: task {index} of job array {array} has ended ({listed[-1]['state']})")
    task = int(listed[-1]["id"])
    return task, task == array


def _one_of(c: _Reads, ref: str, found: list[dict[str, Any]], member: Member | None) -> int | None:
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
