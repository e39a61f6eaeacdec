"""One active head a store: the head lock, taken before the store is opened and held for the head's life.

Two heads acting on one store each schedule, start, settle and evict the same work: a job ran six times
at once and ended failed while its processes ran on (measured 2026-12-07, docs/operations.md#several-heads).
So a head acts only while it holds this lock; a second head is refused, or with `--standby` waits for it.

- PostgreSQL: a session-level advisory lock on a connection of its own (not the pool's). The server drops
  it when that connection ends: the head's process killed (kill -9 included), or its machine or network
  gone, found by TCP keepalives within about 15 s. The connection's application_name names the holder.
- SQLite: an flock on a file beside the database (`gpupool.db.head`), which the kernel drops when the
  process ends; the file names the holder.

An advisory lock can also be lost while the head lives (PostgreSQL restarted, the connection cut):
`check` then takes it again, or says another head has it, in which case this head must stop acting.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from sqlalchemy.engine import make_url

from gpupool.store.db import StoreError, driver_error_line, normalise_url

log = logging.getLogger(__name__)

HEAD_LOCK = (
    0x67706864  # PostgreSQL advisory lock key of a store's active head ("gphd"), beside MIGRATION_LOCK
)

Standing = Literal["held", "retaken", "taken", "unreachable"]
# The server's side of the lock's connection (settings any user may give a session)
SERVER_KEEPALIVES = " ".join(
    f"-c {name}={value}"
    for name, value in (
        ("tcp_keepalives_idle", 5),
        ("tcp_keepalives_interval", 3),
        ("tcp_keepalives_count", 3),
        ("tcp_user_timeout", 10_000),
    )
)


class HeadLockHeld(StoreError):
    """Another head holds the store's head lock."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


class HeadLock:
    """The store's head lock, for one head: `acquire` once, then `check` now and then while it runs."""

    def __init__(self, url: str, identity: str) -> None:
        self.url = normalise_url(url)
        self.identity = identity  # who holds it, as another head's refusal names it
        self._conn: Any = None  # PostgreSQL: the connection that holds the advisory lock
        # PostgreSQL: the server process of the connection that last held it. After a network cut the server
        # may keep that one, and its lock, long after this head gave it up: found holding, it is ended.
        self._backend_pid: int | None = None
        self._fd: int | None = None  # SQLite: the flocked file
        self.held = False

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    def acquire(self) -> None:
        """Take the lock now, or raise HeadLockHeld naming its holder (StoreError: the store out of reach)."""
        if not self._try():
            raise HeadLockHeld(self.holder())

    def wait(self, said: Callable[[str], None] | None = None, known: str = "", every: float = 1.0) -> None:
        """Take the lock once its holder lets it go; `said(holder)` is called while waiting, each time the
        holder is another than the last said (`known`, at first)."""
        last = known
        while True:
            try:
                if self._try():
                    return
                holder = f"held by {self.holder() or 'another head'}"
            except StoreError as exc:
                holder = f"out of reach ({exc})"
            if holder != last and said is not None:
                said(holder)
            last = holder
            time.sleep(every)

    def check(self) -> Standing:
        """Whether this head still holds the lock: `held`; `retaken` after its connection was lost and no
        other head took it meanwhile; `taken` by another head (this one must stop acting); `unreachable`."""
        if self.is_sqlite:
            return "held"  # an flock is never taken from a living process
        if self._conn is not None:  # None: lost before, the store out of reach since
            try:
                self._conn.execute("SELECT 1")
                return "held"
            except Exception as exc:  # any failure of the connection: it and its lock are gone
                log.warning("event=head_lock_connection_lost error=%r", driver_error_line(exc))
        self._close()
        try:
            return "retaken" if self._try() else "taken"
        except StoreError:
            return "unreachable"

    def holder(self) -> str:
        """Who holds the lock, in words; "" when nobody does."""
        if self.is_sqlite:
            path = self._lock_path()
            try:
                return path.read_text().strip() if path is not None else ""
            except OSError:
                return ""
        conn = self._connect()
        try:
            row = _holding(conn)
        except Exception as exc:  # the connection lost in between (psycopg.Error)
            raise StoreError(f"lost the store while reading its head lock: {driver_error_line(exc)}") from exc
        finally:
            conn.close()
        if row is None:
            return ""
        _, name, client, since = row
        where = f" from {client}" if client else ""
        started = f", connected since {since:%Y-%m-%d %H:%M:%S %Z}".rstrip() if since else ""
        return f"{name or 'a process that is not a gpupool head'}{where}{started}"

    def release(self) -> None:
        self._close()

    def _try(self) -> bool:
        if self.held and self.is_sqlite:
            return True
        if self.is_sqlite:
            return self._try_flock()
        self._close()
        conn = self._connect()
        try:
            got = self._take(conn)
        except Exception as exc:  # the connection lost in between (psycopg.Error)
            conn.close()
            raise StoreError(f"lost the store while taking its head lock: {driver_error_line(exc)}") from exc
        if got:
            self._conn, self.held, self._backend_pid = conn, True, conn.info.backend_pid
        else:
            conn.close()
        return got

    def _take(self, conn: Any) -> bool:
        got = _try_lock(conn)
        held = _holding(conn) if not got else None
        if held is not None and held[0] == self._backend_pid:  # this head's own connection, given up
            conn.execute("SELECT pg_terminate_backend(%s)", (held[0],))
            log.warning("event=head_lock_leftover_ended backend_pid=%d", held[0])
            for _ in range(20):  # it ends at once, but asynchronously
                if got := _try_lock(conn):
                    break
                time.sleep(0.1)
        return got

    def _try_flock(self) -> bool:
        path = self._lock_path()
        if path is None:
            self.held = True  # an in-memory database: no other process can open it
            return True
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open the head lock {path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{self.identity}, since {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n".encode())
        self._fd, self.held = fd, True
        return True

    def _lock_path(self) -> Path | None:
        database = make_url(self.url).database
        if not database or database == ":memory:":
            return None
        return Path(database).with_name(Path(database).name + ".head")

    def _connect(self) -> Any:
        import psycopg

        url = make_url(self.url).set(drivername="postgresql")
        try:
            return psycopg.connect(
                url.render_as_string(hide_password=False),
                autocommit=True,
                connect_timeout=5,
                application_name=self.identity[:63],  # PostgreSQL keeps 63 bytes
                # A dead peer noticed within about 15 s on both ends: here, an idle connection probed after
                # 5 s, 3 probes 3 s apart, and a call unanswered for 10 s given up; on the server (whose
                # defaults keep a connection, and the lock, for about 2 hours after a network cut), the same.
                keepalives=1,
                keepalives_idle=5,
                keepalives_interval=3,
                keepalives_count=3,
                tcp_user_timeout=10_000,
                options=SERVER_KEEPALIVES,
            )
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot reach the store {url.render_as_string(hide_password=True)}: {driver_error_line(exc)}"
            ) from exc

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self._conn.close()
            self._conn = None
        if self._fd is not None:
            os.close(self._fd)  # the flock goes with it
            self._fd = None
        self.held = False


def _try_lock(conn: Any) -> bool:
    return bool(conn.execute("SELECT pg_try_advisory_lock(%s)", (HEAD_LOCK,)).fetchone()[0])


def _holding(conn: Any) -> tuple[int, str, Any, Any] | None:
    """The server process (pid), application_name, client address and start of the connection that holds
    this database's head lock; None when none does."""
    row = conn.execute(
        "SELECT l.pid, a.application_name, a.client_addr, a.backend_start FROM pg_locks l "
        "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.classid = 0 AND l.objid = %s AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        (HEAD_LOCK,),
    ).fetchone()
    return None if row is None else (int(row[0]), row[1], row[2], row[3])
