"""``gpuyard keys ...``: API keys managed directly in the store (``$GPUYARD_HOME`` /
``GPUYARD_DATABASE_URL``), so they work without a running server and without a key.

Keys are issued for the admin user's account (created on the server's first start).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from gpuyard.cli.common import remember_json
from gpuyard.cli.output import print_json, print_table

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

# Same as gpuyard.api.state.KEY_CACHE_TTL_S, which is not imported so that this CLI
# starts without loading FastAPI (test_cli asserts the two agree).
KEY_CACHE_TTL_S = 5.0
SCOPES = ("read", "write", "admin")


@contextmanager
def store_transaction() -> Iterator[Session]:
    """One write transaction on the store named by ``Settings()`` (migrated first);
    commits on success, rolls back on error, and disposes the engine."""
    # Imported here so HTTP commands start without loading SQLAlchemy and the services.
    from gpuyard.services.installation.bootstrap import open_store
    from gpuyard.settings import Settings
    from gpuyard.store.db import WRITE_OPTIONS

    engine, sessions = open_store(Settings())
    try:
        with sessions() as session, session.begin():
            session.connection(execution_options=WRITE_OPTIONS)
            yield session
    finally:
        engine.dispose()


def _iso(value: object) -> str | None:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if hasattr(value, "strftime") else None


@click.group("keys")
def keys() -> None:
    """Create, list and revoke API keys (on the server's machine, no key needed)."""


@keys.command("create")
@click.option("--name", default="cli", show_default=True, help="A label to tell keys apart.")
@click.option(
    "--scope",
    type=click.Choice(SCOPES),
    default="write",
    show_default=True,
    help="What the key may do: read, write, or admin.",
)
def create(name: str, scope: str) -> None:
    """Issue a key for the admin's account. The key is shown once, as the last line."""
    from sqlalchemy import select

    from gpuyard.core.errors import NotFound
    from gpuyard.services.tenancy.audit import record_audit
    from gpuyard.services.tenancy.auth import Scope, admin_user, issue_key
    from gpuyard.store.schema import Member, utcnow

    with store_transaction() as session:
        user = admin_user(session)
        account_id = session.scalar(
            select(Member.account_id).where(Member.user_id == user.id).order_by(Member.id).limit(1)
        )
        if account_id is None:
            raise NotFound(f"the admin user {user.email} has no account")
        issued = issue_key(
            session, user_id=user.id, account_id=account_id, name=name, scope=Scope(scope)
        )
        record_audit(
            session,
            None,
            account_id=account_id,
            action="key.create",
            target_type="api_key",
            target_id=issued.id,
            detail={"name": name, "scope": scope, "prefix": issued.prefix, "via": "cli"},
            now=utcnow(),
        )
    click.echo(
        f"created key {issued.id} ({issued.prefix}..., scope {issued.scope.value}, "
        f"name {issued.name!r}); it is shown only once:"
    )
    click.echo(issued.key)


@keys.command("list")
@click.option("--json", "as_json", is_flag=True, callback=remember_json, help="Print JSON.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Every key: id, visible prefix, name, scope, created and revoked times."""
    from gpuyard.services.tenancy.auth import list_keys

    with store_transaction() as session:
        rows = [
            {
                "id": k.id,
                "prefix": k.prefix,
                "name": k.name,
                "scope": k.scope,
                "account_id": k.account_id,
                "created_at": _iso(k.created_at),
                "revoked_at": _iso(k.revoked_at),
            }
            for k in list_keys(session)
        ]
    root = ctx.find_root().obj
    if as_json or getattr(root, "json", False):
        print_json({"keys": rows})
        return
    print_table(
        ["ID", "PREFIX", "NAME", "SCOPE", "CREATED", "REVOKED"],
        [
            [r["id"], r["prefix"], r["name"], r["scope"], r["created_at"], r["revoked_at"]]
            for r in rows
        ],
        "no keys",
    )


@keys.command("revoke")
@click.argument("id_or_prefix")
def revoke(id_or_prefix: str) -> None:
    """Revoke a key by its id or its visible prefix (e.g. gy_AbCdEfG). Revoking a
    revoked key is allowed and keeps it revoked."""
    from gpuyard.services.tenancy.audit import record_audit
    from gpuyard.services.tenancy.auth import revoke_key
    from gpuyard.store.schema import utcnow

    with store_transaction() as session:
        row = revoke_key(session, id_or_prefix)
        key_id, prefix, name = row.id, row.prefix, row.name
        record_audit(
            session,
            None,
            account_id=row.account_id,
            action="key.revoke",
            target_type="api_key",
            target_id=key_id,
            detail={"name": name, "prefix": prefix, "via": "cli"},
            now=utcnow(),
        )
    click.echo(
        f"revoked key {key_id} ({prefix}..., name {name!r}); a running server refuses it "
        f"within {KEY_CACHE_TTL_S:.0f} s"
    )
