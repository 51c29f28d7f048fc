"""Database-wide locks for work that replicas starting together must not do twice:
migrations and first-start seeding.

On PostgreSQL these are advisory locks (scoped to the database, so two installations
on one server never wait for each other). SQLite needs none: one process per database
file, and its write transactions already serialise (store/db.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

# The advisory lock key of gpuyard's start-up (migrations, seeding, the local host's
# row): any constant that no other application on the database uses. "gpyd" in ASCII.
STARTUP_LOCK_KEY = 0x67707964


def _is_postgres(bind: Engine | Connection) -> bool:
    return bind.dialect.name == "postgresql"


@contextmanager
def startup_lock(engine: Engine, key: int = STARTUP_LOCK_KEY) -> Iterator[None]:
    """Hold the database's start-up lock for the block (waiting for it as long as
    another process holds it): a session-level advisory lock on a dedicated connection,
    released and the connection closed after the block, even when it raised. A process
    that dies while holding it releases it with its connection. No-op off PostgreSQL."""
    if not _is_postgres(engine):
        yield
        return
    with engine.connect() as conn:
        # Autocommit: the lock is the session's, not a transaction's, and no open
        # transaction should sit on this connection while the block runs.
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})


def startup_xact_lock(session: Session, key: int = STARTUP_LOCK_KEY) -> None:
    """Take the start-up lock until ``session``'s transaction ends (call it first in
    the transaction): a second process's seeding then waits for the first one's commit
    and, reading afterwards, finds its rows (READ COMMITTED reads what is committed at
    each statement). No-op off PostgreSQL."""
    if _is_postgres(session.connection()):
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
