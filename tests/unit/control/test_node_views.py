"""The control loop keeps its node views between passes; every change of a node still reaches the
scheduler in the very next pass: cordon, drain, loss, a health verdict, a node joining, GPUs removed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select

from gpupool.backends.agent import AgentBackend
from gpupool.backends.base import Inventory, InventoryNode
from gpupool.control import agents, changes, inventory, nodes
from gpupool.control.loop import Reconciler
from gpupool.control.node_views import NodeViews
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Node, Workload
from tests.support.agent import described, in_process_head
from tests.support.process import Clock
from tests.support.store import join_token, node_of, submit

LEASE = 10.0


def _pool(store: Store, tmp_path: Path, clock: Clock) -> tuple[Reconciler, AgentBackend]:
    """A head with two agent nodes of one GPU each, `a` and `b`, as their agents register them."""
    return in_process_head(store, tmp_path, clock, LEASE)


def _state(store: Store, workload_id: int) -> str:
    with store.read() as s:
        workload = s.get(Workload, workload_id)
        assert workload is not None
        return workload.state


def _cordon(store: Store, backend: AgentBackend, clock: Clock) -> None:
    nodes.set_node_state(store, "b", "cordoned", "maintenance")


def _drain(store: Store, backend: AgentBackend, clock: Clock) -> None:
    nodes.drain_node(store, "b", "kernel upgrade")


def _lose(store: Store, backend: AgentBackend, clock: Clock) -> None:
    clock.now += LEASE + 1  # b falls silent past its lease; a keeps heartbeating
    backend.heartbeat("a", {"attempts": []})


def _fail_health(store: Store, backend: AgentBackend, clock: Clock) -> None:
    with store.session() as s:  # what the health loop writes for an unhealthy verdict
        node = s.scalar(select(Node).where(Node.name == "b"))
        assert node is not None
        node.change_state("unhealthy", "health: GPU 0 Xid 79", "health")


@pytest.mark.parametrize("change", [_cordon, _drain, _lose, _fail_health], ids=lambda f: f.__name__[1:])
def test_a_node_taken_out_of_service_gets_no_work_from_the_next_pass(
    store: Store, tmp_path: Path, change: Callable[[Store, AgentBackend, Clock], None]
) -> None:
    clock = Clock()
    reconciler, backend = _pool(store, tmp_path, clock)
    reconciler.tick()  # the views of a and b are read and kept
    first = submit(store, resources={"gpu": 1})
    reconciler.tick()
    placed = node_of(store, first)
    assert placed is not None

    if placed == "b":  # b must be free to show that nothing more is sent there
        changes.cancel(store, first)
        with store.session() as s:
            attempt = s.scalar(select(Attempt).where(Attempt.workload_id == first))
            assert attempt is not None
            attempt.state = "cancelled"
        reconciler.tick()
    change(store, backend, clock)
    one, two = submit(store, resources={"gpu": 1}), submit(store, resources={"gpu": 1})
    reconciler.tick()

    assert node_of(store, one) != "b" and node_of(store, two) != "b"
    assert "pending" in (_state(store, one), _state(store, two))


def test_an_uncordoned_node_takes_work_at_the_next_pass(store: Store, tmp_path: Path) -> None:
    clock = Clock()
    reconciler, _ = _pool(store, tmp_path, clock)
    nodes.set_node_state(store, "a", "cordoned", "maintenance")
    nodes.set_node_state(store, "b", "cordoned", "maintenance")
    job = submit(store, resources={"gpu": 1})
    reconciler.tick()
    assert _state(store, job) == "pending"

    nodes.set_node_state(store, "b", "ready", "maintenance done")
    reconciler.tick()
    assert node_of(store, job) == "b"


def test_views_are_read_again_only_for_nodes_that_changed(store: Store, tmp_path: Path) -> None:
    clock = Clock()
    _pool(store, tmp_path, clock)
    views = NodeViews()
    first = views.read(store)
    assert [(v.name, v.state, len(v.gpus)) for v in first] == [("a", "ready", 1), ("b", "ready", 1)]
    assert views.read(store) is first  # nothing written: the same views, not read again

    agents.record_heartbeats(store, {"a": clock.now, "b": clock.now})  # no view reads last_heartbeat
    assert views.read(store) is first

    bare_c = InventoryNode("c", "127.0.0.1", "ready", "", cpus=0.0, memory_bytes=0, gpus=())
    same_a = InventoryNode("a", "127.0.0.1", "ready", "", 8.0, 1 << 34, (("H100", 1),))
    new_b = InventoryNode("b", "127.0.0.1", "ready", "", 8.0, 1 << 34, (("H100", 2),), (("zone", "z1"),))
    inventory.apply(store, "agent", Inventory((same_a, new_b), (), 1))
    second = views.read(store)
    assert second[0] is first[0]  # a: untouched, the same object
    assert (second[1].name, len(second[1].gpus), second[1].labels) == ("b", 2, (("zone", "z1"),))

    agents.register(store, "c", join_token=join_token(store), credential=None, described=lambda: bare_c)
    assert [v.name for v in views.read(store)] == ["a", "b", "c"]

    with store.session() as s:
        node = s.scalar(select(Node).where(Node.name == "b"))
        assert node is not None
        node.gpus.remove(node.gpus[0])
    assert len(views.read(store)[1].gpus) == 1


def test_work_on_a_node_lost_during_a_pass_is_retried_on_another_node(store: Store, tmp_path: Path) -> None:
    """A node's lease may run out between a pass's inventory and its look at the running attempts: the look
    ends the node's attempts as node-lost, and their retries must not go back to that node (on a loaded
    machine the retry went there, failed node-lost in turn, and its workload failed, its retries spent)."""
    clock = Clock()
    reconciler, backend = _pool(store, tmp_path, clock)
    reconciler.tick()
    job = submit(store, resources={"gpu": 1}, retry={"max_restarts": 1, "on": ["node-failure"]})
    reconciler.tick()
    lost = node_of(store, job)
    assert lost is not None
    (other,) = {"a", "b"} - {lost}

    clock.now += LEASE - 0.5  # `lost` falls silent, `other` keeps heartbeating
    backend.heartbeat(other, {"attempts": []})
    look = reconciler.observe

    def observe(now: float) -> None:  # the lease of `lost` runs out after the pass's inventory
        clock.now += 1.0
        look(now)

    reconciler.observe = observe  # type: ignore[method-assign]
    reconciler.tick()
    reconciler.observe = look  # type: ignore[method-assign]
    backend.heartbeat(other, {"attempts": []})
    reconciler.tick()

    with store.read() as s:
        attempts = s.scalars(select(Attempt).where(Attempt.workload_id == job).order_by(Attempt.number)).all()
        assert attempts[0].node_name == lost and "node-lost" in attempts[0].reason, attempts[0].reason
        assert [a.node_name for a in attempts[1:]] == [other]
        assert attempts[1].state == "running"


def _join(store: Store, reconciler: Reconciler, backend: AgentBackend, name: str) -> None:
    """What POST /api/v1/agents/register does (api/routes/agents.py): the store row, then the backend's."""
    with reconciler.inventory_lock:
        joining = described(backend, name, {"cpus": 8, "memory_bytes": 1 << 34, "gpus": [["H100", 1]]})
        agents.register(store, name, join_token=join_token(store), credential=None, described=joining)


def test_a_node_joining_while_a_pass_applies_the_inventory_is_not_lost(store: Store, tmp_path: Path) -> None:
    """A pass that took the backend's inventory just before a node joined must not apply it after the join:
    the new node, missing from it, was set lost and came back cordoned for checks (seen under load)."""
    reconciler, backend = _pool(store, tmp_path, Clock())
    reconciler.tick()
    _join(store, reconciler, backend, "c")  # a new generation for the pass below to apply
    taken, resume = threading.Event(), threading.Event()
    inventory = backend.inventory

    def paused() -> Inventory | None:
        current = inventory()
        taken.set()
        resume.wait(10)
        return current

    backend.inventory = paused  # type: ignore[method-assign]
    sync = threading.Thread(target=reconciler.sync_inventory)
    sync.start()
    assert taken.wait(10)
    join = threading.Thread(target=_join, args=(store, reconciler, backend, "d"))
    join.start()
    join.join(0.5)
    assert join.is_alive()  # the join waits for the pass
    resume.set()
    sync.join(10)
    join.join(10)
    backend.inventory = inventory  # type: ignore[method-assign]
    reconciler.tick()

    with store.read() as s:
        states = {n.name: (n.state, n.state_reason) for n in s.scalars(select(Node))}
    assert states["d"] == ("ready", ""), states["d"]
    assert states["c"][0] == "ready"


def test_a_node_that_joins_is_stored_with_its_gpus_before_its_join_is_answered(store: Store) -> None:
    """No reconcile pass between the join and the node's GPUs: a node that joined was `ready` with no GPUs
    until the next pass (`gpupool node ls` showed it so, and a CI run read it so). A refused join leaves
    neither a node nor anything in the backend."""
    backend = AgentBackend(lease=LEASE, clock=Clock())
    devices = [
        {"index": i, "uuid": f"GPU-{i}", "kind": "H100", "nvlink_island": i // 2, "memory_bytes": 80 << 30}
        for i in range(4)
    ]
    info = {"cpus": 8, "memory_bytes": 1 << 34, "gpus": [["H100", 4]], "devices": devices}
    with pytest.raises(agents.Unauthorized, match="invalid join token"):
        agents.register(
            store, "n", join_token="gpj_nope", credential=None, described=described(backend, "n", info)
        )
    assert NodeViews().read(store) == () and not backend.knows("n")

    agents.register(
        store, "n", join_token=join_token(store), credential=None, described=described(backend, "n", info)
    )
    with store.read() as s:
        node = s.scalar(select(Node).where(Node.name == "n"))
        assert node is not None and node.state == "ready" and node.cpus == 8
        gpus = sorted(node.gpus, key=lambda g: g.index)
        assert [(g.uuid, g.model, g.nvlink_island) for g in gpus] == [
            ("GPU-0", "H100", 0), ("GPU-1", "H100", 0), ("GPU-2", "H100", 1), ("GPU-3", "H100", 1)
        ]  # fmt: skip
