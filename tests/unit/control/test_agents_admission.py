"""Who may register an agent node under a name: a join token admits new names, and a name whose agent is
lost; never a live node's (its work, fencing tokens and secrets would go to whoever holds a join token)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gpupool.backends.agent import AgentBackend
from gpupool.control import agents, submission
from gpupool.control.errors import Invalid
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.spec import parse_workload_spec
from gpupool.store.db import Store
from gpupool.store.models import Event, Node
from tests.support.agent import described
from tests.support.process import Clock

LEASE = 10.0
INFO = {"cpus": 8, "memory_bytes": 1 << 34, "gpus": [["H100", 1]]}


def _register(
    store: Store, backend: AgentBackend, name: str, *, token: str | None = None, credential: str | None = None
) -> str | None:
    """What POST /api/v1/agents/register does: the store admits the node, asking the backend whether the
    name is still held by its agent."""
    return agents.register(
        store,
        name,
        join_token=token,
        credential=credential,
        described=described(backend, name, dict(INFO)),
        still_held=lambda: backend.still_held(name),
    )


def _head(store: Store) -> tuple[AgentBackend, Clock, str, str]:
    """A head with agent node gpu-1 joined; its backend's clock, the (reusable) join token, the node's
    credential."""
    clock = Clock()
    backend = AgentBackend(lease=LEASE, clock=clock)
    token = str(agents.create_join_token(store, 3600)["token"])
    credential = _register(store, backend, "gpu-1", token=token)
    assert credential is not None
    return backend, clock, token, credential


def test_a_join_token_cannot_take_over_a_node_whose_agent_is_alive(store: Store, tmp_path: Path) -> None:
    backend, clock, token, credential = _head(store)
    clock.now += LEASE - 1  # silent, but within its lease
    with pytest.raises(agents.NameTaken) as refused:
        _register(store, backend, "gpu-1", token=token)
    assert refused.value.status == 409 and refused.value.field == "name"
    message = refused.value.message
    assert "node 'gpu-1' belongs to the agent that joined with that name and is not lost" in message
    assert "within the node lease of 10s" in message and "start this agent with another --name" in message
    assert agents.credential_names(store) == {agents.hash_token(credential): "gpu-1"}, "its credential stays"
    # the real agent, restarted with its saved credential (and its join token, as systemd starts it)
    assert _register(store, backend, "gpu-1", token=token, credential=credential) is None


def test_a_lost_node_with_no_work_left_is_taken_back_by_a_join_token(store: Store, tmp_path: Path) -> None:
    """A machine reinstalled (its state dir, and so its credential, gone) joins again under its name once
    the head has seen the old agent lost; the old credential then stops working."""
    backend, clock, token, old = _head(store)
    clock.now += LEASE + 1
    new = _register(store, backend, "gpu-1", token=token)
    assert new is not None and new != old
    assert agents.credential_names(store) == {agents.hash_token(new): "gpu-1"}
    with pytest.raises(agents.Unauthorized, match="not known to this head"):
        _register(store, backend, "gpu-1", credential=old)
    with store.read() as s:
        reasons = [e.reason for e in s.scalars(select(Event).where(Event.object_id == "gpu-1"))]
    assert any("joined again with join token" in r and "the old one was lost" in r for r in reasons), reasons


def test_a_lost_node_is_not_taken_while_its_work_is_still_listed_on_it(store: Store, tmp_path: Path) -> None:
    """The head lists a lost node's attempts until the loop has moved them: a newcomer would be handed
    their launch (script, secrets) with its first heartbeat."""
    backend, clock, token, _ = _head(store)
    reconciler = Reconciler(store, backend, None, ControlSettings(home=tmp_path, node_name="head"))
    spec = parse_workload_spec({"commands": ["sleep 60"], "resources": {"gpu": 1}})
    submission.submit(store, spec)
    clock.now += LEASE  # past the first lease after the head's start
    backend.heartbeat("gpu-1", {"attempts": []})
    reconciler.tick()
    answer, _ = backend.desired("gpu-1", set())
    assert len(answer["attempts"]) == 1, answer
    clock.now += LEASE + 1
    with pytest.raises(agents.NameTaken, match=r"1 attempt\(s\) are still listed on it"):
        _register(store, backend, "gpu-1", token=token)
    for _ in range(3):  # the loop sees the node lost and ends its attempt
        reconciler.tick()
    assert backend.still_held("gpu-1") is None
    assert _register(store, backend, "gpu-1", token=token) is not None
    answer, _ = backend.desired("gpu-1", set())
    assert answer["attempts"] == [], "the newcomer is offered none of the old agent's work"


def test_without_a_word_from_the_backend_a_held_name_is_never_taken(store: Store, tmp_path: Path) -> None:
    backend, clock, token, _ = _head(store)
    clock.now += 10 * LEASE
    with pytest.raises(agents.NameTaken, match="cannot tell whether its agent is alive"):
        agents.register(
            store, "gpu-1", join_token=token, credential=None, described=described(backend, "gpu-1", INFO)
        )


@pytest.mark.parametrize(
    "name",
    [
        "",
        "..",
        "a..b",
        ".gpu",
        "gpu.",
        "$(id)",
        "a\x1b[31mred",
        "a\nb",
        "a b",
        "a/b",
        "gpu_07",
        "-gpu",
        "gpu-",
        "x" * 64,
        ".".join(["x" * 63] * 4) + "x",  # 256 characters
        "gpü",
    ],
)
def test_node_names_are_host_names(store: Store, name: str) -> None:
    backend = AgentBackend(lease=LEASE, clock=Clock())
    token = str(agents.create_join_token(store, 3600)["token"])
    with pytest.raises(Invalid) as refused:
        _register(store, backend, name, token=token)
    assert refused.value.status == 422 and refused.value.field == "name"
    assert "use a host name" in refused.value.message and "--name" in refused.value.message
    assert not backend.knows(name)
    with store.read() as s:
        assert s.scalars(select(Node.name)).all() == []


@pytest.mark.parametrize("name", ["gpu-07", "GPU07", "7", "gpu-07.rack-3.example.com", "x" * 63])
def test_host_names_are_taken(store: Store, name: str) -> None:
    backend = AgentBackend(lease=LEASE, clock=Clock())
    token = str(agents.create_join_token(store, 3600)["token"])
    assert _register(store, backend, name, token=token) is not None


def test_a_node_admitted_before_names_were_checked_keeps_its_name(store: Store) -> None:
    """An agent of a node that joined under a name this head now refuses comes back with its credential."""
    backend = AgentBackend(lease=LEASE, clock=Clock())
    with store.session() as s:
        row: dict[str, Any] = {"state": "ready", "state_reason": "", "labels": {}, "backend": "agent"}
        s.add(Node(name="gpu_07", credential_hash=agents.hash_token("gpn_old"), **row))
    assert _register(store, backend, "gpu_07", credential="gpn_old") is None
