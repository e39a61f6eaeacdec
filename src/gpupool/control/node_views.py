"""The scheduler's views of the nodes, kept between passes of the control loop: only nodes written since
the last pass are read again.

Reading every node and GPU each pass (1,000 nodes of 8 GPUs: 9,000 rows) was most of an idle pass's
time. Instead every write of a node or GPU that a view depends on marks the node changed when its
transaction commits, whoever writes it in this process (registration, inventory, loss, cordon, drain,
health verdicts): the ORM's flush says which rows it wrote, and a bulk UPDATE or DELETE of those tables
through a session marks every node. The next `NodeViews.read` reloads just the marked nodes, so a change
reaches the very next pass. A write from outside this process (SQL by hand) is seen at the full reload
every FULL_RELOAD_SECONDS, as a Kubernetes informer resyncs.

Marks are taken after commit and a read notes the mark count before it opens its own read transaction,
so a change committed while a read runs is read again at the next pass, never lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import event, inspect, select
from sqlalchemy.orm import ORMExecuteState, Session, object_session

from gpupool import scheduler
from gpupool.store.db import Store
from gpupool.store.models import Gpu, Node

FULL_RELOAD_SECONDS = 30.0
PARTIAL_LIMIT = 200  # more marked nodes than this: one read of every node is cheaper than chunks by id
# What a view is built from; writes of other columns (last_heartbeat every few seconds) change no view.
NODE_COLUMNS = ("name", "state", "cpus", "memory_bytes", "labels")
GPU_COLUMNS = ("node_id", "index", "model", "memory_bytes", "nvlink_island")
UNVIEWED_COLUMNS = frozenset({"last_heartbeat", "last_sample", "credential_hash", "state_reason", "address"})
_PENDING = "gpupool.node_views.pending"  # key in Session.info: node ids (or EVERY) flushed, not committed
EVERY = -1  # a pending mark that stands for every node


class _Marks:
    """Which nodes changed when, in commits: a count of commits that changed nodes, and for each node id
    the count at its last change. Process-wide (the events are); node ids of two stores in one process
    only cost a needless reload."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.changed_at: dict[int, int] = {}
        self.every_at = 0

    def publish(self, ids: set[int]) -> None:
        with self.lock:
            self.count += 1
            if EVERY in ids:
                self.every_at = self.count
                ids = ids - {EVERY}
            for node_id in ids:
                self.changed_at[node_id] = self.count


_marks = _Marks()


def _changed(obj: Any, columns: tuple[str, ...]) -> bool:
    attrs = inspect(obj).attrs
    return any(attrs[name].history.has_changes() for name in columns)


def _gpu_nodes(gpu: Gpu) -> set[int]:
    """The node ids a GPU row belongs or belonged to (EVERY if none is known)."""
    history = inspect(gpu).attrs.node_id.history
    ids = {int(i) for i in (*history.added, *history.unchanged, *history.deleted) if i is not None}
    return ids or {EVERY}


def _mark(target: Node | Gpu, ids: set[int]) -> None:
    session = object_session(target)
    if session is not None:
        session.info.setdefault(_PENDING, set()).update(ids)


# Mapper events, row by row as the flush writes them: they also see GPUs deleted as orphans of their node.
@event.listens_for(Node, "after_insert")
@event.listens_for(Node, "after_delete")
def _node_written(_mapper: Any, _connection: Any, node: Node) -> None:
    _mark(node, {node.id})


@event.listens_for(Node, "after_update")
def _node_updated(_mapper: Any, _connection: Any, node: Node) -> None:
    if _changed(node, NODE_COLUMNS):
        _mark(node, {node.id})


@event.listens_for(Gpu, "after_insert")
@event.listens_for(Gpu, "after_delete")
def _gpu_written(_mapper: Any, _connection: Any, gpu: Gpu) -> None:
    _mark(gpu, _gpu_nodes(gpu))


@event.listens_for(Gpu, "after_update")
def _gpu_updated(_mapper: Any, _connection: Any, gpu: Gpu) -> None:
    if _changed(gpu, GPU_COLUMNS):
        _mark(gpu, _gpu_nodes(gpu))


@event.listens_for(Session, "do_orm_execute")
def _executed(state: ORMExecuteState) -> None:
    """A bulk UPDATE or DELETE of nodes or GPUs (no flush to tell which rows): every node is marked,
    unless it sets only columns no view reads."""
    if not (state.is_update or state.is_delete or state.is_insert):
        return
    table = getattr(state.statement, "table", None)
    if getattr(table, "name", None) not in (Node.__tablename__, Gpu.__tablename__):
        return
    values = getattr(state.statement, "_values", None) or {}
    columns = {getattr(key, "key", key) for key in values}
    if state.is_update and columns and columns <= UNVIEWED_COLUMNS:
        return
    state.session.info.setdefault(_PENDING, set()).add(EVERY)


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    ids = session.info.pop(_PENDING, None)
    if ids:
        _marks.publish(ids)


class NodeViews:
    """Every node as the scheduler sees it, by name; rebuilt only for nodes marked changed since the last
    read. Unchanged nodes keep their view objects (the scheduler recognises them by identity)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._views: dict[int, scheduler.NodeView] = {}  # by node id
        self._ordered: tuple[scheduler.NodeView, ...] = ()
        self._seen = -1  # the mark count the views are current to; -1: never read
        self._loaded_at = float("-inf")

    def read(self, store: Store) -> tuple[scheduler.NodeView, ...]:
        """The views, by node name, current to every commit made before this call."""
        full = self._clock() - self._loaded_at >= FULL_RELOAD_SECONDS
        with _marks.lock:
            count = _marks.count
            if count == self._seen and not full:
                return self._ordered
            full = full or self._seen < 0 or _marks.every_at > self._seen
            ids = [] if full else [i for i, at in _marks.changed_at.items() if at > self._seen]
        if full or len(ids) > PARTIAL_LIMIT:
            with store.read() as s:
                loaded = _load(s, None)
            self._loaded_at = self._clock()
            views = {i: self._keep(i, v) for i, v in loaded.items()}
        else:
            with store.read() as s:
                loaded = _load(s, ids)
            views = dict(self._views)
            for node_id in ids:
                view = loaded.get(node_id)
                if view is None:
                    views.pop(node_id, None)  # removed (or a node id of another store)
                else:
                    views[node_id] = self._keep(node_id, view)
        if views != self._views:
            self._ordered = tuple(sorted(views.values(), key=lambda v: v.name))
        self._views, self._seen = views, count
        return self._ordered

    def _keep(self, node_id: int, view: scheduler.NodeView) -> scheduler.NodeView:
        """The view held before when it is equal (identity then says "unchanged")."""
        held = self._views.get(node_id)
        return held if held is not None and held == view else view


def _load(s: Session, ids: Iterable[int] | None) -> dict[int, scheduler.NodeView]:
    """Views of the nodes `ids` (None: every node), read as plain columns: no ORM objects, and none of the
    GPUs' last telemetry samples (JSON) decoded."""
    nodes = select(Node.id, Node.name, Node.state, Node.cpus, Node.memory_bytes, Node.labels)
    gpus = select(Gpu.node_id, Gpu.index, Gpu.model, Gpu.memory_bytes, Gpu.nvlink_island)
    if ids is not None:
        wanted = list(ids)
        nodes, gpus = nodes.where(Node.id.in_(wanted)), gpus.where(Gpu.node_id.in_(wanted))
    held: dict[int, list[scheduler.GpuView]] = {}
    for node_id, index, model, memory, island in s.execute(gpus.order_by(Gpu.node_id, Gpu.index)):
        held.setdefault(node_id, []).append(scheduler.GpuView(index, model.upper(), memory, island))
    return {
        node_id: scheduler.NodeView(
            name=name,
            schedulable=state == "ready",
            state=state,
            gpus=tuple(held.get(node_id, ())),
            cpus=cpus,
            memory_bytes=memory_bytes,
            labels=tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items())),
        )
        for node_id, name, state, cpus, memory_bytes, labels in s.execute(nodes)
    }
