"""A rank's log shipped in heartbeats lands once, in order, however the heartbeats that carry it overlap: an
agent that timed out a slow heartbeat sends the same chunk again while the head still writes the first."""

from __future__ import annotations

import base64
import threading
from pathlib import Path

from gpupool.backends.agent import AgentBackend
from gpupool.backends.agent_records import rank_log_path
from tests.unit.backends.test_agent_rendezvous import _launch


def test_a_chunk_sent_again_while_the_first_is_written_lands_once(tmp_path: Path) -> None:
    backend = AgentBackend()
    backend.register("a", {"gpus": [["H100", 1]]}, "10.0.0.1")
    launch = _launch(tmp_path, 1, ("a",))
    backend.start(launch)
    lines = [f"attempt 0 at step {step}\n".encode() for step in range(300)]
    shipped = 0
    for line in lines:  # each chunk delivered by 8 heartbeats at once
        chunk = {"attempt_id": 1, "rank": 0, "token": "token-1", "offset": shipped,
                 "data": base64.b64encode(line).decode()}  # fmt: skip
        start = threading.Barrier(8)
        answers: list[int | None] = []

        def deliver(
            chunk: dict[str, object] = chunk,
            start: threading.Barrier = start,
            answers: list[int | None] = answers,
        ) -> None:
            start.wait()
            answers.append(backend._take_log("a", chunk))

        threads = [threading.Thread(target=deliver) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        shipped += len(line)
        assert answers == [shipped] * 8  # every answer: the head's size, the chunk counted once
    assert rank_log_path(launch.log_path, 0).read_bytes() == b"".join(lines)


def test_a_chunk_from_a_fenced_attempt_is_not_written(tmp_path: Path) -> None:
    backend = AgentBackend()
    backend.register("a", {"gpus": [["H100", 1]]}, "10.0.0.1")
    launch = _launch(tmp_path, 1, ("a",))
    backend.start(launch)
    stale = {"attempt_id": 1, "rank": 0, "token": "an older token", "offset": 0,
             "data": base64.b64encode(b"from a moved attempt\n").decode()}  # fmt: skip
    assert backend._take_log("a", stale) is None
    assert not rank_log_path(launch.log_path, 0).exists()
