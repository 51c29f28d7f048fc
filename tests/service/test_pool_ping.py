"""Pooled PostgreSQL connections (store/db.py ``make_engine``): one idle in the pool
longer than the ping threshold is pinged before it is lent, so a connection the server
dropped meanwhile (a restart, a failover, an idle timeout) is replaced without the
transaction meeting it; one used a moment ago is lent without a ping."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, event, text

from gpuyard.store.db import make_engine
from tests.conftest import PG_URL, _pg_database, need_postgres


@pytest.fixture
def pg_url() -> Iterator[str]:
    need_postgres()
    yield from _pg_database()


def _kill_backends(url: str) -> None:
    """End every other session of ``url``'s database, as a server restart would."""
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :db AND pid <> pg_backend_pid()"
                ),
                {"db": url.rsplit("/", 1)[1]},
            )
    finally:
        admin.dispose()


def _statements(engine: Engine) -> list[str]:
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _seen(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        seen.append(statement)

    return seen


def test_an_idle_connection_the_server_dropped_is_replaced_before_use(pg_url: str) -> None:
    engine = make_engine(pg_url, ping_idle_s=0.0)  # every pooled connection counts idle
    try:
        with engine.connect() as conn:
            first = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        _kill_backends(pg_url)
        with engine.connect() as conn:  # no error: the ping found it dead
            second = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        assert second != first
    finally:
        engine.dispose()


def test_a_connection_used_a_moment_ago_is_lent_without_a_ping(pg_url: str) -> None:
    engine = make_engine(pg_url, ping_idle_s=60.0)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        pinged: list[object] = []
        real_ping = engine.dialect.do_ping

        def counting_ping(dbapi_conn: object) -> bool:
            pinged.append(dbapi_conn)
            return bool(real_ping(dbapi_conn))

        engine.dialect.do_ping = counting_ping  # type: ignore[method-assign]
        seen = _statements(engine)
        with engine.connect() as conn:
            conn.execute(text("SELECT 2"))
        assert pinged == [] and seen == ["SELECT 2"]
    finally:
        engine.dispose()
