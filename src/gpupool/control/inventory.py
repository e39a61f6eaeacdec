"""Nodes and foreign work from a backend that keeps its own inventory (Slurm), kept current in the store.

`apply` writes a backend's `Inventory` into the store: node rows (state, CPUs, memory, GPUs) and the
foreign jobs it runs. `with_foreign_use` folds those foreign jobs into the scheduler's node views, so the
GPUs and CPUs they hold are never handed out. A state the inventory sets carries the reason prefix
`slurm: ` (the backend's name); when the backend reports the node healthy again, only such a state is
lifted, so an operator's own `gpupool node cordon` survives.

An agent node back from `lost` is cordoned with the reason BACK_FROM_LOST rather than made ready: the health
loop (control/health.py) runs its active checks and returns it to service when they pass (health.yaml
`schedule.after_lost`; off: at once). Slurm nodes return at once: Slurm's own health checks judge them.

`delete_node` removes a node that runs nothing (`gpupool node delete`): its row, GPUs and, for an agent
node, its credential. The agent backend keeps the nodes it heard from in memory until the head restarts,
so `apply` does not bring a deleted agent node back (an agent joins again only through registration).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from gpupool import scheduler
from gpupool.backends.base import Inventory, InventoryNode
from gpupool.control import audit
from gpupool.control.errors import Conflict, NotFound
from gpupool.control.lifecycle import CONTROL, PENDING, RUNNING
from gpupool.gpu.catalog import lookup_model
from gpupool.gpu.errors import UnknownGpuModel
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Event, ForeignJob, Gpu, Node, Workload
from gpupool.timeutil import as_utc, utcnow

log = logging.getLogger("gpupool.control")

UNTYPED_MODEL = "GPU"  # the model of a GRES without a type (`Gres=gpu:8`): matches requests with no model
# state_reason of an agent node back from `lost`, cordoned until it passes the active checks (the health
# loop's to lift: its prefix is the health loop's).
BACK_FROM_LOST = "health: back from lost; no new work until it passes the active checks"
# The backend whose nodes join by registration (control/agents.py) and whose leases the head itself decides:
# its nodes' state changes are the head's (actor CONTROL), where Slurm's are Slurm's own, mirrored.
AGENT = "agent"
CHECKED_AFTER_LOST = (AGENT,)  # backends whose nodes gpupool's check jobs reach
DELETED = "deleted"  # how the audit event of a node's deletion begins ("deleted: ...")


def apply(store: Store, backend: str, inventory: Inventory) -> None:
    """Make the store's nodes and foreign jobs of `backend` what the inventory says."""
    # Every node is read in one query and written in one flush (of what changed): a pool of a thousand
    # agents applies its inventory whenever one node comes or goes, on the reconcile loop.
    with store.session() as s, s.no_autoflush:
        gpus = selectinload(Node.gpus).defer(Gpu.last_sample)  # not needed here, and costly to decode
        rows = {n.name: n for n in s.scalars(select(Node).options(gpus))}
        seen = set()
        for item in inventory.nodes:
            seen.add(item.name)
            row = rows.get(item.name)
            # an agent node the backend still lists after `node delete` (it keeps nodes in memory) stays gone
            if row is not None or backend != AGENT or deletion(s, item.name) is None:
                apply_node(s, backend, item, row)
        for node in rows.values():
            if node.backend == backend and node.name not in seen and node.state != "lost":
                _set_state(s, node, "lost", _gone(backend, node))
        _apply_foreign(s, backend, inventory)


def _gone(backend: str, node: Node) -> str:
    """Why a node its backend's inventory no longer lists is lost. The agent backend lists every node it
    heard from since the head started, so an agent node missing from it has sent no heartbeat since."""
    if backend != AGENT:
        return f"{backend}: no longer in the {backend} inventory"
    last = as_utc(node.last_heartbeat)
    said = f"; last heartbeat {last:%Y-%m-%d %H:%M:%S} UTC, before the restart" if last else ""
    return f"{backend}: no heartbeat since the head started{said}"


def deletion(s: Session, name: str) -> Event | None:
    """The audit event of node `name`'s deletion, when that is its latest event (it has not joined since)."""
    event = s.scalar(
        select(Event).where(Event.object_kind == "node", Event.object_id == name).order_by(Event.id.desc())
    )
    return event if event is not None and event.reason.startswith(f"{DELETED}:") else None


def apply_node(s: Session, backend: str, item: InventoryNode, node: Node | None) -> None:
    """Write one node (`node`, its row, None if it has none yet) as `backend` describes it."""
    if node is None:
        node = Node(name=item.name, state="ready", state_reason="", labels={})
        s.add(node)
    _assign(
        node,
        backend=backend,
        address=item.address,
        cpus=item.cpus,
        memory_bytes=item.memory_bytes,
        labels=dict(item.labels),
    )
    if item.state != "lost":  # a lost node's last heartbeat stays when it was (`gpupool nodes`' LAST SEEN)
        node.last_heartbeat = utcnow()
    mine = node.state_reason.startswith(f"{backend}: ")
    if item.state != "ready":
        if node.state != item.state or node.state_reason != item.state_reason:
            _set_state(s, node, item.state, item.state_reason)
    elif node.state == "lost" and backend in CHECKED_AFTER_LOST:
        _set_state(s, node, "cordoned", BACK_FROM_LOST)
    elif mine or node.state == "lost":
        _set_state(s, node, "ready", f"{backend}: in service again")
        node.state_reason = ""
    _apply_gpus(node, item)


def _model(kind: str) -> tuple[str, int]:
    """The catalog's family and memory for a GPU type as a backend names it."""
    if not kind:
        return UNTYPED_MODEL, 0
    try:
        info = lookup_model(kind)
    except UnknownGpuModel:
        return kind.upper(), 0
    return info.family, info.memory_bytes


def _apply_gpus(node: Node, item: InventoryNode) -> None:
    by_index = {g.index: g for g in node.gpus}
    if item.devices:  # device by device (agents): their own UUIDs and NVLink islands
        for device in item.devices:
            model, memory = _model(device.kind)
            gpu = by_index.pop(device.index, None)
            if gpu is None:
                gpu = Gpu(index=device.index)
                node.gpus.append(gpu)
            _assign(
                gpu,
                uuid=device.uuid,
                model=model,
                product_name=device.product_name or device.kind,
                memory_bytes=device.memory_bytes or memory,
                nvlink_island=device.nvlink_island,
                simulated=device.simulated,
            )
    else:  # counts per type (Slurm's GRES): made-up UUIDs, one island
        wanted = []
        for kind, count in item.gpus:
            model, memory = _model(kind)
            wanted.extend([(kind, model, memory)] * count)
        for index, (kind, model, memory) in enumerate(wanted):
            gpu = by_index.pop(index, None)
            if gpu is None:
                gpu = Gpu(index=index)
                node.gpus.append(gpu)
            _assign(
                gpu,
                uuid=f"{node.backend}:{node.name}:{index}",
                model=model,
                product_name=kind or "gpu",
                memory_bytes=memory,
                nvlink_island=0,
                simulated=False,
            )
    for gone in by_index.values():
        node.gpus.remove(gone)


def _assign(row: Node | Gpu, **values: object) -> None:
    """Set only the attributes that differ: an unchanged node of a large inventory costs no ORM events."""
    for key, value in values.items():
        if getattr(row, key) != value:
            setattr(row, key, value)


def _set_state(s: Session, node: Node, state: str, reason: str) -> None:
    before = node.state
    actor = CONTROL if node.backend == AGENT else node.backend
    if node.change_state(state, reason, actor):
        log.info("event=node_state node=%s from=%s to=%s reason=%r", node.name, before, state, reason)


def delete_node(store: Store, name: str, *, actor: str = "admin") -> dict[str, Any]:
    """Remove a node that runs nothing (lost, cordoned, drained or unhealthy, and no running attempt lists
    it): its row and GPUs, and so an agent node's credential (its agent is refused and must join again with
    a join token). Finished attempts keep the node's name. Returns the node as it was, with warnings."""
    with store.session() as s:
        node = s.scalar(select(Node).where(Node.name == name))
        if node is None:
            names = ", ".join(s.scalars(select(Node.name).order_by(Node.name))) or "none"
            raise NotFound(f"no node named {name!r} (nodes: {names})")
        if node.backend != AGENT and node.state_reason != _gone(node.backend, node):
            if node.backend == "local":  # the head's own machine, as `gpupool server --gpus` describes it
                raise Conflict(
                    f"node {name} is the head's own machine (the local backend), which the head lists while "
                    f"it runs with GPUs there: cordon it to keep work off it (`gpupool node cordon {name}`), "
                    "or start the server with `--gpus none`, then delete it",
                    field="name",
                )
            raise Conflict(
                f"node {name} is the {node.backend} backend's, which still lists it: deleted here, it would "
                f"be back with that backend's next inventory. Take it out of the {node.backend} backend "
                "first (Slurm: slurm.conf); once it shows lost (`no longer in the ... inventory`), delete it",
                field="name",
            )
        running = sorted(
            {
                attempt.workload_id
                for attempt in s.scalars(select(Attempt).where(Attempt.state == RUNNING))
                if any(p["node"] == name for p in attempt.pods or [{"node": attempt.node_name}])
            }
        )
        if running:
            listed = ", ".join(map(str, running))
            raise Conflict(
                f"node {name} still runs workload(s) {listed}; move them first with `gpupool node drain "
                f"{name}` (a lost node's work is moved within a moment), then delete it once `gpupool nodes` "
                "shows it drained",
                field="name",
            )
        if node.state == "ready":
            raise Conflict(
                f"node {name} is ready: work may be placed on it at any moment; take it out of service "
                f"first with `gpupool node drain {name}`, then delete it",
                field="name",
            )
        models = sorted({g.model for g in node.gpus})
        view = {
            "name": node.name,
            "backend": node.backend,
            "state": node.state,
            "state_reason": node.state_reason,
            "gpus_total": len(node.gpus),
            "gpu_models": models,
            "warnings": _pinned_warnings(s, name) + _left_running_warnings(node),
        }
        was = f"{node.state}" + (f" ({node.state_reason})" if node.state_reason else "")
        gpus = f"{len(node.gpus)} GPU(s)" + (f" {','.join(models)}" if models else "")
        voided = "; its node credential is void" if node.credential_hash else ""
        s.delete(node)  # its GPUs with it (delete-orphan); control/node_views.py sees both go
        audit.record(s, "node", name, f"{DELETED}: it was {was}; {gpus}{voided}", actor)
    log.info("event=node_deleted node=%s actor=%s", name, actor)
    return view


def _left_running_warnings(node: Node) -> list[str]:
    """A lost agent node may still run what the head moved away: an agent's ranks outlive the agent (so
    that restarting it stops nothing), and a stopped agent kills nothing; deleted, its node's agent can no
    longer be told to."""
    if node.backend != AGENT or node.state != "lost":
        return []
    return [
        f"node {node.name} was lost: if its machine is still up, processes its agent started may still "
        f"run there (an agent's ranks outlive it); stop them on {node.name}, or start its agent once with "
        "its old state dir before deleting, which kills what the head no longer lists"
    ]


def _pinned_warnings(s: Session, name: str) -> list[str]:
    """Pending work that may run on `name` only (its spec's placement.nodes): it waits for a node of that
    name to join again."""
    pinned = []
    for workload_id, spec in s.execute(select(Workload.id, Workload.spec).where(Workload.state == PENDING)):
        allowed = ((spec or {}).get("placement") or {}).get("nodes") or []
        if allowed and set(allowed) <= {name}:
            pinned.append(workload_id)
    if not pinned:
        return []
    listed = ", ".join(map(str, sorted(pinned)))
    return [
        f"pending workload(s) {listed} may run only on {name} (placement.nodes): they wait until a node "
        f"named {name} joins again, or cancel them (`gpupool cancel ID`)"
    ]


def _apply_foreign(s: Session, backend: str, inventory: Inventory) -> None:
    rows = {row.job_id: row for row in s.scalars(select(ForeignJob).where(ForeignJob.backend == backend))}
    now = utcnow()
    for job in inventory.foreign:
        row = rows.pop(job.job_id, None)
        if row is None:
            row = ForeignJob(backend=backend, job_id=job.job_id)
            s.add(row)
            log.info("event=foreign_job_seen backend=%s job=%s nodes=%s", backend, job.job_id, job.nodes)
        row.name, row.user, row.state = job.name[:255], job.user[:63], job.state
        row.nodes = list(job.nodes)
        row.gpus_per_node, row.cpus_per_node = job.gpus_per_node, job.cpus_per_node
        row.gpu_indices = {node: list(indices) for node, indices in job.gpu_indices}
        started = job.started_at
        row.started_at = datetime.fromtimestamp(started, UTC) if started is not None else None
        row.seen_at = now
    for gone in rows.values():
        s.delete(gone)


def with_foreign_use(
    s: Session, nodes: tuple[scheduler.NodeView, ...], running: list[scheduler.WorkloadView]
) -> tuple[scheduler.NodeView, ...]:
    """The node views with every foreign job's GPUs and CPUs marked allocated (outside `running`).

    A foreign job's GPU indices are taken where the backend named them, unless gpupool's own work holds
    them (the backend may number GPUs its own way); the rest of its count goes to the lowest free GPUs.
    """
    foreign = s.scalars(select(ForeignJob)).all()
    if not foreign:
        return nodes
    held: dict[str, set[int]] = {}
    for view in running:
        for pod in view.placement:
            held.setdefault(pod.node, set()).update(pod.gpu_indices)
    taken: dict[str, dict[int, float]] = {}
    cpus: dict[str, float] = {}
    by_name = {n.name: n for n in nodes}
    for job in foreign:
        for name in job.nodes:
            node = by_name.get(name)
            if node is None:
                continue
            cpus[name] = cpus.get(name, 0.0) + job.cpus_per_node
            busy = held.get(name, set())
            marks = taken.setdefault(name, {})
            want = math.ceil(job.gpus_per_node)
            named = [int(i) for i in (job.gpu_indices or {}).get(name, [])]
            order = named + [g.index for g in node.gpus if g.index not in named]
            for index in order:
                if want <= 0:
                    break
                if index in busy or index in marks or index not in {g.index for g in node.gpus}:
                    continue
                marks[index] = 1.0
                want -= 1
    return tuple(
        replace(
            node,
            gpus=tuple(
                replace(g, allocated=max(g.allocated, taken[node.name].get(g.index, 0.0))) for g in node.gpus
            )
            if node.name in taken
            else node.gpus,
            cpus_allocated=node.cpus_allocated + min(node.cpus, cpus.get(node.name, 0.0)),
        )
        for node in nodes
    )


def foreign_jobs(store: Store) -> list[dict[str, object]]:
    """Foreign jobs as the API shows them (`gpupool ps --all`)."""
    with store.read() as s:
        return [
            {
                "backend": row.backend,
                "job_id": row.job_id,
                "name": row.name,
                "user": row.user,
                "state": row.state,
                "nodes": list(row.nodes),
                "gpus_per_node": row.gpus_per_node,
                "cpus_per_node": row.cpus_per_node,
                "gpu_indices": dict(row.gpu_indices),
                "started_at": row.started_at.isoformat() if row.started_at else None,
            }
            for row in s.scalars(select(ForeignJob).order_by(ForeignJob.backend, ForeignJob.id))
        ]
