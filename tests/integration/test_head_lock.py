"""One head acts on a store at a time (store/head_lock.py): two heads on one store each started, evicted and
failed the same work (a job ran six times at once). A second head is refused naming the first; with
--standby it waits and takes over when the first dies; a head that lost the lock to another stops."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from gpupool.store.head_lock import HEAD_LOCK, HeadLock, HeadLockHeld
from tests.support.agent import AgentProcess, Pool, join_token
from tests.support.postgres import PostgresServer, database_url
from tests.support.process import kill_attempts_under
from tests.support.server import ServerProcess


@pytest.fixture
def heads(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """The heads a test starts, each stopped at its end, with the work they started."""
    started: list[ServerProcess] = []
    yield started
    for head in started:
        head.stop()
    kill_attempts_under(tmp_path)


def _wait_for_log(head: ServerProcess, text: str, timeout: float = 30.0) -> str:
    deadline = time.time() + timeout
    while text not in head.log():
        assert head.proc is not None
        if head.proc.poll() is not None or time.time() > deadline:
            raise AssertionError(f"never said {text!r} (exit {head.proc.poll()}):\n{head.log()}")
        time.sleep(0.1)
    return head.log()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_second_head_on_one_store_is_refused_naming_the_first(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, heads: list[ServerProcess]
) -> None:
    request.param = kind  # database_url reads the kind as a parametrized fixture's
    url = database_url(request, tmp_path)
    first = ServerProcess(home=tmp_path / "one", db_url=url).start()
    heads.append(first)
    second = ServerProcess(home=tmp_path / "two", db_url=url)
    heads.append(second)
    second.launch()
    assert second.proc is not None
    assert second.proc.wait(timeout=60) == 1, second.log()
    assert first.proc is not None
    said = second.log()
    assert f"another head acts on this store: gpupool head pid {first.proc.pid} on " in said, said
    assert f"{first.url}" in said and "--standby" in said, said
    assert "Traceback" not in said, said
    job = first.submit({"commands": ["echo ran"], "resources": {"gpu": 1}})  # the first acts on, alone
    assert first.wait_for(job["id"])["state"] == "succeeded"


def test_a_standby_head_takes_over_the_work_when_the_active_one_is_killed(
    postgres: PostgresServer, tmp_path: Path, heads: list[ServerProcess]
) -> None:
    url = postgres.new_database(f"standby_{uuid.uuid4().hex[:12]}")
    first = ServerProcess(home=tmp_path / "one", db_url=url).start()
    heads.append(first)
    # on the same machine, on the same port: it listens only once it takes over, at the address users have
    standby = ServerProcess(home=tmp_path / "two", db_url=url, port=first.port, extra_args=["--standby"])
    heads.append(standby)
    (standby.home).mkdir(parents=True)
    shutil.copy(first.home / "credentials", standby.home / "credentials")  # the admin token is the store's
    standby.launch()
    assert "standby: waits to take over the store, held by gpupool head pid" in _wait_for_log(
        standby, "standby: waits"
    )
    job = first.submit({"commands": ["sleep 4; echo done"], "resources": {"gpu": 1}})
    first.wait_for(job["id"], states=("running",))
    time.sleep(1.0)  # the standby, still waiting, neither listens nor acts
    assert not standby._listening()
    first.kill9()
    standby.wait_healthy(timeout=30)
    assert "standby: the store is this head's now; taking over" in standby.log()
    ended = standby.wait_for(job["id"], timeout=30)
    assert (ended["state"], ended["attempts"]) == ("succeeded", 1), ended  # adopted, ran once
    again = standby.submit({"commands": ["echo after"], "resources": {"gpu": 1}})
    assert standby.wait_for(again["id"])["state"] == "succeeded"


def test_a_head_whose_lock_another_took_stops_acting_and_exits(
    postgres: PostgresServer, tmp_path: Path, heads: list[ServerProcess]
) -> None:
    url = postgres.new_database(f"fenced_{uuid.uuid4().hex[:12]}")
    head = ServerProcess(home=tmp_path / "one", db_url=url).start()
    heads.append(head)
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True, application_name="another head") as usurper:
        holder = (
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        deadline = time.time() + 30
        while True:  # cut the head's lock connection and take the lock before the head takes it again
            assert time.time() < deadline, head.log()
            for (pid,) in usurper.execute(holder, (HEAD_LOCK,)).fetchall():
                usurper.execute("SELECT pg_terminate_backend(%s)", (pid,))
            if usurper.execute("SELECT pg_try_advisory_lock(%s)", (HEAD_LOCK,)).fetchone() == (True,):
                break
        assert head.proc is not None
        assert head.proc.wait(timeout=30) == 1, head.log()
    said = head.log()
    assert "event=head_fenced" in said and "another head took the store over: another head" in said, said
    assert "this head stopped: another head took the store over" in said, said


def test_agents_follow_the_standby_that_took_over_and_their_work_runs_on(
    postgres: PostgresServer, tmp_path: Path, heads: list[ServerProcess]
) -> None:
    """The recommended setup: both heads on one home (shared storage between machines) and one store; each
    agent is given both heads' URLs."""
    url = postgres.new_database(f"agents_{uuid.uuid4().hex[:12]}")
    home, lease = tmp_path / "home", ["--node-lease", "10s"]
    first = ServerProcess(home=home, gpus="none", db_url=url, extra_args=lease).start()
    heads.append(first)
    standby = ServerProcess(home=home, gpus="none", db_url=url, extra_args=[*lease, "--standby"])
    heads.append(standby)
    standby.launch()
    _wait_for_log(standby, "standby: waits to take over the store")
    both = f"{first.url},{standby.url}"
    agent = AgentProcess(
        first, "agent-0", tmp_path / "agents" / "agent-0", join_token(first), extra_args=["--server", both]
    ).start()
    try:
        Pool(first, [agent]).wait_for_nodes(["agent-0"])
        job = first.submit({"commands": ["sleep 6; echo done"], "resources": {"gpu": 1}})
        first.wait_for(job["id"], states=("running",))
        first.kill9()
        standby.wait_healthy(timeout=30)
        ended = standby.wait_for(job["id"], timeout=60)
        assert (ended["state"], ended["attempts"]) == ("succeeded", 1), (ended, agent.log())
        assert f"event=agent_joined node=agent-0 server={standby.url}" in agent.log(), agent.log()
        again = standby.submit({"commands": ["echo after"], "resources": {"gpu": 1}})
        assert standby.wait_for(again["id"])["state"] == "succeeded"
    finally:
        agent.stop()


def test_a_lock_connection_the_server_kept_after_a_network_cut_is_ended_and_the_lock_taken_again(
    postgres: PostgresServer,
) -> None:
    """After a network cut the head gave its lock's connection up, but PostgreSQL kept it (by default for
    about 2 hours) with the lock: the head took itself for fenced by another and exited, and no other head
    could take over. Now the head ends its own leftover connection and holds the lock again."""
    url = postgres.new_database(f"leftover_{uuid.uuid4().hex[:12]}")
    head = HeadLock(url, "gpupool head pid 1 on a")
    head.acquire()
    leftover = head._conn
    head._conn = None  # given up here (its socket silent), still open on the server
    assert head.check() == "retaken"
    with pytest.raises(psycopg.OperationalError):
        leftover.execute("SELECT 1")  # ended by the server, at the head's word
    other = HeadLock(url, "gpupool head pid 2 on b")
    with pytest.raises(HeadLockHeld, match=r"gpupool head pid 1 on a from 127\.0\.0\.1"):
        other.acquire()  # a head that is not its holder's own process never ends the holder's connection
    settings = head._conn.execute("SHOW tcp_keepalives_idle").fetchone()
    assert settings == ("5",)  # the server finds a dead peer in seconds, not hours
    head.release()
    other.acquire()
    other.release()
