"""`gpupool node delete` on a real SQLite store and the control loop's own parts: a node that runs nothing
leaves the store, the scheduler's views and the agents' credentials, and stays gone; what the head writes
when it decides an agent node is lost (the reason, the actor). The integration test runs them on a real
head and agents."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from gpupool.backends.agent import AgentBackend
from gpupool.control import agents, inventory, nodes
from gpupool.control.agents import Unauthorized
from gpupool.control.errors import Conflict, NotFound
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.control.node_views import NodeViews
from gpupool.control.tokens import hash_token
from gpupool.store.db import Store
from gpupool.store.models import Event, Gpu, Node
from tests.support.agent import described, in_process_head
from tests.support.process import Clock
from tests.support.store import join_token, node_of, submit

LEASE = 10.0
ONE_GPU = {"cpus": 8, "memory_bytes": 1 << 34, "gpus": [["H100", 1]]}


def _nodes(store: Store) -> dict[str, tuple[str, str]]:
    with store.read() as s:
        return {n.name: (n.state, n.state_reason) for n in s.scalars(select(Node).order_by(Node.name))}


def _node_events(store: Store, name: str) -> list[tuple[str, str, str, str]]:
    with store.read() as s:
        return [
            (e.from_state, e.to_state, e.actor, e.reason)
            for e in s.scalars(
                select(Event).where(Event.object_kind == "node", Event.object_id == name).order_by(Event.id)
            )
        ]


def test_a_deleted_node_leaves_the_scheduler_s_views_and_the_agents_inventory_does_not_bring_it_back(
    store: Store, tmp_path: Path
) -> None:
    reconciler, backend = in_process_head(store, tmp_path, Clock(), LEASE)  # nodes a and b, one GPU each
    views = NodeViews()
    assert [v.name for v in views.read(store)] == ["a", "b"]
    nodes.set_node_state(store, "b", "cordoned", "retiring")

    deleted = inventory.delete_node(store, "b", actor="admin")

    assert (deleted["name"], deleted["state"], deleted["gpus_total"], deleted["warnings"]) == (
        "b", "cordoned", 1, []
    )  # fmt: skip
    assert [v.name for v in views.read(store)] == ["a"]  # the scheduler's next pass does not see it
    with store.read() as s:
        assert s.scalar(select(Gpu).join(Node).where(Node.name == "b")) is None
    assert _node_events(store, "b")[-1] == (
        "", "", "admin", "deleted: it was cordoned (retiring); 1 GPU(s) H100; its node credential is void"
    )  # fmt: skip
    # The agent backend still lists b (it keeps the nodes it heard from until the head restarts): a node
    # that joins makes a new inventory, which the loop applies without bringing b back.
    joining = described(backend, "c", ONE_GPU)
    agents.register(store, "c", join_token=join_token(store), credential=None, described=joining)
    jobs = [submit(store, resources={"gpu": 1}) for _ in range(3)]
    reconciler.tick()
    assert list(_nodes(store)) == ["a", "c"]
    assert sorted(str(node_of(store, job)) for job in jobs) == ["None", "a", "c"]


def test_a_ready_node_or_one_that_runs_work_is_not_deleted_and_the_refusal_says_drain_it_first(
    store: Store, tmp_path: Path
) -> None:
    reconciler, _ = in_process_head(store, tmp_path, Clock(), LEASE)
    with pytest.raises(Conflict, match=r"node b is ready: .*first with `gpupool node drain b`"):
        inventory.delete_node(store, "b")
    job = submit(store, resources={"gpu": 1}, placement={"nodes": ["b"]})
    reconciler.tick()
    assert node_of(store, job) == "b"
    nodes.set_node_state(store, "b", "cordoned", "retiring")  # cordoned, but its work runs on
    with pytest.raises(Conflict, match=rf"node b still runs workload\(s\) {job}; .*`gpupool node drain b`"):
        inventory.delete_node(store, "b")
    with pytest.raises(NotFound, match=r"no node named 'x' \(nodes: a, b\)"):
        inventory.delete_node(store, "x")
    assert list(_nodes(store)) == ["a", "b"]  # nothing changed


def test_pending_work_that_may_run_only_on_a_deleted_node_is_named_and_still_explained(
    store: Store, tmp_path: Path
) -> None:
    reconciler, _ = in_process_head(store, tmp_path, Clock(), LEASE)
    nodes.set_node_state(store, "b", "cordoned", "retiring")
    pinned = submit(store, resources={"gpu": 1}, placement={"nodes": ["b"]})
    anywhere = submit(store, resources={"gpu": 1})
    reconciler.tick()

    deleted = inventory.delete_node(store, "b")
    reconciler.tick()  # the scheduler explains pending work that names a node gone

    assert deleted["warnings"] == [
        f"pending workload(s) {pinned} may run only on b (placement.nodes): they wait until a node named b "
        "joins again, or cancel them (`gpupool cancel ID`)"
    ]
    assert node_of(store, anywhere) == "a"
    assert reconciler.explanations[pinned].message == (  # what `gpupool why` shows
        "needs 1 schedulable node among its placement.nodes (b): b is not in the pool"
    )


def test_the_agent_of_a_deleted_node_is_refused_naming_the_deletion_and_joins_again_with_a_join_token(
    store: Store, tmp_path: Path
) -> None:
    _, backend = in_process_head(store, tmp_path, Clock(), LEASE, nodes=("a",))
    joining = described(backend, "c", ONE_GPU)
    token = join_token(store)
    credential = agents.register(store, "c", join_token=token, credential=None, described=joining)
    assert credential is not None and agents.credential_names(store).get(hash_token(credential)) == "c"
    nodes.set_node_state(store, "c", "cordoned", "retiring")
    assert inventory.delete_node(store, "c", actor="root")["warnings"] == []  # cordoned: its agent stopped it

    assert hash_token(credential) not in agents.credential_names(store)  # heartbeats get 401
    refused = r"node 'c' was deleted from the pool by root at .* UTC .* start the agent with a new --join-tok"
    with pytest.raises(Unauthorized, match=refused):
        agents.register(store, "c", join_token=None, credential=credential, described=joining)
    again = agents.register(store, "c", join_token=token, credential=credential, described=joining)
    assert again is not None and again != credential
    assert _nodes(store)["c"] == ("ready", "")


def test_an_agent_node_lost_says_why_with_the_head_as_actor_and_keeps_its_last_heartbeat(
    store: Store, tmp_path: Path
) -> None:
    clock = Clock()
    reconciler, backend = in_process_head(store, tmp_path, clock, LEASE)
    reconciler.sync_inventory()
    with store.read() as s:
        heard = s.scalar(select(Node.last_heartbeat).where(Node.name == "b"))
    clock.now += LEASE + 1  # b falls silent past its lease; a keeps heartbeating
    backend.heartbeat("a", {"attempts": []})
    reconciler.sync_inventory()

    assert _nodes(store)["b"] == ("lost", "agent: no heartbeat within the node lease (10s)")
    assert _node_events(store, "b")[-1][:3] == ("ready", "lost", "control")  # the head decided it
    with store.read() as s:  # `gpupool nodes`' LAST SEEN: when it was heard from, not when it was lost
        assert s.scalar(select(Node.last_heartbeat).where(Node.name == "b")) == heard


def test_an_agent_node_that_does_not_come_back_after_a_head_restart_is_lost_since_the_start(
    store: Store, tmp_path: Path
) -> None:
    clock = Clock()
    in_process_head(store, tmp_path, clock, LEASE)
    last = time.time() - 30
    agents.record_heartbeats(store, {"a": last, "b": last})
    # The head restarts: a new backend awaits the agent nodes the store knows; only a registers again.
    restarted = AgentBackend(lease=LEASE, clock=clock, known_nodes=agents.agent_node_names(store))
    restarted.register("a", dict(ONE_GPU), "127.0.0.1")
    reconciler = Reconciler(store, restarted, None, ControlSettings(home=tmp_path, node_name="head"))
    reconciler.sync_inventory()
    assert _nodes(store)["b"] == ("ready", "")  # within its first lease the head waits for them
    clock.now += LEASE + 1
    restarted.heartbeat("a", {"attempts": []})
    reconciler.sync_inventory()

    state, reason = _nodes(store)["b"]
    heard = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(last))
    assert (state, reason) == (
        "lost",
        f"agent: no heartbeat since the head started; last heartbeat {heard} UTC, before the restart",
    )
    assert _node_events(store, "b")[-1][:3] == ("ready", "lost", "control")
    assert _nodes(store)["a"] == ("ready", "")


def test_deleting_a_lost_agent_node_warns_that_its_agent_may_have_left_work_running(
    store: Store, tmp_path: Path
) -> None:
    _, backend = in_process_head(store, tmp_path, Clock(), LEASE, nodes=("a",))
    token = join_token(store)
    agents.register(store, "d", join_token=token, credential=None, described=described(backend, "d", ONE_GPU))
    nodes.set_node_state(store, "d", "lost", "agent: no heartbeat within the node lease (10s)")
    (warning,) = inventory.delete_node(store, "d", actor="root")["warnings"]
    assert warning.startswith("node d was lost: if its machine is still up, processes its agent started"), (
        warning
    )
