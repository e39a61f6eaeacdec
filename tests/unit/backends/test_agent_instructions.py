"""The head's instructions to a node's agent: listed in every heartbeat answer until the reply comes back."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gpupool.backends.agent import AgentBackend
from gpupool.backends.agent_heartbeats import UnknownNode


def _backend() -> AgentBackend:
    backend = AgentBackend()
    backend.register("a", {"gpus": [["H100", 1]]}, "10.0.0.1")
    backend.register("b", {"gpus": [["H100", 1]]}, "10.0.0.2")
    return backend


def _listed(backend: AgentBackend, node: str) -> list[dict[str, Any]]:
    answer, _ = backend.desired(node, set())
    return list(answer.get("instructions", []))


def test_an_instruction_is_listed_for_its_node_until_the_agent_replies() -> None:
    backend = _backend()
    replies: list[dict[str, Any]] = []
    asking = threading.Thread(
        target=lambda: replies.append(backend.ask("a", {"kind": "health_check", "level": "quick"}, 10.0))
    )
    asking.start()
    deadline = time.time() + 5
    while not _listed(backend, "a") and time.time() < deadline:
        time.sleep(0.01)
    (instruction,) = _listed(backend, "a")
    assert instruction["kind"] == "health_check" and _listed(backend, "b") == []
    backend.heartbeat("a", {"attempts": []})  # a heartbeat without the reply changes nothing
    assert _listed(backend, "a") == [instruction]

    backend.heartbeat("b", {"instruction_results": [{"id": instruction["id"], "result": "wrong node"}]})
    backend.heartbeat("a", {"instruction_results": [{"id": instruction["id"], "result": {"level": "quick"}}]})
    asking.join(5)
    assert replies == [{"id": instruction["id"], "result": {"level": "quick"}}]
    assert _listed(backend, "a") == []


def test_no_reply_in_time_is_a_timeout_and_the_instruction_is_withdrawn() -> None:
    backend = _backend()
    with pytest.raises(TimeoutError, match=r"no reply from its agent within 0\.2s"):
        backend.ask("a", {"kind": "inject_fault"}, 0.2)
    assert _listed(backend, "a") == []
    with pytest.raises(UnknownNode):
        backend.ask("nowhere", {"kind": "inject_fault"}, 0.2)
