"""The tests' own server fixture: with tests in several processes, a port chosen free can be taken by another
test's server before this one binds it. Its answers must not pass for this server's."""

from __future__ import annotations

from pathlib import Path

from tests.support.server import ServerProcess


def test_a_server_whose_port_another_took_comes_up_on_another_port(tmp_path: Path) -> None:
    first = ServerProcess(home=tmp_path / "first").start()
    try:
        second = ServerProcess(home=tmp_path / "second", port=first.port).start()
        try:
            assert second.port != first.port
            assert second.token != first.token  # its own credentials: it answers for itself
            with second.http() as client:
                assert client.get("/api/v1/queues").status_code == 200
        finally:
            second.stop()
    finally:
        first.stop()
