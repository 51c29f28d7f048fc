"""Private container registry credentials (``/v1/registry-auths``, GraphQL's
``saveRegistryAuth`` / ``deleteRegistryAuth``): each use case opens its own
transaction and checks what the caller may do.

Credentials belong to the acting account; their name is unique in it. The password
is sealed with the installation's secret box (services/tenancy/secrets.py) before it
is stored and opened only where a cluster's image is pulled
(:func:`pull_credentials`, called by the reconciler outside any transaction). No
answer, log line, event or audit detail holds it: views carry id, name and creation
time. A cluster names its credentials by id (``registry_auth_id``); another
account's id reads as unknown.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuyard.core.errors import Conflict, NotFound, ValidationFailed
from gpuyard.core.input_rules import MAX_DB_ID, check_name
from gpuyard.runtimes.records import RegistryCredentials
from gpuyard.services.context import Context
from gpuyard.services.owned_rows import owned_row
from gpuyard.services.tenancy.audit import record_audit
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import acting_account
from gpuyard.services.tenancy.secrets import secret_box
from gpuyard.store.schema import Cluster, Project, RegistryAuth

MAX_NAME_CHARS = 200
MAX_USERNAME_CHARS = 500
MAX_PASSWORD_CHARS = 8192


class RegistryAuthNotFound(NotFound):
    code = "REGISTRY_AUTH_NOT_FOUND"


class RegistryAuthExists(Conflict):
    code = "REGISTRY_AUTH_EXISTS"


def registry_auth_view(row: RegistryAuth) -> dict[str, object]:
    """What the API answers: id, name and creation time; never the username or password."""
    return {
        "id": row.id,
        "name": row.name,
        "created_at": row.created_at.isoformat() if row.created_at else None,
    }


def _text(field: str, value: object, limit: int, *, strip: bool) -> str:
    if not isinstance(value, str):
        raise ValidationFailed(field, "must be a string")
    clean = value.strip() if strip else value
    if not clean or len(clean) > limit:
        raise ValidationFailed(field, f"must be 1 to {limit} characters")
    if "\x00" in clean:
        raise ValidationFailed(field, "must not contain NUL")
    return clean


def _checked_name(value: object) -> str:
    name = _text("name", value, MAX_NAME_CHARS, strip=True)
    try:
        return check_name(name)
    except ValueError as exc:
        raise ValidationFailed("name", str(exc)) from exc


def _missing(auth_id: int) -> RegistryAuthNotFound:
    return RegistryAuthNotFound(f"registry auth {auth_id} not found", {"registry_auth_id": auth_id})


def find_registry_auth(session: Session, account_id: int, auth_id: int) -> RegistryAuth:
    """Credentials ``auth_id`` of ``account_id``, inside the caller's transaction.
    Raises RegistryAuthNotFound (also for another account's)."""
    return owned_row(session, RegistryAuth, auth_id, account_id, lambda: _missing(auth_id))


def list_registry_auths(
    ctx: Context, principal: Principal, active_iam: int | None
) -> list[RegistryAuth]:
    """The acting account's credentials, oldest first."""
    with ctx.read() as session:
        account_id = acting_account(session, principal, active_iam)
        return list(
            session.scalars(
                select(RegistryAuth)
                .where(RegistryAuth.account_id == account_id)
                .order_by(RegistryAuth.id)
            )
        )


def create_registry_auth(
    ctx: Context,
    principal: Principal,
    active_iam: int | None,
    name: object,
    username: object,
    password: object,
) -> RegistryAuth:
    """Store credentials in the acting account, the password sealed. Needs the write
    permission. Raises Forbidden, ValidationFailed("name" | "username" | "password"),
    RegistryAuthExists (the name is taken in the account)."""
    principal.require_write()
    clean_name = _checked_name(name)
    clean_user = _text("username", username, MAX_USERNAME_CHARS, strip=True)
    clean_password = _text("password", password, MAX_PASSWORD_CHARS, strip=False)
    sealed = secret_box(ctx.settings).seal(clean_password)
    taken = RegistryAuthExists(
        f"a registry auth named {clean_name!r} exists in this account", {"name": clean_name}
    )
    try:
        with ctx.transaction() as session:
            account_id = acting_account(session, principal, active_iam)
            exists = session.scalar(
                select(RegistryAuth.id).where(
                    RegistryAuth.account_id == account_id, RegistryAuth.name == clean_name
                )
            )
            if exists is not None:
                raise taken
            row = RegistryAuth(
                account_id=account_id,
                name=clean_name,
                username=clean_user,
                password=sealed,
                created_at=ctx.clock.now(),
            )
            session.add(row)
            session.flush()
            record_audit(
                session,
                principal,
                account_id=account_id,
                action="registry_auth.create",
                target_type="registry_auth",
                target_id=row.id,
                detail={"name": clean_name},
                now=ctx.clock.now(),
            )
            return row
    except IntegrityError as exc:
        raise taken from exc


def update_registry_auth(
    ctx: Context,
    principal: Principal,
    active_iam: int | None,
    auth_id: int,
    username: object,
    password: object,
) -> RegistryAuth:
    """Replace the username and password of credentials of the acting account (the
    name stays); the next pull of each cluster naming them uses the new ones. Needs
    the write permission. Raises Forbidden, RegistryAuthNotFound,
    ValidationFailed("username" | "password")."""
    principal.require_write()
    clean_user = _text("username", username, MAX_USERNAME_CHARS, strip=True)
    clean_password = _text("password", password, MAX_PASSWORD_CHARS, strip=False)
    sealed = secret_box(ctx.settings).seal(clean_password)
    with ctx.transaction() as session:
        account_id = acting_account(session, principal, active_iam)
        row = owned_row(
            session, RegistryAuth, auth_id, account_id, lambda: _missing(auth_id), lock=True
        )
        row.username = clean_user
        row.password = sealed
        record_audit(
            session,
            principal,
            account_id=account_id,
            action="registry_auth.update",
            target_type="registry_auth",
            target_id=row.id,
            detail={"name": row.name},
            now=ctx.clock.now(),
        )
        session.flush()
        return row


def delete_registry_auth(
    ctx: Context, principal: Principal, active_iam: int | None, auth_id: int
) -> None:
    """Delete credentials of the acting account. Clusters that named them pull
    anonymously from then on (a registry that needs credentials refuses). Needs the
    write permission. Raises Forbidden, RegistryAuthNotFound."""
    principal.require_write()
    with ctx.transaction() as session:
        account_id = acting_account(session, principal, active_iam)
        row = find_registry_auth(session, account_id, auth_id)
        record_audit(
            session,
            principal,
            account_id=account_id,
            action="registry_auth.delete",
            target_type="registry_auth",
            target_id=row.id,
            detail={"name": row.name},
            now=ctx.clock.now(),
        )
        session.delete(row)
        session.flush()


def pull_credentials(
    ctx: Context, project_id: int, auth_id: int | None
) -> RegistryCredentials | None:
    """The opened credentials a cluster of ``project_id`` pulls its image with; None
    when it names none, or names credentials since deleted or of another account (the
    pull is anonymous). Reads in its own short transaction and opens the password
    after it, outside any transaction. Raises SecretUnreadable when the installation's
    key changed."""
    if auth_id is None or not 1 <= auth_id <= MAX_DB_ID:
        return None
    with ctx.read() as session:
        found = session.execute(
            select(RegistryAuth.username, RegistryAuth.password)
            .join(Project, Project.account_id == RegistryAuth.account_id)
            .where(RegistryAuth.id == auth_id, Project.id == project_id)
        ).first()
    if found is None:
        return None
    return RegistryCredentials(found.username, secret_box(ctx.settings).open(found.password))


def is_private_image(ctx: Context, image: str) -> bool:
    """Whether any cluster names ``image`` with registry credentials: then every start
    of it asks the registry again (runtimes' ``ensure_image(fresh=True)``), so a copy
    on the host from one account's pull is never another's without credentials."""
    with ctx.read() as session:
        found = session.scalar(
            select(Cluster.id)
            .where(Cluster.image == image, Cluster.registry_auth_id.is_not(None))
            .limit(1)
        )
    return found is not None
