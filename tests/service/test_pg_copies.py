"""The PostgreSQL copies the tests take (tests/pg_copies.py): each is a fresh copy of
the migrated template with its own installation id, taken by one test only, and
those nobody took are dropped when the run ends."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from tests.conftest import PG_URL, _fresh_installation, need_postgres
from tests.pg_copies import PgCopies


def _column(url: str, query: str) -> list[str]:
    """The first column of ``query``'s rows on the database ``url`` names."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [str(v) for v in conn.execute(text(query)).scalars()]
    finally:
        engine.dispose()


def _databases() -> set[str]:
    return set(_column(PG_URL, "SELECT datname FROM pg_database"))


def _installation_id(url: str) -> str:
    (uuid,) = _column(url, "SELECT uuid FROM installation")
    return uuid


def test_each_copy_is_fresh_and_its_own_and_untaken_ones_are_dropped(pg_template: str) -> None:
    need_postgres()
    copies = PgCopies(PG_URL, pg_template, _fresh_installation)
    first, second = copies.take(), copies.take()
    try:
        assert first != second
        assert _installation_id(first) != _installation_id(second)
        # A test's writes stay in its copy.
        engine = create_engine(first)
        with engine.begin() as conn:
            conn.execute(text("UPDATE installation SET uuid = 'changed'"))
        engine.dispose()
        assert _installation_id(second) != "changed"
    finally:
        copies.drop(first)
        copies.drop(second)
        copies.close()
    # The two taken, and the one made ahead that nobody took: none is left.
    assert len(copies.made) >= 2
    assert not set(copies.made) & _databases()


def test_a_copy_that_cannot_be_made_fails_the_test_that_takes_it() -> None:
    need_postgres()
    copies = PgCopies(PG_URL, "gy_no_such_template")
    try:
        for _ in range(2):
            try:
                copies.take()
            except Exception as exc:  # the server's refusal, as the test would see it
                assert "gy_no_such_template" in str(exc)
            else:
                raise AssertionError("a copy of a missing template was handed out")
    finally:
        copies.close()
