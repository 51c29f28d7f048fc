"""Private container registry credentials (``/v1/registry-auths``, GraphQL's
``saveRegistryAuth`` / ``deleteRegistryAuth``): each use case opens its own
transaction and checks what the caller may do.

Credentials belong to the acting account; their name is unique in it. The password
is sealed with the installation's secret box (services/tenancy/secrets.py) before it
is stored and opened only where a cluster's image is pulled
(:func:`pull_credentials`, called by the reconciler outside any transaction). No
answer, log line, event or audit detail holds it: views carry id, name and creation
time. A cluster names its credentials by id (``registry_auth_id``), a template as
``container_registry_auth_id``; another account's id reads as unknown.

Credentials that a template or a live (not terminating or terminated) cluster still
names are not deleted: the delete answers 409 REGISTRY_AUTH_IN_USE naming them, so no
cluster or template silently loses the credentials its image needs.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuyard.core.errors import Conflict, GpuyardError, NotFound, ValidationFailed
from gpuyard.core.input_rules import MAX_DB_ID, check_name
from gpuyard.core.states import ClusterStatus
from gpuyard.runtimes.records import RegistryCredentials
from gpuyard.services.context import Context
from gpuyard.services.owned_rows import owned_row
from gpuyard.services.tenancy.audit import record_audit
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import acting_account
from gpuyard.services.tenancy.secrets import secret_box
from gpuyard.store.schema import Cluster, ClusterTemplate, Project, RegistryAuth

MAX_NAME_CHARS = 200
MAX_USERNAME_CHARS = 500
MAX_PASSWORD_CHARS = 8192


class RegistryAuthNotFound(NotFound):
    code = "REGISTRY_AUTH_NOT_FOUND"


class RegistryAuthExists(Conflict):
    code = "REGISTRY_AUTH_EXISTS"


class RegistryAuthInUse(GpuyardError):
    """Templates or live clusters still name the credentials; their ids are in
    ``details`` (``template_ids``, ``cluster_ids``, at most MAX_NAMED of each)."""

    code = "REGISTRY_AUTH_IN_USE"
    http_status = 409


# How many users of credentials a refused delete names (of each kind).
MAX_NAMED = 20
# How much of a refused id an error echoes.
MAX_ID_ECHO = 100


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


def checked_auth_id(session: Session, account_id: int, auth_id: object, field: str) -> int:
    """``auth_id`` (an int, or its decimal text as RunPod's clients send it) when it is
    one of ``account_id``'s credentials, inside the caller's transaction, the row
    share-locked until it ends (a concurrent delete waits and then sees the new user).
    Raises ValidationFailed naming ``field`` otherwise; another account's id reads
    exactly as a missing one."""
    number: int | None = None
    if isinstance(auth_id, int) and not isinstance(auth_id, bool):
        number = auth_id
    elif isinstance(auth_id, str) and auth_id.strip().isascii() and auth_id.strip().isdigit():
        number = int(auth_id.strip())
    if number is None:
        raise ValidationFailed(field, "must be the id of one of the account's registry auths")
    found = None
    if 1 <= number <= MAX_DB_ID:
        found = session.scalar(
            select(RegistryAuth.id)
            .where(RegistryAuth.id == number, RegistryAuth.account_id == account_id)
            .with_for_update(read=True)
        )
    if found is None:
        raise ValidationFailed(
            field,
            f"registry auth {number} not found in this account",
            {"registry_auth_id": str(auth_id)[:MAX_ID_ECHO]},
        )
    return number


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
    username: object = None,
    password: object = None,
    *,
    name: object = None,
) -> RegistryAuth:
    """Change credentials of the acting account: the fields given (not None) among
    ``username``, ``password`` and ``name``; at least one. The next pull of each cluster
    naming them uses the new ones. Needs the write permission. Raises Forbidden,
    RegistryAuthNotFound, ValidationFailed("name" | "username" | "password"),
    RegistryAuthExists (the new name is taken in the account)."""
    principal.require_write()
    if username is None and password is None and name is None:
        raise ValidationFailed("username", "give a username, a password or a name to change")
    clean_name = None if name is None else _checked_name(name)
    clean_user = (
        None if username is None else _text("username", username, MAX_USERNAME_CHARS, strip=True)
    )
    sealed = None
    if password is not None:
        clean_password = _text("password", password, MAX_PASSWORD_CHARS, strip=False)
        sealed = secret_box(ctx.settings).seal(clean_password)
    taken = RegistryAuthExists(
        f"a registry auth named {clean_name!r} exists in this account", {"name": clean_name}
    )
    try:
        with ctx.transaction() as session:
            account_id = acting_account(session, principal, active_iam)
            row = owned_row(
                session, RegistryAuth, auth_id, account_id, lambda: _missing(auth_id), lock=True
            )
            if clean_name is not None and clean_name != row.name:
                holder = session.scalar(
                    select(RegistryAuth.id).where(
                        RegistryAuth.account_id == account_id, RegistryAuth.name == clean_name
                    )
                )
                if holder is not None:
                    raise taken
                row.name = clean_name
            if clean_user is not None:
                row.username = clean_user
            if sealed is not None:
                row.password = sealed
            changed = [
                f
                for f, v in (("name", clean_name), ("username", clean_user), ("password", sealed))
                if v is not None
            ]
            record_audit(
                session,
                principal,
                account_id=account_id,
                action="registry_auth.update",
                target_type="registry_auth",
                target_id=row.id,
                detail={"name": row.name, "changed": changed},
                now=ctx.clock.now(),
            )
            session.flush()
            return row
    except IntegrityError as exc:
        raise taken from exc


# A cluster in these never pulls again (a terminate is never undone).
_GONE = (ClusterStatus.TERMINATING.value, ClusterStatus.TERMINATED.value)


def _users(session: Session, account_id: int, auth_id: int) -> tuple[list[str], list[str]]:
    """The account's templates and live clusters that name credentials ``auth_id``."""
    templates = list(
        session.scalars(
            select(ClusterTemplate.id)
            .where(
                ClusterTemplate.account_id == account_id,
                ClusterTemplate.container_registry_auth_id == str(auth_id),
            )
            .order_by(ClusterTemplate.id)
            .limit(MAX_NAMED)
        )
    )
    clusters = list(
        session.scalars(
            select(Cluster.id)
            .join(Project, Project.id == Cluster.project_id)
            .where(
                Project.account_id == account_id,
                Cluster.registry_auth_id == auth_id,
                Cluster.status.not_in(_GONE),
            )
            .order_by(Cluster.id)
            .limit(MAX_NAMED)
        )
    )
    return templates, clusters


def delete_registry_auth(
    ctx: Context, principal: Principal, active_iam: int | None, auth_id: int
) -> None:
    """Delete credentials of the acting account. Refused while a template or a live
    (not terminating or terminated) cluster of the account names them: change or
    delete those first (terminated clusters keep the id; a start never comes). Needs
    the write permission. Raises Forbidden, RegistryAuthNotFound, RegistryAuthInUse
    (409)."""
    principal.require_write()
    with ctx.transaction() as session:
        account_id = acting_account(session, principal, active_iam)
        row = owned_row(
            session, RegistryAuth, auth_id, account_id, lambda: _missing(auth_id), lock=True
        )
        templates, clusters = _users(session, account_id, row.id)
        if templates or clusters:
            named = [f"template {t}" for t in templates] + [f"cluster {c}" for c in clusters]
            raise RegistryAuthInUse(
                f"registry auth {row.id} is named by {', '.join(named)}: point them at other "
                "credentials (or none), or delete them, first",
                {"registry_auth_id": row.id, "template_ids": templates, "cluster_ids": clusters},
            )
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
