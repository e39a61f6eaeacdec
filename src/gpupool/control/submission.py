"""Submitting work: a job, a service's replicas or a job array's tasks, checked against the pool and
committed. No HTTP here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from sqlalchemy import Table, insert, select
from sqlalchemy import update as update_rows
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from gpupool.control import secrets
from gpupool.control.dependencies import check_at_submit
from gpupool.control.errors import Invalid
from gpupool.control.lifecycle import ACTIVE, HELD, PENDING, SERVICE
from gpupool.control.queues import check_priority_cap, require_queue
from gpupool.control.workloads import workload_view
from gpupool.gpu.catalog import families
from gpupool.scheduler import GpuDemand
from gpupool.scheduler.placement import gpu_matches, split_model
from gpupool.spec import WorkloadSpec
from gpupool.spec.arrays import ArrayRange, parse_array
from gpupool.spec.quantities import format_size
from gpupool.store.db import Store
from gpupool.store.models import Event, Gpu, Node, Workload


def submit(
    store: Store, spec: WorkloadSpec, *, user: str = "admin", held: bool = False, admin: bool = True
) -> dict[str, Any]:
    """Validate against the pool, then commit the workload; it is durable when this returns. `held`: it
    waits held until `release` (Slurm's sbatch --hold), a service's replicas and an array's tasks alike.
    A user's (not `admin`) work above its queue's `max_priority` is refused (403)."""
    with store.session() as s:
        require_queue(s, spec.queue)
        if not admin:
            check_priority_cap(s, spec.queue, spec.priority, "submit")
        lacking = _check_gpu_models(s, spec)
        check_at_submit(s, spec.after)
        secrets.check_at_submit(s, user, spec.secrets)
        if spec.workdir is not None and not Path(spec.workdir).is_absolute():
            raise Invalid(
                f"workdir must be an absolute path, got {spec.workdir!r}",
                field="workdir",
                example="/home/me/project",
            )
        first = Workload(
            name=spec.name or "",
            kind=spec.kind,
            queue=spec.queue,
            user=user,
            priority=spec.priority,
            preemptible=spec.preemptible,
            gpus=str(spec.resources.gpu),
            nodes=spec.nodes,
            spec=spec.model_dump(mode="json"),
            state=PENDING,
            reason="waiting for the scheduler",
            held=held,
            attempts=[],  # new: no query needed to know it has none
        )
        s.add(first)
        s.flush()
        named: dict[str, Any] = {}  # what needs its id, written at once (no second flush of the object)
        if not first.name:
            named["name"] = f"{spec.kind}-{first.id}"
        if held:  # the next pass says so too; the store says it at once
            named["reason"] = f"held at submit; `gpupool release {first.id}` lets it start"
            named["reason_code"] = HELD
        if named:
            table = cast(Table, Workload.__table__)
            s.execute(update_rows(table).where(table.c.id == first.id).values(named))
            for key, value in named.items():
                set_committed_value(first, key, value)
        warnings = {
            "warnings": _placement_warnings(s, spec, first.id)
            + _model_warnings(lacking, spec, first.id)
            + (_fit_warnings(s, spec, first.id) if lacking is None else [])
            + _checkpoint_warnings(s, spec, first.id)
        }
        if spec.array is not None:
            return {**_submit_array(s, first, parse_array(spec.array), user), **warnings}
        if spec.kind != SERVICE:
            note_submitted(s, [first], "submitted", user)
            return {**workload_view(first), **warnings}
        first.service_id = first.id
        replicas = [first, *(replica_like(s, first, r) for r in range(1, spec.replicas))]
        s.flush()
        note_submitted(s, replicas, "submitted", user)
        return {**workload_view(first), "replica_ids": [w.id for w in replicas], **warnings}


def _model_warnings(in_pool: list[str] | None, spec: WorkloadSpec, workload_id: int) -> list[str]:
    """What to tell a submitter who asks for GPU models no node of this pool has (`in_pool`: the pool's
    models, from `_check_gpu_models`, None when one asked for is there): accepted, since nodes with them may
    join, but it waits (`no-matching-gpu`) until then, as work pinned to a node that never joined does."""
    if in_pool is None:
        return []
    wanted = spec.resources.gpu.models
    return [
        f"resources.gpu: no node of this pool has {' or '.join(wanted)} GPUs (models here: "
        f"{', '.join(in_pool) or 'none'}); it waits pending until such a node joins: ask for another model, "
        f"or `gpupool cancel {workload_id}`"
    ]


def _fit_warnings(s: Session, spec: WorkloadSpec, workload_id: int) -> list[str]:
    """What to tell a submitter whose work no node of this pool can hold as it is now: more GPUs of its kind
    on one node than any node has, more such nodes than there are, more CPUs or memory than a node has.
    Accepted, since larger nodes may join (Slurm refuses such a request at submit), but it waits pending
    (`too-large`, `no-matching-gpu`) until one does; said at once, as a GPU model the pool lacks is. A pool
    with no node yet (agents not joined) says nothing."""
    nodes = s.execute(select(Node.id, Node.cpus, Node.memory_bytes)).all()  # columns: no object per node
    if not nodes:
        return []
    request, per_pod, pods = spec.resources.gpu, spec.resources.gpu.count, spec.nodes
    demand = GpuDemand(per_pod, request.models, request.min_memory_bytes)
    whole = 1 if request.count < 1 else int(request.count)
    said: list[str] = []
    if per_pod > 0:
        fits = dict.fromkeys((n.id for n in nodes), 0)  # per node, its GPUs that suit the request
        for node_id, model, gpu_memory in s.execute(select(Gpu.node_id, Gpu.model, Gpu.memory_bytes)):
            if gpu_matches(model, gpu_memory, demand):
                fits[node_id] += 1
        matching = sorted(fits.values(), reverse=True)
        holding = sum(1 for count in matching if count >= whole)
        kind = "GPUs"
        if request.models:
            kind = f"{' or '.join(request.models)} GPUs"
        elif request.min_memory_bytes:
            kind = f"GPUs of {format_size(request.min_memory_bytes)} or more"
        if matching[0] == 0:
            said.append(
                f"resources.gpu: no GPU of this pool matches {request}; it waits pending until a node with "
                f"one joins: ask for another, or `gpupool cancel {workload_id}`"
            )
        elif holding == 0:
            said.append(
                f"resources.gpu: no node has {whole} {kind} (the most on one: {matching[0]}); it waits "
                "pending (too-large) until larger nodes join: ask for fewer per node (`nodes: N` spreads a "
                f"job over N nodes), or `gpupool cancel {workload_id}`"
            )
        elif holding < pods:
            nodes_word = "node" if holding == 1 else "nodes"
            said.append(
                f"nodes: {pods} nodes with {whole} {kind} each are asked for, and this pool has {holding} "
                f"such {nodes_word}; it waits pending (too-large) until more join: ask for fewer nodes, or "
                f"`gpupool cancel {workload_id}`"
            )
    cpus, memory = spec.resources.cpu, spec.resources.memory
    most_cpus = _most([n.cpus for n in nodes])
    if cpus and most_cpus is not None and cpus > most_cpus:
        said.append(_too_large("resources.cpu", f"{cpus:g} CPUs", f"{most_cpus:g}", workload_id))
    most_memory = _most([float(n.memory_bytes) for n in nodes])
    if memory and most_memory is not None and memory > most_memory:
        said.append(
            _too_large("resources.memory", format_size(memory), format_size(int(most_memory)), workload_id)
        )
    return said


def _most(have: list[float]) -> float | None:
    """The most any node has, or None where some node did not say (0): no evidence then."""
    return max(have) if have and all(v > 0 for v in have) else None


def _too_large(field: str, asked: str, most: str, workload_id: int) -> str:
    return (
        f"{field}: no node has {asked} (the most on one: {most}); it waits pending (too-large) until a "
        f"larger node joins: ask for less, or `gpupool cancel {workload_id}`"
    )


def _checkpoint_warnings(s: Session, spec: WorkloadSpec, workload_id: int) -> list[str]:
    """What to tell a submitter whose `checkpoint.dir` is the one of work pending or running now: both would
    write (and resume from) the same checkpoint and overwrite each other's. Accepted, as a second run
    meant to resume after the first is; an array's tasks each get a folder of their own."""
    given = spec.checkpoint.dir if spec.checkpoint is not None else None
    if not given or spec.array is not None:
        return []
    mine = _checkpoint_path(given, spec.workdir)
    same = [
        wid
        for wid, workdir in s.execute(
            select(Workload.id, Workload.spec["workdir"].as_string()).where(
                Workload.state.in_(ACTIVE),
                Workload.id != workload_id,
                Workload.array_id.is_(None),
                Workload.spec["checkpoint"]["dir"].as_string() == given,
            )
        )
        if _checkpoint_path(given, workdir) == mine
    ]
    if not same:
        return []
    listed = ", ".join(str(w) for w in same[:5]) + (f" and {len(same) - 5} more" if len(same) > 5 else "")
    return [
        f"checkpoint.dir: {mine} is also the checkpoint of workload {listed}, pending or running: both would "
        f"write and resume from it; give this one its own, or `gpupool cancel {workload_id}`"
    ]


def _checkpoint_path(given: str, workdir: str | None) -> str:
    path = Path(given).expanduser()
    if not path.is_absolute() and workdir:
        path = Path(workdir) / path
    return str(path)


def _placement_warnings(s: Session, spec: WorkloadSpec, workload_id: int) -> list[str]:
    """What to tell a submitter whose `placement.nodes` names a node that never joined: the work is
    accepted (an agent may join under that name later, as Kubernetes takes a nodeSelector no node matches
    yet) but waits pending until then, and a typo would look like a queue that never moves."""
    named = spec.placement.nodes
    if not named:
        return []
    known = set(s.scalars(select(Node.name).where(Node.name.in_(named))))
    unknown = [name for name in named if name not in known]
    if not unknown:
        return []
    nodes = sorted(s.scalars(select(Node.name)))
    listed = ", ".join(nodes[:20]) + (f" and {len(nodes) - 20} more" if len(nodes) > 20 else "") or "none"
    which = f"node {unknown[0]!r}" if len(unknown) == 1 else f"nodes {', '.join(map(repr, unknown))}"
    return [
        f"placement.nodes: no {which} in this pool (nodes: {listed}); it waits pending until such a node "
        f"joins: check the name (`gpupool nodes`), or `gpupool cancel {workload_id}`"
    ]


def _submit_array(s: Session, first: Workload, array: ArrayRange, user: str) -> dict[str, Any]:
    """The tasks of a job array, `first` (flushed, with its id: the array's) being the first index's."""
    first.array_id, first.array_index = first.id, array.indices[0]
    tasks = [first]
    for index in array.indices[1:]:
        task = replica_like(s, first, 0)
        task.array_id, task.array_index = first.id, index
        tasks.append(task)
    s.flush()
    said = [(task, f"submitted: task {task.array_index} of array {first.id}") for task in tasks]
    _add_events(s, said, user)
    return {**workload_view(first), "array_ids": [w.id for w in tasks]}


def replica_like(s: Session, template: Workload, replica: int) -> Workload:
    """A new pending replica `replica` of `template`'s service, added to `s`."""
    workload = Workload(
        name=template.name,
        kind=template.kind,
        queue=template.queue,
        user=template.user,
        priority=template.priority,
        preemptible=template.preemptible,
        gpus=template.gpus,
        nodes=template.nodes,
        spec=template.spec,
        state=PENDING,
        # held with its service or array (held at submit, or the service held since): released with it
        reason=f"held; `gpupool release {template.id}` lets it start"
        if template.held
        else "waiting for the scheduler",
        reason_code=HELD if template.held else "",
        held=template.held,
        service_id=template.service_id,
        replica=replica,
        attempts=[],
    )
    s.add(workload)
    return workload


def note_submitted(s: Session, workloads: list[Workload], reason: str, actor: str) -> None:
    """Each new workload's first event: pending since `reason` (a service's replicas say which they are)."""
    many = len(workloads) > 1 or workloads[0].replica > 0
    _add_events(s, [(w, f"{reason}: replica {w.replica}" if many else reason) for w in workloads], actor)


def _add_events(s: Session, pending_since: list[tuple[Workload, str]], actor: str) -> None:
    """The first event of each new (flushed) workload, with its reason, in one statement: the events are
    never read back in this transaction, so they need no objects (nor a flush of them)."""
    rows = [
        {"object_kind": "workload", "object_id": str(w.id), "from_state": "", "to_state": PENDING,
         "reason": reason, "actor": actor}
        for w, reason in pending_since
    ]  # fmt: skip
    s.execute(insert(cast(Table, Event.__table__)), rows)


def _check_gpu_models(s: Session, spec: WorkloadSpec) -> list[str] | None:
    """Refuse a GPU model that no node has and no catalog knows (a typo would otherwise wait forever). The
    pool's models when it has none of those asked for (a known model: `_model_warnings` says so), else
    None."""
    wanted = spec.resources.gpu.models
    if not wanted:
        return None
    in_pool = {m.upper() for m in s.scalars(select(Gpu.model).distinct())}
    known = {m.upper() for m in families()} | in_pool
    unknown = [m for m in wanted if split_model(m)[0] not in known]
    if unknown:
        raise Invalid(
            f"resources.gpu: unknown GPU model {unknown[0]!r}; models in this pool: "
            f"{', '.join(sorted(in_pool)) or 'none'}; known models: {', '.join(sorted(known))}",
            field="resources.gpu",
            example="H100:8",
        )
    if any(split_model(m)[0] in in_pool for m in wanted):
        return None
    return sorted(in_pool)
