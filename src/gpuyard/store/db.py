"""Engine and session set-up. SQLite runs in WAL mode with a busy timeout; its
transactions begin explicitly so a placement's first statement takes the write lock.
Its files are the owner's only (0600): they hold secrets' ciphertexts, key hashes and
every tenant's configuration."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from gpuyard.store.database_url import sqlalchemy_url

# Execution option naming the SQLite BEGIN mode ("IMMEDIATE" for write transactions).
SQLITE_BEGIN_OPTION = "sqlite_begin"
WRITE_OPTIONS = {SQLITE_BEGIN_OPTION: "IMMEDIATE"}


# A pooled PostgreSQL connection idle longer than this is pinged before it is handed
# out (see make_engine).
PING_IDLE_S = 2.0


def make_engine(url: str, *, ping_idle_s: float = PING_IDLE_S) -> Engine:
    """The store's engine for ``url``. PostgreSQL connections are pooled; one that sat
    idle in the pool for more than ``ping_idle_s`` seconds is pinged before use, and a
    dead one (a failover, a restart, an idle timeout) is replaced then. One used
    moments ago is handed out unpinged: a ping on every checkout (SQLAlchemy's
    ``pool_pre_ping``) was a round trip more per transaction, a dozen on a cluster's
    start. One that died since anyway fails its statement as the database being away
    (store/outage.py), and SQLAlchemy's invalidation then drops the pool's other
    connections of before."""
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    engine = create_engine(sqlalchemy_url(url), pool_size=20, max_overflow=20)
    _ping_when_idle(engine, ping_idle_s)
    return engine


def _ping_when_idle(engine: Engine, idle_s: float) -> None:
    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_conn: Any, record: Any) -> None:
        record.info["gy_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _lent(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("gy_idle_since")
        if since is None or time.monotonic() - since <= idle_s:
            return  # new (just connected), or used a moment ago
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            # The pool discards this connection and lends another (a new one).
            raise DisconnectionError(f"pooled connection is dead: {exc}") from exc
        if not alive:
            raise DisconnectionError("pooled connection is dead")


# SQLite's companions of a database file; it creates them with the database file's
# mode (whatever the umask), so a 0600 database gets 0600 companions.
SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def secure_sqlite_files(path: Path) -> None:
    """Create the database file at ``path`` as 0600 before SQLite first opens it (SQLite
    would make it 0644 under the usual umask), and set it and its existing -wal, -shm
    and -journal files to 0600. Idempotent."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for suffix in SQLITE_SUFFIXES:
        companion = Path(f"{path}{suffix}")
        if companion.is_file():
            os.chmod(companion, 0o600)


def _sqlite_engine(url: str) -> Engine:
    path = url.split("///", 1)[-1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # A plain file path only: a "file:" URI or query options are SQLite's to parse.
        if "?" not in path and not path.startswith("file:"):
            secure_sqlite_files(Path(path))
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
        # Freed space is zeroed: a value overwritten by its sealed form (or deleted)
        # leaves no plaintext behind in the file's free pages.
        cur.execute("PRAGMA secure_delete=ON")
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


def truncate_wal(engine: Engine) -> None:
    """Checkpoint a SQLite database and truncate its WAL, so page versions it held
    (plaintext a start-up pass has just overwritten) are gone from disk. Best effort:
    a reader holding an old snapshot leaves the WAL as it is. No-op elsewhere."""
    if engine.dialect.name != "sqlite":
        return
    raw = engine.raw_connection()
    try:
        raw.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # type: ignore[union-attr]
    finally:
        raw.close()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
