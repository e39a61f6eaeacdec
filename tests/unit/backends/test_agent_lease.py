"""Node leases count only while the head listens: time the head itself stood still is not the agents'."""

from __future__ import annotations

from gpupool.backends.agent import DEAF_GAP, LISTEN_TICK, AgentBackend
from tests.support.process import Clock

LEASE = 10.0


def _states(backend: AgentBackend) -> dict[str, str]:
    inventory = backend.inventory()
    assert inventory is not None
    return {n.name: n.state for n in inventory.nodes}


def _listen_for(
    backend: AgentBackend, clock: Clock, seconds: float, heartbeats: tuple[str, ...] = ()
) -> None:
    """The head runs for `seconds`: its event loop ticks, and the named agents heartbeat every second."""
    end = clock.now + seconds
    while clock.now < end:
        clock.now += LISTEN_TICK
        backend.listening()
        if round(clock.now * 4) % 4 == 0:
            for name in heartbeats:
                backend.heartbeat(name, {"attempts": []})


def _pool() -> tuple[AgentBackend, Clock]:
    clock = Clock()
    backend = AgentBackend(lease=LEASE, clock=clock)
    for name in ("a", "b"):
        backend.register(name, {"gpus": [["H100", 1]]}, "10.0.0.1")
    clock.now += LEASE  # past the first lease after the start
    for name in ("a", "b"):
        backend.heartbeat(name, {"attempts": []})
    backend.listening()
    return backend, clock


def test_a_head_that_stood_still_past_the_lease_loses_no_node() -> None:
    backend, clock = _pool()
    _listen_for(backend, clock, 3.0, heartbeats=("a", "b"))
    clock.now += LEASE + 5.0  # the head stopped: no tick, no heartbeat read
    assert _states(backend) == {"a": "ready", "b": "ready"}  # asked before its loop ran again
    backend.listening()  # the loop runs again; the agents' waiting heartbeats come next
    assert _states(backend) == {"a": "ready", "b": "ready"}
    _listen_for(backend, clock, 3.0, heartbeats=("a", "b"))
    assert _states(backend) == {"a": "ready", "b": "ready"}


def test_an_agent_silent_while_the_head_listens_is_lost_and_a_stall_only_delays_that() -> None:
    backend, clock = _pool()
    _listen_for(backend, clock, LEASE - 4.0, heartbeats=("a",))  # b is silent for 6 s of listening
    clock.now += 30.0  # then the head stands still
    backend.listening()
    assert _states(backend) == {"a": "ready", "b": "ready"}
    _listen_for(backend, clock, 4.0 + DEAF_GAP, heartbeats=("a",))  # b's lease runs out while listening
    assert _states(backend) == {"a": "ready", "b": "lost"}


def test_without_ticks_the_lease_counts_as_before() -> None:
    """A backend whose head has no event loop ticking (none started) judges by its clock alone."""
    clock = Clock()
    backend = AgentBackend(lease=LEASE, clock=clock)
    backend.register("a", {"gpus": [["H100", 1]]}, "10.0.0.1")
    clock.now += LEASE + 1.0
    assert _states(backend) == {"a": "lost"}


def test_a_heartbeat_read_before_the_first_tick_after_a_stall_is_not_put_ahead_of_now() -> None:
    backend, clock = _pool()
    clock.now += 30.0  # the head stands still
    backend.heartbeat("b", {"attempts": []})  # read as the loop runs again, before its tick
    backend.listening()
    _listen_for(backend, clock, LEASE + DEAF_GAP, heartbeats=("a",))  # then b is silent
    assert _states(backend) == {"a": "ready", "b": "lost"}  # one lease after its last heartbeat
