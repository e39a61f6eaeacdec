"""The GPUs a node is expected to have (remembered at first registration, accepted by an admin) and a node
back from `lost`, which takes no new work until it passes its active checks (control/health.py,
control/inventory.py). On a real SQLite store; the integration test runs them on a real head and agent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select

from gpupool.backends.base import Inventory, InventoryGpu, InventoryNode
from gpupool.control import inventory
from gpupool.control.errors import Conflict, NotFound
from gpupool.control.health import HealthMonitor
from gpupool.control.inventory import BACK_FROM_LOST
from gpupool.control.telemetry import TelemetryCache
from gpupool.gpu.simulated import SimulatedProvider
from gpupool.health.thresholds import HealthConfig, Schedule, parse_config
from gpupool.store.db import Store
from gpupool.store.models import Event, Node


def _devices(count: int) -> tuple[InventoryGpu, ...]:
    return tuple(
        InventoryGpu(i, f"GPU-{i}", "H100", "NVIDIA H100", 0, 0, simulated=True) for i in range(count)
    )


def _described(name: str, gpus: int) -> Callable[[], InventoryNode]:
    """A node as its agent describes it when it joins, with `gpus` H100s."""
    return lambda: _inventory(1, (name, "ready", gpus)).nodes[0]


def _inventory(generation: int, *nodes: tuple[str, str, int]) -> Inventory:
    """Agent nodes as (name, state, GPUs)."""
    return Inventory(
        tuple(
            InventoryNode(
                name,
                "127.0.0.1",
                state,
                "agent: no heartbeat" if state == "lost" else "",
                8.0,
                1 << 30,
                (("H100", gpus),),
                devices=_devices(gpus),
            )
            for name, state, gpus in nodes
        ),
        (),
        generation,
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path}/gpupool.db")
    inventory.apply(store, "agent", _inventory(1, ("node-1", "ready", 2), ("node-2", "ready", 0)))
    return store


def _monitor(store: Store, **schedule: object) -> HealthMonitor:
    config = HealthConfig(overrides={}, schedule=Schedule(**schedule))  # type: ignore[arg-type]
    return HealthMonitor(store, TelemetryCache(), config, local_node="head", local_gpus=None)


def _nodes(store: Store) -> dict[str, tuple[str, str, list[int] | None]]:
    with store.read() as s:
        return {
            n.name: (n.state, n.state_reason, [g["index"] for g in n.expected_gpus or []] or None)
            for n in s.scalars(select(Node))
        }


def test_a_node_is_expected_to_keep_the_gpus_of_its_first_registration(store: Store) -> None:
    _monitor(store).tick()
    assert _nodes(store) == {"node-1": ("ready", "", [0, 1]), "node-2": ("ready", "", None)}
    inventory.apply(store, "agent", _inventory(2, ("node-1", "ready", 1), ("node-2", "ready", 0)))
    _monitor(store).tick()  # registered again with one GPU: still expected to have two
    assert _nodes(store)["node-1"][2] == [0, 1]


def test_an_admin_accepts_a_smaller_node_and_is_refused_when_nothing_differs(store: Store) -> None:
    monitor = _monitor(store)
    monitor.tick()
    with pytest.raises(Conflict, match=r"node node-1 already has the GPUs it is expected to have \(2\)"):
        monitor.accept_gpus("node-1")
    with pytest.raises(NotFound, match=r"no node named 'node-9' \(nodes: node-1, node-2\)"):
        monitor.accept_gpus("node-9")
    inventory.apply(store, "agent", _inventory(2, ("node-1", "ready", 1), ("node-2", "ready", 0)))
    done = monitor.accept_gpus("node-1")
    assert done["result"] == "expected GPUs 2 -> 1; no longer expected: GPU 1 GPU-1"
    assert (done["expected_gpus"], done["was"]) == (1, 2)
    assert _nodes(store)["node-1"][2] == [0]
    with store.read() as s:
        (event,) = s.scalars(select(Event).where(Event.object_id == "node-1", Event.actor == "admin"))
        assert event.reason == "accepted by admin: expected GPUs 2 -> 1; no longer expected: GPU 1 GPU-1"
    inventory.apply(store, "agent", _inventory(3, ("node-1", "lost", 1), ("node-2", "ready", 0)))
    with pytest.raises(Conflict, match="node node-1 is lost"):
        monitor.accept_gpus("node-1")


def test_a_pass_that_read_the_nodes_before_an_accept_keeps_what_the_accept_set(store: Store) -> None:
    """The health loop reads the nodes, then keeps what it read; an admin's `accept-gpus` in between must
    not be undone by the older read (the node, judged against the GPU just accepted as gone, would fall
    unhealthy again: seen once in CI as a node back `ready` with an `unhealthy` verdict)."""
    monitor = _monitor(store)
    monitor.tick()
    inventory.apply(store, "agent", _inventory(2, ("node-1", "ready", 1), ("node-2", "ready", 0)))
    with monitor._lock:
        began = monitor._accepted
    read = monitor._read_nodes()  # a pass reads: node-1 expected to have 2 GPUs
    monitor.accept_gpus("node-1")
    monitor._keep_nodes(read, began)
    assert monitor._expected_now["node-1"] == 1
    with monitor._lock:
        now = monitor._accepted
    monitor._keep_nodes(monitor._read_nodes(), now)  # the next pass: from the store, as accepted
    assert monitor._expected_now["node-1"] == 1


def test_an_agent_node_back_from_lost_is_cordoned_until_its_checks_pass_and_a_slurm_node_is_not(
    store: Store,
) -> None:
    inventory.apply(store, "agent", _inventory(2, ("node-1", "lost", 2), ("node-2", "ready", 0)))
    inventory.apply(store, "agent", _inventory(3, ("node-1", "ready", 2), ("node-2", "ready", 0)))
    assert _nodes(store)["node-1"][:2] == ("cordoned", BACK_FROM_LOST)
    _monitor(store).tick()  # no check job can run here (no agent connected): it stays out
    assert _nodes(store)["node-1"][:2] == ("cordoned", BACK_FROM_LOST)
    _monitor(store, after_lost=False).tick()
    assert _nodes(store)["node-1"][:2] == (
        "ready",
        "health: back from lost; in service at once (health.yaml schedule.after_lost: false)",
    )

    slurm = [("gpu-1", "ready", 2)]
    inventory.apply(store, "slurm", _inventory(1, *slurm))
    inventory.apply(store, "slurm", _inventory(2))
    assert _nodes(store)["gpu-1"][0] == "lost"
    inventory.apply(store, "slurm", _inventory(3, *slurm))
    assert _nodes(store)["gpu-1"][:2] == ("ready", "")


def test_a_node_taken_out_before_it_was_lost_goes_back_to_unhealthy_not_cordoned(store: Store) -> None:
    with store.session() as s:
        node = s.scalars(select(Node).where(Node.name == "node-1")).one()
        node.change_state("unhealthy", "health: GPU 0: Xid 79 (hardware)", "health")
    inventory.apply(store, "agent", _inventory(2, ("node-1", "lost", 2), ("node-2", "ready", 0)))
    inventory.apply(store, "agent", _inventory(3, ("node-1", "ready", 2), ("node-2", "ready", 0)))
    _monitor(store).tick()  # a restarted head: it reads the node events
    state, reason, _ = _nodes(store)["node-1"]
    assert state == "unhealthy" and reason.startswith("health: GPU 0: Xid 79 (hardware) (not back in service")


def test_after_lost_in_health_yaml_is_true_or_false() -> None:
    assert parse_config({"schedule": {"after_lost": False}}).schedule.after_lost is False
    assert parse_config(None).schedule == Schedule(after_lost=True, after_lost_level="quick")
    with pytest.raises(ValueError, match=r"schedule\.after_lost: 'off' is not true or false"):
        parse_config({"schedule": {"after_lost": "off"}})
    with pytest.raises(ValueError, match=r"schedule\.after_lost_level: 'slow'; one of quick, full"):
        parse_config({"schedule": {"after_lost_level": "slow"}})


def test_a_node_that_joins_with_fewer_gpus_than_its_join_token_declares_is_unhealthy_until_accepted(
    store: Store,
) -> None:
    from gpupool.control import agents
    from gpupool.control.errors import Invalid

    for bad in (-1, 1025, 2.5, "eight", True):
        with pytest.raises(Invalid, match=r"gpus must be a whole number of GPUs per node, 0\.\.1024"):
            agents.create_join_token(store, 3600.0, gpus=bad)
    token = agents.create_join_token(store, 3600.0, "rack 12", gpus=8)
    assert token["gpus"] == 8 and agents.list_join_tokens(store)[-1]["gpus"] == 8
    agents.register(
        store, "node-3", join_token=token["token"], credential=None, described=_described("node-3", 4)
    )
    inventory.apply(store, "agent", _inventory(2, ("node-1", "ready", 2), ("node-3", "ready", 4)))
    monitor = _monitor(store)
    telemetry = monitor.telemetry
    samples = [s.to_dict() for s in SimulatedProvider("sim:4xH100", seed="n3").sample()]
    for row in samples:
        row["uuid"] = f"GPU-{row['index']}"  # the UUIDs the inventory registered
    telemetry.put("node-3", samples)
    monitor.tick()
    assert _nodes(store)["node-3"] == (
        "unhealthy", "health: 4 of 8 expected GPUs answer; 4 never registered (its join token declares 8)",
        [0, 1, 2, 3],
    )  # fmt: skip
    assert monitor.views()["node-3"]["expected_gpus"] == 8 and monitor.views()["node-3"]["declared_gpus"] == 8
    done = monitor.accept_gpus("node-3")
    assert done["result"] == "expected GPUs 8 -> 4; its join token declared 8, it registered 4"
    with store.read() as s:
        assert s.scalars(select(Node.declared_gpus).where(Node.name == "node-3")).one() is None
    monitor.tick()
    assert monitor.views()["node-3"]["findings"] == [] and monitor.views()["node-3"]["expected_gpus"] == 4
    # A node whose GPUs are known already keeps them when it joins again with a declaring token.
    again = agents.create_join_token(store, 3600.0, gpus=16)
    agents.register(
        store, "node-1", join_token=again["token"], credential=None, described=_described("node-1", 2)
    )
    with store.read() as s:
        assert s.scalars(select(Node.declared_gpus).where(Node.name == "node-1")).one() is None


def test_a_node_that_declares_gpus_but_registers_none_is_unhealthy_once_it_has_had_time_to(
    store: Store,
) -> None:
    """Its driver lists no GPU (all fell off the bus): no samples come to judge, so the count alone is the
    verdict, after STALE_AFTER (an agent registers its GPUs with its first heartbeats)."""
    from gpupool.control import agents
    from gpupool.control.health_judge import STALE_AFTER

    token = agents.create_join_token(store, 3600.0, gpus=8)
    agents.register(
        store, "node-4", join_token=token["token"], credential=None, described=_described("node-4", 0)
    )
    inventory.apply(store, "agent", _inventory(2, ("node-1", "ready", 2), ("node-4", "ready", 0)))
    monitor = _monitor(store)
    monitor.tick(now=1000.0)
    monitor.tick(now=1000.0 + STALE_AFTER - 1)
    assert _nodes(store)["node-4"] == ("ready", "", None)  # its GPUs may still be on their way
    monitor.tick(now=1000.0 + STALE_AFTER)
    why = "health: 0 of 8 expected GPUs answer; 8 never registered (its join token declares 8)"
    assert _nodes(store)["node-4"] == ("unhealthy", why, None)
    assert _nodes(store)["node-1"][:2] == ("ready", "")  # no declaration: no samples, no verdict, as before
