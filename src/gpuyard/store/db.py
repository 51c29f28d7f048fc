"""Engine and session set-up. SQLite runs in WAL mode with a busy timeout; its
transactions begin explicitly so a placement's first statement takes the write lock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

# Execution option naming the SQLite BEGIN mode ("IMMEDIATE" for write transactions).
SQLITE_BEGIN_OPTION = "sqlite_begin"
WRITE_OPTIONS = {SQLITE_BEGIN_OPTION: "IMMEDIATE"}


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    return create_engine(url, pool_size=20, max_overflow=20, pool_pre_ping=True)


def _sqlite_engine(url: str) -> Engine:
    path = url.split("///", 1)[-1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": 30},
        poolclass=None if path and path != ":memory:" else NullPool,
        pool_size=20,
        max_overflow=20,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, decide when transactions begin.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Write transactions take the write lock up front (BEGIN IMMEDIATE): a deferred
        # transaction that reads and then writes fails at once with SQLITE_BUSY when
        # another writer committed in between, instead of waiting its turn.
        mode = conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "")
        # Straight to the driver: a full SQLAlchemy execute would cost more than the
        # read that follows on hot paths.
        conn.connection.dbapi_connection.execute("BEGIN IMMEDIATE" if mode else "BEGIN")

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
