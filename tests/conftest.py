"""Shared fixtures: databases (SQLite always, PostgreSQL when GPUYARD_TEST_POSTGRES_URL
is set, required under CI), a use-case context on them, and principals."""

from __future__ import annotations

import dataclasses
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
from tests.helpers import make_settings

# The hooks that check the ``needs`` marks: a missing system part skips locally and
# fails under CI (tests/required_parts.py).
from tests.required_parts import (  # noqa: F401
    need,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_setup,
)

PG_URL = os.environ.get("GPUYARD_TEST_POSTGRES_URL", "").strip()


def _pg_database() -> Iterator[str]:
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    name = "gy_" + uuid.uuid4().hex[:12]
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_URL.rsplit("/", 1)[0] + "/" + name
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


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ctx(database_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Context]:
    """A migrated, seeded store with one declared host: 4 x A6000 + 4 x 4090."""
    settings = make_settings(tmp_path / "home", database_url)
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
