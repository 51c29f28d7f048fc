"""Alembic environment: the engine comes from the caller (store/migrate.py)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

from gpuyard.store.schema import Base

config = context.config
engine = config.attributes.get("engine")
if not isinstance(engine, Engine):  # pragma: no cover - only via store.migrate
    raise RuntimeError("run migrations through gpuyard.store.migrate")

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
