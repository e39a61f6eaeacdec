"""The store on real SQLite and real PostgreSQL: the same code through the URL."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.orm.exc import StaleDataError

from gpupool.backends.agent import AgentBackend
from gpupool.control import (
    accounting,
    changes,
    queues,
    secrets,
    service_replicas,
    submission,
    tokens,
    workloads,
)
from gpupool.control.errors import Conflict, Invalid
from gpupool.control.lifecycle import transition
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.control.secret_keys import SecretKeys
from gpupool.spec import parse_queue_spec, parse_workload_spec
from gpupool.store.db import HEAD_REVISION, Store
from gpupool.store.models import Attempt, Event, Gpu, Node, Secret, Workload
from gpupool.timeutil import as_utc
from tests.support.postgres import PostgresServer, database_url
from tests.support.server import ServerProcess
from tests.support.store import run_attempt


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = Store(database_url(request, tmp_path))
    queues.ensure_default_queue(s)
    try:
        yield s
    finally:
        s.close()


def test_migrations_create_every_table_and_are_idempotent(store: Store) -> None:
    again = Store(store.url)  # a second start migrates nothing and breaks nothing
    tables = set(inspect(again.engine).get_table_names())
    assert {
        "nodes",
        "gpus",
        "queues",
        "workloads",
        "attempts",
        "events",
        "api_tokens",
        "foreign_jobs",
        "join_tokens",
        "bench_results",
        "retired_usage",
        "head_state",
        "secrets",
        "alembic_version",
    } <= tables
    with again.engine.connect() as conn:
        assert conn.execute(text("select version_num from alembic_version")).scalar() == "0022"
    again.close()


def test_the_head_revision_is_the_newest_migration(tmp_path: Path) -> None:
    """A store at HEAD_REVISION opens without Alembic: a new migration must move it, or it would never run."""
    from alembic.script import ScriptDirectory

    from gpupool.store.db import HEAD_REVISION, MIGRATIONS_DIR, alembic_config

    config = alembic_config(Store(f"sqlite:///{tmp_path / 'g.db'}", run_migrations=False).engine)
    assert config.get_main_option("script_location") == str(MIGRATIONS_DIR)
    assert ScriptDirectory.from_config(config).get_heads() == [HEAD_REVISION]


def test_a_store_at_the_newest_migration_opens_without_alembic(tmp_path: Path) -> None:
    """The second start of a head skips Alembic's imports (about 0.15 s); the first still migrates."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'g.db'}"
    probe = (
        "import sys; from gpupool.store.db import Store; s = Store(sys.argv[1]); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic')[:1]); s.close()"
    )
    first = subprocess.run([sys.executable, "-c", probe, url], capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", probe, url], capture_output=True, text=True, check=True)
    assert first.stdout.strip() == "['alembic']"
    assert second.stdout.strip() == "[]"


def test_a_store_from_a_newer_gpupool_is_refused_by_name(tmp_path: Path) -> None:
    """A store a newer gpupool migrated past what this one knows: a clear error, the store unchanged."""
    from gpupool.store.db import StoreError

    path = tmp_path / "newer.db"
    Store(f"sqlite:///{path}").close()
    with Store(f"sqlite:///{path}", run_migrations=False).engine.begin() as conn:
        conn.execute(text("update alembic_version set version_num = '9999'"))
    with pytest.raises(StoreError, match=r"cannot migrate the store at .*newer\.db.*9999"):
        Store(f"sqlite:///{path}")
    with Store(f"sqlite:///{path}", run_migrations=False).engine.connect() as conn:
        assert conn.execute(text("select version_num from alembic_version")).scalar() == "9999"


def test_a_store_from_a_newer_gpupool_says_which_and_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    Store(f"sqlite:///{path}").close()
    with Store(f"sqlite:///{path}", run_migrations=False).engine.begin() as conn:
        conn.execute(text("update alembic_version set version_num = '0099'"))
    from gpupool.store.db import StoreError

    with pytest.raises(StoreError) as raised:
        Store(f"sqlite:///{path}")
    assert str(raised.value) == (
        f"cannot migrate the store at sqlite:///{path}: it was written by a newer gpupool (its schema is at "
        f"migration 0099; this gpupool knows up to {HEAD_REVISION}); run that newer gpupool, or give --db "
        "another store; nothing was changed"
    )


def test_heads_that_start_together_on_an_empty_postgresql_store_both_open_it(
    postgres: PostgresServer,
) -> None:
    """The second of two heads migrating one empty store at once died on CREATE TABLE alembic_version (a
    unique violation, printed as raw SQL): they take turns now."""
    url = postgres.new_database(f"together_{uuid.uuid4().hex[:12]}")
    opening = "from gpupool.store.db import Store; Store(__import__('sys').argv[1]).close()"
    heads = [
        subprocess.Popen([sys.executable, "-c", opening, url], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for head in heads:
        _, err = head.communicate(timeout=120)
        assert head.returncode == 0, err
    with Store(url, run_migrations=False).engine.connect() as conn:
        assert conn.execute(text("select version_num from alembic_version")).scalar() == HEAD_REVISION


def test_the_migrations_give_every_column_the_models_declare(store: Store) -> None:
    """A column added to a model without a migration would fail only on a store created before it."""
    from gpupool.store.models import Base

    inspector = inspect(store.engine)
    for table in Base.metadata.sorted_tables:
        migrated = {c["name"] for c in inspector.get_columns(table.name)}
        assert {c.name for c in table.columns} <= migrated, table.name


def _store_at(path: Path, revision: str) -> Store:
    """A SQLite store migrated up to `revision` only, with the default queue."""
    from alembic import command

    from gpupool.store.db import alembic_config

    old = Store(f"sqlite:///{path}", run_migrations=False)
    command.upgrade(alembic_config(old.engine), revision)
    with old.engine.begin() as conn:
        conn.execute(text("insert into queues (name, priority, spec, created_at, updated_at) "
                          "values ('default', 0, '{}', '2026-01-01', '2026-01-01')"))  # fmt: skip
    return old


def test_a_store_at_an_older_migration_is_upgraded_in_place(tmp_path: Path) -> None:
    _store_at(tmp_path / "old.db", "0001").close()
    upgraded = Store(f"sqlite:///{tmp_path / 'old.db'}")
    created = submission.submit(upgraded, parse_workload_spec({"commands": ["true"]}))
    assert workloads.get_workload(upgraded, created["id"])["state"] == "pending"
    upgraded.close()


def _upgraded_with_an_attempt(tmp_path: Path, revision: str) -> Store:
    """A store at `revision` with workload 7 (queue nlp) and its one finished attempt, opened (upgraded)."""
    old = _store_at(tmp_path / "old.db", revision)
    workload = (
        "insert into workloads (id, name, kind, queue, user, priority, preemptible, gpus, nodes, spec, "
        "state, reason, cancel_requested, restarts, created_at, updated_at, version) values (7, 'train', "
        "'job', 'nlp', 'admin', 50, 1, '1', 1, '{}', 'succeeded', '', 0, 0, '2026-12-01', '2026-12-01', 1)"
    )
    attempt = (
        "insert into attempts (workload_id, number, state, node_name, gpu_indices, gpu_fraction, cpus, "
        "memory_bytes, run_dir, log_path, reason, stop_reason, started_at) values (7, 0, 'succeeded', 'a', "
        "'[0]', 1.0, 0, 0, '', '', '', '', '2026-12-01')"
    )
    with old.engine.begin() as conn:
        conn.execute(text(workload))
        conn.execute(text(attempt))
    old.close()
    return Store(f"sqlite:///{tmp_path / 'old.db'}")


def test_attempts_from_before_work_could_move_keep_their_workloads_queue(tmp_path: Path) -> None:
    """Migration 0018 records the queue each attempt ran in: for attempts from before it, their
    workload's (work never moved until then), so `usage --by queue` reads as it did."""
    upgraded = _upgraded_with_an_attempt(tmp_path, "0017")
    assert workloads.get_workload(upgraded, 7)["attempt_list"][0]["queue"] == "nlp"
    upgraded.close()


def test_a_migration_that_rebuilds_workloads_keeps_the_rows_that_refer_to_them(tmp_path: Path) -> None:
    """SQLite adds a column to `workloads` by copying the table and dropping the old one: with foreign keys
    on, that drop deleted every attempt (the GPU-hours of `usage`) through ON DELETE CASCADE (0012 and 0020
    rebuild it)."""
    upgraded = _upgraded_with_an_attempt(tmp_path, "0011")
    shown = workloads.get_workload(upgraded, 7)
    assert [(a["state"], a["queue"]) for a in shown["attempt_list"]] == [("succeeded", "nlp")], shown
    with upgraded.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1, "on again once migrated"
    upgraded.close()


def test_a_first_start_says_its_migrations_in_one_line_not_one_per_migration(tmp_path: Path) -> None:
    """Alembic's line per migration (fifteen at a first start) buried the admin token a person must copy;
    the server says the migration in one line, and nothing at a start with nothing to migrate."""
    server = ServerProcess(home=tmp_path / "home").start()
    try:
        first = server.log()
    finally:
        server.stop()
    assert "Running upgrade" not in first and "admin token (shown once" in first, first
    assert first.count("event=store_migrated from=empty to=") == 1, first
    server.start()
    try:
        again = server.log()[len(first) :]
    finally:
        server.stop()
    assert "store_migrated" not in again and "Running upgrade" not in again, again


def test_a_service_stored_before_replicas_is_upgraded_to_replica_0_of_itself(tmp_path: Path) -> None:
    old = _store_at(tmp_path / "old.db", "0009")
    with old.engine.begin() as conn:
        for name, kind in (("web", "service"), ("train", "job")):
            conn.execute(
                text(
                    "insert into workloads (name, kind, queue, user, priority, preemptible, gpus, nodes, "
                    "spec, state, reason, reason_code, cancel_requested, restarts, created_at, updated_at, "
                    "version) values (:name, :kind, 'default', 'admin', 50, 1, '1', 1, :spec, 'pending', "
                    "'', '', 0, 0, '2026-01-01', '2026-01-01', 1)"
                ),
                {"name": name, "kind": kind, "spec": f'{{"kind": "{kind}", "commands": ["true"]}}'},
            )
    old.close()
    upgraded = Store(f"sqlite:///{tmp_path / 'old.db'}")
    web, train = (w for w in workloads.list_workloads(upgraded) if w["name"] in ("web", "train"))
    assert (web["service_id"], web["replica"]) == (web["id"], 0)
    assert (train["service_id"], train["replica"]) == (None, 0)
    # the old service gains a replica as a new one would
    scaled = service_replicas.scale(upgraded, web["id"], 2)
    assert [(r["replica"], r["state"]) for r in scaled["replica_list"]] == [(0, "pending"), (1, "pending")]
    upgraded.close()


def test_scaling_keeps_replica_0_removes_waiting_replicas_first_and_counts_stopping_ones_as_gone(
    store: Store,
) -> None:
    spec = parse_workload_spec({"kind": "service", "name": "web", "commands": ["serve"], "replicas": 3})
    ids = submission.submit(store, spec)["replica_ids"]
    with store.session() as s:
        for workload_id in ids:
            assert transition(s, s.get(Workload, workload_id), "running", "started").accepted

    down = service_replicas.scale(store, ids[2], 1)  # any replica's id names the service
    assert down["id"] == ids[0] and down["replicas"] == 1 and down["spec"]["replicas"] == 1
    with store.read() as s:  # running ones stop through the control loop: asked to, not yet stopped
        assert [s.get(Workload, i).cancel_requested for i in ids] == [False, True, True]

    # back up while 1 and 2 still stop: they count as gone, and their numbers are not given out again
    up = service_replicas.scale(store, ids[0], 2)
    assert up["replicas"] == 2
    new = next(r for r in up["replica_list"] if r["id"] not in ids)
    assert (new["replica"], new["state"]) == (3, "pending")
    events = workloads.get_workload(store, new["id"])["events"]
    assert [e["reason"] for e in events] == ["scaled to 2 replicas by admin: replica 3"]

    # down again: the waiting replica goes, at once, before a running one; replica 0 is never removed
    after = service_replicas.scale(store, ids[0], 1)
    states = {r["id"]: r["state"] for r in after["replica_list"]}
    assert states[new["id"]] == "cancelled" and states[ids[0]] == "running"
    assert changes.cancel(store, ids[1])["cancelled_replicas"] == [ids[0], ids[1], ids[2]]


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    s = Store(f"sqlite:///{tmp_path / 'wal.db'}")
    with s.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    s.close()


def test_submitted_workload_is_durable_with_its_spec_and_an_event(store: Store) -> None:
    spec = parse_workload_spec(
        {"name": "train", "resources": {"gpu": "H100:8"}, "commands": ["python t.py"], "max_duration": "12h"}
    )
    created = submission.submit(store, spec)
    reopened = Store(store.url)
    got = workloads.get_workload(reopened, created["id"])
    assert got["state"] == "pending" and got["gpus"] == "H100:8"
    assert parse_workload_spec(got["spec"]) == spec
    assert [e["to"] for e in got["events"]] == ["pending"]
    reopened.close()


def test_what_a_submit_writes_once_it_has_the_id_is_durable_on_both_databases(store: Store) -> None:
    """The name given from the id, a hold's reason, an array's tasks and their first events: written by
    statements of their own after the workload's insert, in the same transaction."""
    job = parse_workload_spec({"commands": ["true"], "resources": {"gpu": 1}})
    held = submission.submit(store, job, held=True)
    sweep = parse_workload_spec({"name": "sweep", "array": "3-4", "commands": ["true"]})
    array = submission.submit(store, sweep)
    reopened = Store(store.url)
    try:
        got = workloads.get_workload(reopened, held["id"])
        assert (got["name"], got["held"], got["reason_code"]) == (f"job-{held['id']}", True, "held")
        assert got["reason"] == f"held at submit; `gpupool release {held['id']}` lets it start"
        assert [(e["to"], e["reason"]) for e in got["events"]] == [("pending", "submitted")]
        first, second = (workloads.get_workload(reopened, wid) for wid in array["array_ids"])
        assert (first["array_id"], first["array_index"], second["array_index"]) == (array["id"], 3, 4)
        said = [e["reason"] for w in (first, second) for e in w["events"]]
        assert said == [f"submitted: task {i} of array {array['id']}" for i in (3, 4)]
    finally:
        reopened.close()


def test_submit_to_a_missing_queue_is_refused_and_stores_nothing(store: Store) -> None:
    with pytest.raises(Invalid) as err:
        submission.submit(store, parse_workload_spec({"queue": "ghost", "commands": ["true"]}))
    assert err.value.field == "queue" and "gpupool queue create ghost" in err.value.message
    assert workloads.list_workloads(store, include_finished=True) == []


def test_transitions_follow_the_lifecycle_rules_and_are_audited(store: Store) -> None:
    created = submission.submit(store, parse_workload_spec({"commands": ["true"]}))
    with store.session() as s:
        w = s.get(Workload, created["id"])
        assert w is not None
        assert transition(s, w, "running", "started").accepted
        assert transition(s, w, "succeeded", "exit code 0").accepted
        refused = transition(s, w, "running", "again")
        assert not refused.accepted and "already succeeded" in refused.reason
    with store.session() as s:
        events = s.scalars(
            select(Event).where(Event.object_id == str(created["id"])).order_by(Event.id)
        ).all()
        assert [(e.from_state, e.to_state) for e in events] == [
            ("", "pending"),
            ("pending", "running"),
            ("running", "succeeded"),
        ]


def test_concurrent_writers_never_overwrite_each_other(store: Store) -> None:
    created = submission.submit(store, parse_workload_spec({"commands": ["true"]}))
    with store.session() as s:  # writer A reads the row ...
        stale = s.get(Workload, created["id"])
        assert stale is not None
    with store.session() as s:  # ... writer B changes it in between ...
        fresh = s.get(Workload, created["id"])
        assert fresh is not None
        fresh.reason = "the loop moved first"
    with pytest.raises(StaleDataError), store.session() as s:  # ... and A's write is refused, not lost
        stale = s.merge(stale, load=False)
        stale.cancel_requested = True
    assert workloads.get_workload(store, created["id"])["reason"] == "the loop moved first"


def test_cancel_of_pending_is_final_and_twice_is_a_conflict(store: Store) -> None:
    created = submission.submit(store, parse_workload_spec({"commands": ["true"]}))
    assert changes.cancel(store, created["id"])["state"] == "cancelled"
    with pytest.raises(Conflict):
        changes.cancel(store, created["id"])


def test_queue_crud_round_trips(store: Store) -> None:
    queues.create_queue(store, parse_queue_spec({"name": "nlp", "resources": {"gpu": {"quota": 8}}}))
    with pytest.raises(Conflict):
        queues.create_queue(store, parse_queue_spec({"name": "nlp"}))
    updated = queues.update_queue(store, "nlp", lambda cur: parse_queue_spec({**cur, "priority": 10}))
    assert updated["priority"] == 10 and updated["resources"]["gpu"]["quota"] == 8
    assert [q["name"] for q in queues.list_queues(store)] == ["default", "nlp"]
    queues.create_queue(store, parse_queue_spec({"name": "cv", "parent": "nlp"}))
    pending = submission.submit(store, parse_workload_spec({"queue": "cv", "commands": ["true"]}))
    with pytest.raises(Conflict, match="queue 'nlp' is the parent of cv"):
        queues.delete_queue(store, "nlp")
    with pytest.raises(Conflict, match="queue 'cv' still has 1 pending workload"):
        queues.delete_queue(store, "cv")
    with pytest.raises(Conflict, match="the 'default' queue cannot be deleted"):
        queues.delete_queue(store, "default")
    changes.cancel(store, pending["id"])
    assert queues.delete_queue(store, "cv")["name"] == "cv"
    assert queues.delete_queue(store, "nlp")["name"] == "nlp"
    assert [q["name"] for q in queues.list_queues(store)] == ["default"]
    assert workloads.get_workload(store, pending["id"])["queue"] == "cv"  # its history keeps the name


def test_tokens_are_hashed_and_the_admin_token_is_made_once(store: Store) -> None:
    token = tokens.ensure_admin_token(store)
    assert token is not None and tokens.ensure_admin_token(store) is None
    assert tokens.caller_of(store, token) == tokens.Caller("admin", "admin", ())
    assert tokens.caller_of(store, token + "x") is None


def test_secrets_are_encrypted_at_the_start_in_place_on_both_databases(store: Store, tmp_path: Path) -> None:
    """The start's pass (control/secrets.encrypt_stored) selects by prefix and writes only unchanged rows,
    keeping when each was set; a second pass writes nothing."""
    keys = SecretKeys(path=tmp_path / "secrets.key", keys=(os.urandom(32),))
    set_at = datetime(2026, 12, 1, tzinfo=UTC)
    with store.session() as s:
        s.add(Secret(owner="alice", name="A_B", value="plain%_text", updated_at=set_at))
    secrets.set_secret(store, keys, "alice", "C", "already")
    assert secrets.encrypt_stored(store, keys) == {"encrypted": 1, "rekeyed": 0, "unreadable": 0}
    assert secrets.encrypt_stored(store, keys)["encrypted"] == 0
    with store.read() as s:
        row = s.scalars(select(Secret).where(Secret.name == "A_B")).one()
        assert keys.is_current(row.value) and as_utc(row.updated_at) == set_at
        assert secrets.resolve(s, keys, "alice", ["A_B", "C"]) == {"A_B": "plain%_text", "C": "already"}


def test_usage_counts_the_attempts_that_overlap_the_window_on_both_databases(store: Store) -> None:
    """The window's bounds are compared in SQL (timezone-aware times on PostgreSQL, UTC text on SQLite):
    attempts that ended before it or started after it count nothing, the rest are cut to it."""
    now = datetime(2026, 12, 3, 12, tzinfo=UTC)
    hour = timedelta(hours=1)
    wid = int(submission.submit(store, parse_workload_spec({"commands": ["train"]}))["id"])
    spans = [(-9, -6), (-5, -3), (-2, None), (-30, -29)]  # hours from now; None: still running
    with store.session() as s:
        for number, (start, end) in enumerate(spans):
            s.add(
                Attempt(
                    workload_id=wid, queue="default",
                    number=number, state="evicted" if end else "running", node_name="n",
                    gpu_indices=[0, 1], started_at=now + start * hour,
                    finished_at=None if end is None else now + end * hour,
                )
            )  # fmt: skip
    report = accounting.usage(store, now - 4 * hour, now - hour, by="outcome", now=now)
    assert report["total"]["attempts"] == 2  # (-5, -3) and (-2, running)
    assert report["total"]["by_outcome"] == {"evicted": pytest.approx(2.0), "running": pytest.approx(2.0)}


def test_the_server_runs_jobs_on_postgresql(postgres: PostgresServer, tmp_path: Path) -> None:
    url = postgres.new_database(f"srv_{uuid.uuid4().hex[:12]}")
    server = ServerProcess(home=tmp_path / "home", db_url=url).start()
    try:
        created = server.submit({"commands": ["echo on postgres"], "resources": {"gpu": 1}})
        assert server.wait_for(created["id"])["state"] == "succeeded"
        gate = tmp_path / "gate"  # not "sleep 2": a loaded machine could end it before it is seen running
        running = server.submit({"commands": [f"while [ ! -e {gate} ]; do sleep 0.1; done"]})
        server.wait_for(running["id"], states=("running",))
        deadline = time.time() + 30  # and started: its attempt is recorded before its process exists
        while server.workload(running["id"])["attempt_list"][0]["pid"] is None:
            assert time.time() < deadline, "the job never got a pid"
            time.sleep(0.1)
        server.kill9()
        server.start()
        gate.touch()
        done = server.wait_for(running["id"])
        assert done["state"] == "succeeded" and done["attempts"] == 1, done
    finally:
        server.stop()


def test_a_store_out_of_reach_is_a_503_that_names_it_and_the_server_recovers(tmp_path: Path) -> None:
    """PostgreSQL stopped under a running head: the API answers 503 naming the store (it was a bare 500,
    "Internal Server Error"), /readyz says not ready while /healthz still answers, and once PostgreSQL is
    back everything works again with nothing lost."""
    base = Path(tempfile.mkdtemp(prefix="gpupool-pg-"))  # the postgres user must reach it: not tmp_path
    pg = PostgresServer(base)
    pg.start()
    try:
        url = pg.new_database("outage")
        server = ServerProcess(home=tmp_path / "home", db_url=url).start()
        try:
            created = server.submit({"commands": ["true"]})
            assert server.wait_for(created["id"])["state"] == "succeeded"
            pg.stop()
            with server.http() as client:
                answer = client.get("/api/v1/workloads")
                assert answer.status_code == 503 and answer.headers["Retry-After"] == "5", answer.text
                message = answer.json()["error"]["message"]
                store = f"postgresql+psycopg://gpupool@127.0.0.1:{pg.port}/outage"
                assert message.startswith(f"the server cannot reach its store ({store}: "), message
                assert client.get("/readyz").status_code == 503
                assert client.get("/healthz").status_code == 200
            said = server.cli("ps")
            assert said.returncode == 1 and "cannot reach its store" in said.stderr, said.stderr
            pg.resume()
            with server.http() as client:
                _readyz_until(client, 200, 10, "the server never reached its store again")  # was 30 s
            again = server.submit({"commands": ["true"]})
            assert server.wait_for(again["id"])["state"] == "succeeded"
            assert server.workload(created["id"])["state"] == "succeeded"
            # the restart cut the head lock's connection: no other head took it, so this head did again
            assert "event=head_lock_retaken" in server.log(), server.log()
        finally:
            server.stop()
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_the_next_pass_sees_a_new_queue_and_time_limit_on_both_databases(
    store: Store, tmp_path: Path
) -> None:
    """The control loop keeps each workload's scheduler view from pass to pass; `gpupool update` may change
    its queue and time limit (read from the spec's JSON in SQL), which the next pass must see."""
    queues.create_queue(store, parse_queue_spec({"name": "nlp"}))
    spec = parse_workload_spec({"commands": ["x"], "max_duration": "1h"})
    waiting, running = (int(submission.submit(store, spec)["id"]) for _ in range(2))
    now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    run_attempt(store, running, "a", [0], now)
    reconciler = Reconciler(
        store, AgentBackend(lease=10.0), None, ControlSettings(home=tmp_path, node_name="h")
    )

    def views() -> dict[int, tuple[str, float | None]]:
        with store.read() as s:
            snapshot = reconciler._snapshot(s, now.timestamp())
        return {w.id: (w.queue, w.max_duration) for w in (*snapshot.pending, *snapshot.running)}

    assert views() == {waiting: ("default", 3600.0), running: ("default", 3600.0)}
    changes.update(store, waiting, queue="nlp", limit=changes.TimeLimit(7200.0))
    changes.update(store, running, limit=changes.TimeLimit(None))
    assert views() == {waiting: ("nlp", 7200.0), running: ("default", None)}  # the same reconciler


def test_a_checkpoint_dir_that_running_work_already_uses_is_warned_of_at_submit(store: Store) -> None:
    """Two runs of one spec wrote and resumed from one checkpoint and overwrote each other's, with no word;
    read from the spec's JSON in SQL, on both databases."""

    def submit(workdir: str, checkpoint: str = "ckpt/run") -> dict[str, object]:
        spec = parse_workload_spec({"commands": ["x"], "workdir": workdir, "checkpoint": {"dir": checkpoint}})
        return submission.submit(store, spec)

    first = submit("/work/a")
    assert first["warnings"] == []
    second = submit("/work/a")
    assert second["warnings"] == [
        f"checkpoint.dir: /work/a/ckpt/run is also the checkpoint of workload {first['id']}, pending or "
        f"running: both would write and resume from it; give this one its own, or `gpupool cancel "
        f"{second['id']}`"
    ]
    assert submit("/work/b")["warnings"] == []  # the same relative dir under another workdir
    with store.session() as s:
        for wid in (first["id"], second["id"]):
            workload = s.get(Workload, wid)
            assert workload is not None
            transition(s, workload, "cancelled", "done with it")
    assert submit("/work/a")["warnings"] == []  # ended work's checkpoint is there to resume from


def test_asking_for_a_gpu_model_no_node_has_is_warned_of_at_submit(store: Store) -> None:
    """A known model the pool lacks (an A100 on an H100 pool) waited `no-matching-gpu` with no word at
    submit, where a node name that never joined already got one."""
    spec = parse_workload_spec({"commands": ["x"], "resources": {"gpu": "A100:1"}})
    first = submission.submit(store, spec)
    assert first["warnings"] == [
        "resources.gpu: no node of this pool has A100 GPUs (models here: none); it waits pending until such "
        f"a node joins: ask for another model, or `gpupool cancel {first['id']}`"
    ]
    with store.session() as s:
        node = Node(name="n1", state="ready", labels={})
        node.gpus.append(Gpu(index=0, model="A100", uuid="GPU-0", memory_bytes=80 * 2**30))
        s.add(node)
    assert (
        submission.submit(
            store, parse_workload_spec({"commands": ["x"], "resources": {"gpu": "A100-80GB:1"}})
        )["warnings"]
        == []
    )
    assert (
        "models here: A100"
        in submission.submit(store, parse_workload_spec({"commands": ["x"], "resources": {"gpu": "H100:1"}}))[
            "warnings"
        ][0]
    )


def test_work_no_node_of_the_pool_can_hold_is_warned_of_at_submit(store: Store) -> None:
    """9 GPUs on 8-GPU nodes, a GPU memory no GPU has, more CPUs or memory than a node has: accepted (larger
    nodes may join) but said at once, as a model the pool lacks is; it waited `too-large` with no word."""

    def warned(resources: dict[str, object], nodes: int = 1) -> list[str]:
        spec = parse_workload_spec({"commands": ["x"], "resources": resources, "nodes": nodes})
        return list(submission.submit(store, spec)["warnings"])

    assert warned({"gpu": 9}) == []  # no node yet (agents not joined): nothing to judge by
    with store.session() as s:
        for name in ("n1", "n2"):
            node = Node(name=name, state="ready", labels={}, cpus=32.0, memory_bytes=256 * 2**30)
            for i in range(8):
                node.gpus.append(Gpu(index=i, model="H100", uuid=f"GPU-{name}-{i}", memory_bytes=80 * 2**30))
            s.add(node)
    (nine,) = warned({"gpu": 9})
    assert nine.startswith("resources.gpu: no node has 9 GPUs (the most on one: 8); it waits pending "
                           "(too-large) until larger nodes join: ask for fewer per node"), nine  # fmt: skip
    (three,) = warned({"gpu": "H100:8"}, nodes=3)
    assert three.startswith(
        "nodes: 3 nodes with 8 H100 GPUs each are asked for, and this pool has 2 such nodes; it waits "
        "pending (too-large) until more join: ask for fewer nodes"
    ), three
    (wide,) = warned({"gpu": 9}, nodes=2)
    assert wide.startswith("resources.gpu: no node has 9 GPUs (the most on one: 8)"), wide
    (memory,) = warned({"gpu": "100GB:1"})
    assert memory.startswith("resources.gpu: no GPU of this pool matches 100GB:1"), memory
    (cpus,) = warned({"gpu": 1, "cpu": 64})
    assert cpus.startswith("resources.cpu: no node has 64 CPUs (the most on one: 32)"), cpus
    (ram,) = warned({"gpu": 0, "memory": "1TB"})
    assert ram.startswith("resources.memory: no node has "), ram
    for fits in ({"gpu": 8}, {"gpu": "80GB:2"}, {"gpu": 0.5, "cpu": 32}):
        assert warned(fits) == [], fits
    assert warned({"gpu": 8}, nodes=2) == []


def test_a_full_disk_under_the_store_is_said_as_such_and_the_server_goes_on_once_there_is_room(
    tmp_path: Path,
) -> None:
    """SQLite's disk full: a submit is refused with a 503 that says the disk is full and what to do (it said
    the store could not be reached and would reconnect by itself), /readyz says not ready (it said ready
    while nothing could be written), and once there is room again everything works with nothing lost."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], capture_output=True
    ).returncode:
        pytest.skip("this machine does not let the test mount a small tmpfs")
    try:
        server = ServerProcess(home=disk / "home").start()
        try:
            created = server.submit({"commands": ["true"]})
            assert server.wait_for(created["id"])["state"] == "succeeded"
            filler = disk / "filler"
            subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # to ENOSPC
            with server.http() as client:
                answer = client.post("/api/v1/workloads", json={"commands": ["true"]})
                assert answer.status_code == 503, answer.text
                message = answer.json()["error"]["message"]
                assert answer.json()["error"]["code"] == "store_full", message
                assert "its disk is full" in message and "free space on that disk" in message, message
                # the loop writes at least every 10 s (record_alive)
                said = _readyz_until(client, 503, 60, "/readyz never said the server cannot work")["error"][
                    "message"
                ]
                assert said.startswith("the control loop's passes fail"), said
                filler.unlink()
                _readyz_until(client, 200, 60, "/readyz never said ready again")
            again = server.submit({"commands": ["true"]})
            assert server.wait_for(again["id"])["state"] == "succeeded"
            assert server.workload(created["id"])["state"] == "succeeded"
        finally:
            server.stop()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _readyz_until(client: httpx.Client, status: int, seconds: float, never: str) -> dict[str, Any]:
    """/readyz's answer once it has `status` (a bound of `seconds`, not a timing assertion)."""
    deadline = time.time() + seconds
    while True:
        answer = client.get("/readyz")
        if answer.status_code == status:
            return dict(answer.json())
        assert time.time() < deadline, never
        time.sleep(0.2)
