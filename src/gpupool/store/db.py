"""Engines and sessions: SQLite (WAL) by default, PostgreSQL through its URL; schema via Alembic."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.orm import Session, sessionmaker

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# The newest migration (migrations/versions/). A store already there opens without loading Alembic (about
# 0.15 s of a start's imports); tests/integration/test_store.py fails until this follows a new one.
HEAD_REVISION = "0022"
log = logging.getLogger("gpupool.store")


class StoreError(RuntimeError):
    """The state store cannot be opened or migrated; the message says which URL and why."""


def normalise_url(url: str) -> str:
    """Accept a bare file path for SQLite and the plain `postgresql://` scheme (driven by psycopg 3); any
    other kind of database is refused (StoreError, with the two that work)."""
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith(("sqlite://", "sqlite+pysqlite://", "postgresql+psycopg://")):
        return url
    scheme = url.split("://", 1)[0]
    raise StoreError(
        f"{scheme}://... is not a store gpupool can use (SQLite or PostgreSQL only); give --db (or "
        "$GPUPOOL_DB) sqlite:///PATH, a file path, or postgresql://USER@HOST/DB"
    )


def make_engine(url: str, *, reader: bool = False) -> Engine:
    """An engine; for SQLite, `reader` engines begin deferred transactions that never take the write lock
    (in WAL mode readers and the one writer do not block each other)."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        path = url.split("sqlite:///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=20, max_overflow=20
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin_deferred if reader else _sqlite_begin_immediate)
        return engine
    return create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Autocommit at the driver level; transactions are begun explicitly (see _sqlite_begin_immediate).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # WAL + synchronous=NORMAL survives process crashes (kill -9) without an fsync per commit.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _sqlite_begin_deferred(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN")


def _sqlite_begin_immediate(conn: Any) -> None:
    # Take the write lock at BEGIN so two writers queue on busy_timeout instead of failing on upgrade.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


_migrate_lock = threading.Lock()
MIGRATION_LOCK = 0x67707570  # PostgreSQL advisory lock key of a store's migrations ("gpup")


def _revision(engine: Engine) -> str | None:
    """The store's migration as Alembic records it (its one-row version table), None for an empty store;
    several rows (branches, which gpupool's migrations never make) read as their sorted list."""
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        rows = sorted(row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version")))
    return ",".join(rows) if rows else None


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest migration (idempotent), logging one line when it changed (Alembic's
    own line per migration is at DEBUG under the server's logging: a first start ran fifteen of them)."""
    where = engine.url.render_as_string(hide_password=True)
    with _migrate_lock:
        try:
            before = _revision(engine)
        except Exception as exc:  # the driver's error says why (auth, unreachable, no such database)
            raise StoreError(f"cannot open the store at {where}: {driver_error_line(exc)}") from exc
        if before == HEAD_REVISION:
            return
        if before is not None and before not in known_revisions():
            raise StoreError(
                f"cannot migrate the store at {where}: it was written by a newer gpupool (its schema is at "
                f"migration {before}; this gpupool knows up to {HEAD_REVISION}); run that newer gpupool, or "
                "give --db another store; nothing was changed"
            )
        try:
            from alembic import command

            with _upgrading(engine):
                command.upgrade(alembic_config(engine), "head")
            after = _revision(engine)
        except Exception as exc:  # the driver's error says why (auth, unreachable, locked)
            raise StoreError(f"cannot migrate the store at {where}: {driver_error_line(exc)}") from exc
    if after != before:
        log.info("event=store_migrated from=%s to=%s url=%s", before or "empty", after, engine.url)


def known_revisions() -> set[str]:
    """The migrations this gpupool carries (migrations/versions/NNNN_*.py)."""
    return {path.name[:4] for path in (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")}


@contextmanager
def _upgrading(engine: Engine) -> Iterator[None]:
    """Hold PostgreSQL's advisory lock while migrating: heads that start together on one store take turns
    (the second found an empty store too, and died on CREATE TABLE alembic_version with the raw SQL).
    SQLite's BEGIN IMMEDIATE serialises writers already."""
    if engine.dialect.name != "postgresql":
        yield
        return
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
            conn.commit()


def is_disk_full(exc: BaseException) -> bool:
    """Whether a driver error says the store's disk is full (SQLite's SQLITE_FULL, PostgreSQL's
    disk_full, 53100): the store is reachable but cannot write, and no reconnect mends that."""
    orig = getattr(exc, "orig", None) or exc
    if getattr(orig, "sqlstate", None) == "53100" or getattr(orig, "pgcode", None) == "53100":
        return True
    text_ = str(orig).lower()
    return "database or disk is full" in text_ or "no space left on device" in text_


def driver_error_line(exc: BaseException) -> str:
    """A driver error's own first line: SQLAlchemy appends the SQL and a link to its docs."""
    text_ = str(getattr(exc, "orig", None) or exc).strip()
    return text_.splitlines()[0] if text_ else type(exc).__name__


class Store:
    """The engine plus a session factory; one per process."""

    def __init__(self, url: str, *, run_migrations: bool = True) -> None:
        self.url = normalise_url(url)
        self.engine = make_engine(self.url)
        if run_migrations:
            migrate(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.reader = make_engine(self.url, reader=True) if self.is_sqlite else self.engine
        self._reads = sessionmaker(self.reader, expire_on_commit=False)
        # One writer at a time inside this process: SQLite admits one anyway, and waiting here is fair
        # (first come, first served) where SQLite's busy handler sleeps and retries in no order.
        self._write_lock: threading.RLock | None = threading.RLock() if self.is_sqlite else None

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A write transaction: committed when the block ends, rolled back if it raises."""
        if self._write_lock is None:
            with self._sessions() as session, session.begin():
                yield session
            return
        with self._write_lock, self._sessions() as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only transaction (a consistent snapshot) that never waits for writers."""
        with self._reads() as session:
            yield session

    def close(self) -> None:
        self.engine.dispose()
        if self.reader is not self.engine:
            self.reader.dispose()
