"""Direct SQLite reads of one cluster row, for the polled ``GET /v1/clusters/{id}``.

SQLAlchemy's execution and result processing cost several times the query itself
on SQLite. This reader keeps one plain ``sqlite3`` connection per thread in
autocommit mode (every SELECT sees the latest commit) and decodes the row with the
same column types the table declares, so callers get the values an ORM read would
give. PostgreSQL deployments use the SQLAlchemy path; this is only an accelerator.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import JSON, Boolean

from gpuyard.store.schema import Cluster, Project, UtcDateTime


def _decoder(column_type: Any) -> Callable[[Any], Any] | None:
    if isinstance(column_type, JSON):
        return lambda v: None if v is None else json.loads(v)
    if isinstance(column_type, Boolean):
        return lambda v: None if v is None else bool(v)
    if isinstance(column_type, UtcDateTime):
        return lambda v: None if v is None else datetime.fromisoformat(v).replace(tzinfo=UTC)
    return None


_COLUMNS = list(Cluster.__table__.columns)
_NAMES = [c.name for c in _COLUMNS]
_DECODERS = [(i, d) for i, c in enumerate(_COLUMNS) if (d := _decoder(c.type)) is not None]
_SQL = (
    f"SELECT {', '.join('c.' + n for n in _NAMES)} FROM {Cluster.__tablename__} c "
    f"JOIN {Project.__tablename__} p ON p.id = c.project_id "
    "WHERE c.id = ? AND p.account_id = ?"
)


class SqliteClusterReader:
    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            conn.execute("PRAGMA busy_timeout=30000")
            self._local.conn = conn
        return conn

    def __call__(self, cluster_id: str, account_id: int) -> Cluster | None:
        """The cluster's columns as attributes (an ORM-like, read-only record), or
        None when no cluster of that id belongs to ``account_id``."""
        row = self._connection().execute(_SQL, (cluster_id, account_id)).fetchone()
        if row is None:
            return None
        values = list(row)
        for index, decode in _DECODERS:
            values[index] = decode(values[index])
        record: Cluster = SimpleNamespace(**dict(zip(_NAMES, values, strict=True)))  # type: ignore[assignment]
        return record


def reader_for(url: str) -> SqliteClusterReader | None:
    """A reader for a file-backed SQLite URL; None for anything else."""
    if not url.startswith("sqlite:///") or url.endswith(":memory:"):
        return None
    return SqliteClusterReader(url.split("///", 1)[1])
