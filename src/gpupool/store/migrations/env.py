"""Alembic environment: the engine is handed in by gpupool.store.db.migrate (no alembic.ini needed)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from gpupool.store.models import Base

config = context.config
engine = config.attributes.get("engine") or create_engine(config.get_main_option("sqlalchemy.url") or "")

with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
