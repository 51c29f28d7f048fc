"""Which database errors are an outage (store/outage.py): those of a failover or a
restart answer 503 DATABASE_UNAVAILABLE; everything else stays a bug or the request's."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from gpuyard.core.errors import DatabaseUnavailable
from gpuyard.store.outage import is_database_unavailable, unavailable


def wrapped(cls: type[DBAPIError], orig: Exception, invalidated: bool = False) -> DBAPIError:
    return cls("SELECT 1", {}, orig, connection_invalidated=invalidated)


@pytest.mark.parametrize(
    "exc",
    [
        wrapped(OperationalError, psycopg.OperationalError("connection failed: refused")),
        wrapped(OperationalError, psycopg.errors.AdminShutdown("terminating connection")),
        wrapped(OperationalError, psycopg.errors.CannotConnectNow("starting up")),
        wrapped(DBAPIError, psycopg.errors.ReadOnlySqlTransaction("read-only transaction")),
        wrapped(DBAPIError, psycopg.InterfaceError("the connection is lost"), invalidated=True),
        PoolTimeout("QueuePool limit reached"),
        psycopg.OperationalError("raw driver error"),
    ],
    ids=["refused", "shutdown", "starting", "read-only", "invalidated", "pool", "raw"],
)
def test_outages(exc: Exception) -> None:
    assert is_database_unavailable(exc)


def test_an_outage_behind_another_error() -> None:
    try:
        try:
            raise wrapped(OperationalError, psycopg.OperationalError("server closed"))
        except OperationalError as inner:
            raise RuntimeError("while placing") from inner
    except RuntimeError as outer:
        assert is_database_unavailable(outer)


@pytest.mark.parametrize(
    "exc",
    [
        wrapped(IntegrityError, psycopg.errors.UniqueViolation("duplicate key")),
        wrapped(ProgrammingError, psycopg.errors.UndefinedTable("no such table")),
        # SQLite's OperationalError is its own (a locked file, a bad statement).
        wrapped(OperationalError, Exception("database is locked")),
        ValueError("a bug"),
    ],
    ids=["unique", "undefined", "sqlite", "bug"],
)
def test_not_outages(exc: Exception) -> None:
    assert not is_database_unavailable(exc)


def test_the_user_facing_error() -> None:
    err = unavailable(wrapped(OperationalError, psycopg.OperationalError("refused\nmore")))
    assert isinstance(err, DatabaseUnavailable)
    assert (err.code, err.http_status) == ("DATABASE_UNAVAILABLE", 503)
    assert "Idempotency-Key" in err.message
