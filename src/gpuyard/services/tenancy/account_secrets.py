"""Account secrets (``/v1/secrets``): named values of an account, sealed at rest, that
clusters' environment refers to as ``{{ RUNPOD_SECRET_name }}`` (core/secret_refs.py).

Each use case opens its own transaction and checks what the caller may do: any member
who may read the account's resources sees the secrets' names and descriptions, one
who may write creates, changes and deletes them, with a key that is not restricted to
a project (a secret is the whole account's: every project's clusters may refer to
it). A secret's value is never answered,
logged, audited or put in an event: it is sealed with the installation's key
(services/tenancy/secrets.py) on the way in and opened only by
:func:`opened_secrets`, which the reconciler calls outside any transaction when it
builds a container (reconciler/clusters/container_spec.py). Names are per account:
another account's secret of the same name never resolves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuyard.core.errors import GpuyardError, NotFound, ValidationFailed
from gpuyard.core.input_rules import check_text
from gpuyard.core.models import MAX_ENV_VALUE
from gpuyard.core.secret_refs import (
    MAX_DESCRIPTION,
    check_secret_name,
    reference,
    referenced_names,
    resolve_env,
)
from gpuyard.services.context import Context
from gpuyard.services.owned_rows import owned_row
from gpuyard.services.tenancy.audit import record_audit
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.secrets import SecretBox, open_env, secret_box
from gpuyard.store.schema import AccountSecret, Project


class SecretNotFound(NotFound):
    code = "SECRET_NOT_FOUND"


class SecretMissing(GpuyardError):
    """A start's env refers to a secret its account no longer has (the start fails
    with this message; it is no engine failure, so it is not tried again)."""

    code = "SECRET_MISSING"
    http_status = 409


class SecretExists(GpuyardError):
    """The account already has a secret of that name."""

    code = "SECRET_EXISTS"
    http_status = 409


def secret_view(row: AccountSecret) -> dict[str, Any]:
    """What answers show of a secret: never its value."""
    return {
        "id": row.id,
        "name": row.name,
        "description": row.description,
        "reference": reference(row.name),
        "created_at": row.created_at.isoformat() if row.created_at else None,
        "updated_at": row.updated_at.isoformat() if row.updated_at else None,
    }


def _checked_name(name: object) -> str:
    if not isinstance(name, str):
        raise ValidationFailed("name", "name must be a string")
    try:
        return check_secret_name(name)
    except ValueError as exc:
        raise ValidationFailed("name", str(exc)) from exc


def _checked_value(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationFailed("value", "value must be a non-empty string")
    if len(value.encode()) > MAX_ENV_VALUE or "\x00" in value:
        raise ValidationFailed(
            "value", f"value must be at most {MAX_ENV_VALUE} bytes, without NUL characters"
        )
    return value


def _checked_description(description: object) -> str:
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        raise ValidationFailed(
            "description", f"description must be a string of at most {MAX_DESCRIPTION} characters"
        )
    try:
        return check_text(description)
    except ValueError as exc:
        raise ValidationFailed("description", str(exc)) from exc


def _find(
    session: Session, account_id: int, secret_id: int, *, lock: bool = False
) -> AccountSecret:
    return owned_row(
        session,
        AccountSecret,
        secret_id,
        account_id,
        lambda: SecretNotFound(f"secret {secret_id} not found", {"secret_id": secret_id}),
        lock=lock,
    )


def list_secrets(ctx: Context, principal: Principal) -> list[AccountSecret]:
    """The acting account's secrets, by name (values never read out)."""
    with ctx.read() as session:
        return list(
            session.scalars(
                select(AccountSecret)
                .where(AccountSecret.account_id == principal.account_id)
                .order_by(AccountSecret.name)
            )
        )


def show_secret(ctx: Context, principal: Principal, secret_id: int) -> AccountSecret:
    """One secret of the acting account. Raises SecretNotFound (also for another
    account's)."""
    with ctx.read() as session:
        return _find(session, principal.account_id, secret_id)


def create_secret(
    ctx: Context, principal: Principal, name: object, value: object, description: object = ""
) -> AccountSecret:
    """Store a new secret of the acting account, its value sealed. Needs the write
    permission and an unrestricted key. Raises Forbidden, ValidationFailed ("name",
    "value", "description"),
    SecretExists."""
    principal.require_write()
    principal.require_unrestricted("account secrets")
    checked = _checked_name(name)
    plain = _checked_value(value)
    text = _checked_description(description)
    sealed = secret_box(ctx.settings).seal(plain)
    now = ctx.clock.now()
    exists = SecretExists(
        f"a secret named {checked!r} already exists in this account", {"name": checked}
    )
    try:
        with ctx.transaction() as session:
            taken = session.scalar(
                select(AccountSecret.id).where(
                    AccountSecret.account_id == principal.account_id,
                    AccountSecret.name == checked,
                )
            )
            if taken is not None:
                raise exists
            row = AccountSecret(
                account_id=principal.account_id,
                name=checked,
                description=text,
                value=sealed,
                created_at=now,
                updated_at=now,
            )
            session.add(row)
            session.flush()
            _audit(session, principal, "secret.create", row, now)
            return row
    except IntegrityError as exc:  # a concurrent create of the same name won
        raise exists from exc


def update_secret(
    ctx: Context,
    principal: Principal,
    secret_id: int,
    value: object = None,
    description: object = None,
) -> AccountSecret:
    """Give a secret a new value and/or description (None: unchanged). Clusters that
    refer to it get the new value at their next start. Needs the write permission.
    Raises Forbidden, SecretNotFound, ValidationFailed."""
    principal.require_write()
    principal.require_unrestricted("account secrets")
    sealed = None if value is None else secret_box(ctx.settings).seal(_checked_value(value))
    text = None if description is None else _checked_description(description)
    now = ctx.clock.now()
    with ctx.transaction() as session:
        row = _find(session, principal.account_id, secret_id, lock=True)
        if sealed is not None:
            row.value = sealed
        if text is not None:
            row.description = text
        row.updated_at = now
        session.flush()
        _audit(session, principal, "secret.update", row, now)
        return row


def delete_secret(ctx: Context, principal: Principal, secret_id: int) -> None:
    """Delete a secret. A cluster that still refers to it fails its next start with an
    error naming it. Needs the write permission. Raises Forbidden, SecretNotFound."""
    principal.require_write()
    principal.require_unrestricted("account secrets")
    now = ctx.clock.now()
    with ctx.transaction() as session:
        row = _find(session, principal.account_id, secret_id, lock=True)
        _audit(session, principal, "secret.delete", row, now)
        session.delete(row)
        session.flush()


def _audit(
    session: Session, principal: Principal, action: str, row: AccountSecret, now: Any
) -> None:
    record_audit(
        session,
        principal,
        account_id=row.account_id,
        action=action,
        target_type="secret",
        target_id=row.id,
        detail={"name": row.name},
        now=now,
    )


# ------------------------------------------------------------------ references


def check_references(session: Session, account_id: int, values: Iterable[str], field: str) -> None:
    """Refuse env ``values`` that refer to secrets ``account_id`` does not have. Runs
    in its caller's transaction (a cluster's create or start). Raises
    ValidationFailed naming ``field`` and the missing secrets."""
    names = referenced_names(values)
    if not names:
        return
    known = set(
        session.scalars(
            select(AccountSecret.name).where(
                AccountSecret.account_id == account_id, AccountSecret.name.in_(names)
            )
        )
    )
    missing = sorted(names - known)
    if missing:
        raise ValidationFailed(
            field,
            "the environment refers to secrets this account does not have: "
            + ", ".join(missing)
            + " (create them with POST /v1/secrets)",
            {"missing_secrets": missing},
        )


def check_cluster_references(
    session: Session, box: SecretBox, project_id: int, stored: Mapping[str, str], field: str
) -> None:
    """:func:`check_references` for a cluster's stored env (its sealed values opened)
    in project ``project_id``'s account. Runs in its caller's transaction."""
    account_id = session.scalar(select(Project.account_id).where(Project.id == project_id))
    if account_id is not None:
        check_references(session, account_id, open_env(box, stored).values(), field)


def opened_secrets(ctx: Context, account_id: int, names: Iterable[str]) -> dict[str, str]:
    """The plaintext values of ``account_id``'s secrets of ``names`` (those it has):
    read in a short read of its own, opened after it, for a container's env only.
    Raises SecretUnreadable."""
    wanted = set(names)
    if not wanted:
        return {}
    with ctx.read() as session:
        rows = session.execute(
            select(AccountSecret.name, AccountSecret.value).where(
                AccountSecret.account_id == account_id, AccountSecret.name.in_(wanted)
            )
        ).all()
    box = secret_box(ctx.settings)
    return {row.name: box.open(row.value) for row in rows}


def resolved_env(ctx: Context, account_id: int, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` (plaintext) with its references replaced by ``account_id``'s secrets.
    Raises SecretMissing naming a secret the account no longer has, SecretUnreadable."""
    secrets = opened_secrets(ctx, account_id, referenced_names(env.values()))
    try:
        return resolve_env(env, secrets)
    except KeyError as exc:
        name = str(exc.args[0])
        raise SecretMissing(
            f"the environment refers to the secret {name!r}, which this account no "
            "longer has: create it again (POST /v1/secrets) or change the environment",
            {"missing_secret": name},
        ) from exc
