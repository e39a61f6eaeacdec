"""A caller waiting on work tries a head it cannot reach again for a while (a restart), then gives up with
the connection error; `on_outage` hears how long, and the CLI says it once."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpupool.cli.app import outage_note
from gpupool.client import Client, ConnectionFailed
from gpupool.client.client import Outage


def test_waiting_on_a_head_that_never_answers_gives_up_after_the_outage_limit() -> None:
    heard: list[float | None] = []
    began = time.monotonic()
    with pytest.raises(ConnectionFailed, match="cannot reach the gpupool server"):
        Client(server="http://127.0.0.1:1", token="t").wait(
            [1], poll=0.05, outage=Outage(limit=0.5), on_outage=heard.append
        )
    assert 0.5 <= time.monotonic() - began < 5
    assert len(heard) >= 3 and all(isinstance(s, float) for s in heard)
    assert heard == sorted(heard)


def test_an_outage_ends_when_the_head_answers_and_a_new_one_starts_from_zero() -> None:
    outage = Outage(limit=10)
    error = ConnectionFailed("down")
    assert outage.failed(error) == 0.0
    time.sleep(0.05)
    assert outage.failed(error) >= 0.05
    assert outage.answered() is True and outage.answered() is False
    assert outage.failed(error) == 0.0


def test_the_cli_says_an_outage_once_and_its_end_once(capsys: pytest.CaptureFixture[str]) -> None:
    note = outage_note("http://head:8470")
    for down in (0.0, 1.0, 2.0, None, None):
        note(down)
    said = capsys.readouterr().err
    assert said.count("the head at http://head:8470 cannot be reached (restarting?)") == 1
    assert said.count("the head answers again") == 1


def test_a_wait_begun_with_no_head_waits_for_it_until_its_timeout() -> None:
    """`gpupool wait` looks its workloads up through an outage too (the head may be restarting as the wait
    begins), bounded by --timeout: 124, as when the work outlasts it."""
    env = {"GPUPOOL_SERVER": "http://127.0.0.1:1", "PATH": "/usr/bin:/bin"}
    began = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "gpupool.main", "wait", "7", "--timeout", "2s"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 124, out.stderr
    assert 2 <= time.monotonic() - began < 30
    assert out.stderr.count("cannot be reached (restarting?)") == 1
    assert "--timeout 2s passed before the head answered; the work goes on" in out.stderr


def test_a_call_the_head_took_but_never_answered_says_a_change_may_have_been_made() -> None:
    """A head killed while it handled a submit may have stored it: "cannot reach the server, start one"
    invited the user to submit again (and store it twice)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def hang_up() -> None:  # reads each request, then closes the connection without a word
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        client = Client(server=f"http://127.0.0.1:{port}", token="t")
        with pytest.raises(ConnectionFailed) as submitted:
            client.submit({"commands": ["true"]})
        said = str(submitted.value)
        assert "took the call but gave no answer (RemoteProtocolError)" in said, said
        assert "may have carried it out" in said and "check with `gpupool ps`" in said
        assert "start one with `gpupool server`" not in said
        with pytest.raises(ConnectionFailed, match="may be restarting; try again in a moment"):
            client.workloads()
    finally:
        listener.close()
