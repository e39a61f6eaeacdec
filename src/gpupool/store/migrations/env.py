"""Alembic environment: the engine is handed in by gpupool.store.db.migrate (no alembic.ini needed)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from gpupool.store.models import Base

config = context.config
engine = config.attributes.get("engine") or create_engine(config.get_main_option("sqlalchemy.url") or "")

with engine.connect() as connection:
    # SQLite changes a table's columns by copying it to a new table and dropping the old (Alembic's batch
    # mode): with foreign keys on, that drop deleted every row that referenced it (dropping `workloads`
    # emptied `attempts` and `events` through ON DELETE CASCADE). So they are off while migrating, as
    # SQLite's own procedure for such changes says, and checked before the commit (lang_altertable.html).
    driver = connection.connection.driver_connection if connection.dialect.name == "sqlite" else None
    if driver is not None:
        driver.execute("PRAGMA foreign_keys=OFF")  # outside a transaction, or SQLite ignores it
    try:
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
            if driver is not None:
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise RuntimeError(f"the migration broke foreign keys, rolled back: {broken[:5]}")
        connection.commit()
    finally:
        if driver is not None:
            driver.execute("PRAGMA foreign_keys=ON")
