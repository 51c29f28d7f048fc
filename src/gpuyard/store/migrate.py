"""Apply Alembic migrations programmatically (the server does this at start)."""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


@functools.cache
def head_revisions() -> frozenset[str]:
    """The revisions at the head of the migration scripts (read once per process:
    Alembic imports every script to learn them)."""
    return frozenset(ScriptDirectory(str(MIGRATIONS)).get_heads())


def current_revisions(engine: Engine) -> frozenset[str]:
    """The revisions the store is at (none for a store never migrated)."""
    with engine.connect() as conn:
        return frozenset(MigrationContext.configure(conn).get_current_heads())


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the store to ``revision``. A store already at the head is left as it is
    without Alembic's run (which imports every script again: 40 ms a store, paid
    each time a process such as the test suite opens one)."""
    if revision == "head" and current_revisions(engine) == head_revisions():
        return
    command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    command.downgrade(alembic_config(engine), revision)
