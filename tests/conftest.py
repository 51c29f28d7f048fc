"""Shared fixtures: databases (SQLite always, PostgreSQL when GPUYARD_TEST_POSTGRES_URL
is set, required under CI), a use-case context on them, and principals."""

from __future__ import annotations

import dataclasses
import gc
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from gpuyard.services.clock import FakeClock
from gpuyard.services.context import Context
from gpuyard.services.installation.bootstrap import first_start, open_store, register_local_host
from gpuyard.services.tenancy.auth import Principal, Scope, create_account, issue_key, resolve_key
from gpuyard.store.db import make_engine
from gpuyard.store.migrate import upgrade
from tests.helpers import FRESH_INSTALLATION_ID, make_settings, migrated_sqlite
from tests.pg_copies import PgCopies

# The hooks that check the ``needs`` marks: a missing system part skips locally and
# fails under CI (tests/required_parts.py).
from tests.required_parts import (  # noqa: F401
    need,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_setup,
)

PG_URL = os.environ.get("GPUYARD_TEST_POSTGRES_URL", "").strip()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what the imports and the collection made (modules, the schema, the
    collected tests: all of it lives to the end of the run) out of the collector's
    sight, so the full collections that free each test's server and database walk
    only what the tests made since."""
    gc.collect()
    gc.freeze()


def _pg_url(name: str) -> str:
    return PG_URL.rsplit("/", 1)[0] + "/" + name


def _pg_database(template: str | None = None) -> Iterator[str]:
    """A new database on the test server (a copy of ``template`` when given, else
    empty), dropped afterwards."""
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    name = "gy_" + uuid.uuid4().hex[:12]
    copy_of = f' TEMPLATE "{template}"' if template else ""
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"{copy_of}'))
    try:
        yield _pg_url(name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def need_postgres() -> None:
    """The PostgreSQL server the tests make databases on (``GPUYARD_TEST_POSTGRES_URL``)."""
    need(
        "postgresql",
        None if PG_URL else "GPUYARD_TEST_POSTGRES_URL is not set",
        how="WITH_POSTGRES=1 bash scripts/setup-system.sh; "
        "export GPUYARD_TEST_POSTGRES_URL=$(bash scripts/test-postgres.sh) (make test does both)",
    )


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    need_postgres()
    yield from _pg_database()


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """The name of a PostgreSQL database migrated once per test session, which
    ``migrated_database_url`` copies (CREATE DATABASE ... TEMPLATE, which needs no other
    connection to it: nothing but that copy ever connects after the migration)."""
    need_postgres()
    for url in _pg_database():
        engine = make_engine(url)
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        yield url.rsplit("/", 1)[1]


@pytest.fixture(params=["sqlite", "postgres"])
def migrated_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new database on each backend with the schema at the latest migration, as a
    first migration leaves it (its own installation id, no other row added): a copy of
    one migrated per session."""
    if request.param == "sqlite":
        path = tmp_path / "test.db"
        migrated_sqlite(path)
        yield f"sqlite:///{path}"
        return
    need_postgres()
    copies: PgCopies = request.getfixturevalue("pg_copies")
    url = copies.take()
    try:
        yield url
    finally:
        copies.drop(url)


def _fresh_installation(url: str) -> None:
    """Give a copy of the template its own installation id, as a first migration would."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(FRESH_INSTALLATION_ID), {"uuid": str(uuid.uuid4())})
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def pg_copies(pg_template: str) -> Iterator[PgCopies]:
    """Fresh copies of the migrated template, each with its own installation id, made
    one ahead of the tests that take them (tests/pg_copies.py)."""
    copies = PgCopies(PG_URL, pg_template, _fresh_installation)
    try:
        yield copies
    finally:
        copies.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ctx(migrated_database_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Context]:
    """A migrated, seeded store with one declared host: 4 x A6000 + 4 x 4090 (the
    migrations ran once per session: ``migrated_database_url``)."""
    settings = make_settings(tmp_path / "home", migrated_database_url)
    engine, sessions = open_store(settings)
    context = Context(sessions=sessions, settings=settings, clock=clock)
    first_start(context)
    register_local_host(context, None)
    yield context
    engine.dispose()


def new_principal(ctx: Context, email: str, scope: Scope = Scope.WRITE) -> Principal:
    with ctx.transaction() as session:
        user, account, _ = create_account(session, email=email, name=email)
        key = issue_key(session, user_id=user.id, account_id=account.id, name="t", scope=scope)
    with ctx.read() as session:
        return resolve_key(session, key.key)


@pytest.fixture
def alice(ctx: Context) -> Principal:
    return new_principal(ctx, "alice@example.com")


@pytest.fixture
def bob(ctx: Context) -> Principal:
    return new_principal(ctx, "bob@example.com")


def new_operator(ctx: Context) -> Principal:
    """The installation's operator (an admin key of the operator's account): who manages
    the fleet (hosts, drains)."""
    principal = new_principal(ctx, "operator@example.com", Scope.ADMIN)
    return dataclasses.replace(principal, operator=True)
