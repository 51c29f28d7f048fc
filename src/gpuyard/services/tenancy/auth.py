"""API keys and principals.

A key is ``gy_`` + 40 url-safe characters, shown once. Only its SHA-256 is stored,
beside a visible prefix (first 10 characters) so a user can tell keys apart.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import Forbidden, NotFound, Unauthorized, ValidationFailed
from gpuyard.core.roles import (
    ACCOUNT_LEVEL,
    Permission,
    Role,
    needs_write_scope,
    role_allows,
)
from gpuyard.store.schema import Account, ApiKey, Member, Project, ProjectMember, User, utcnow


class Scope(StrEnum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


_RANK = {Scope.READ: 0, Scope.WRITE: 1, Scope.ADMIN: 2}


@dataclass(frozen=True)
class Principal:
    """Who is calling and for which account: resolved from an API key (and the
    account the request selects) for every request.

    ``account_id`` is the acting account and ``role`` the caller's role in it
    (core/roles.py); ``member_id`` the membership (None for the operator acting in an
    account it is no member of, and for the control plane's own actions).
    ``project_ids``: the projects the caller may act in (None: every project of the
    account) — a key restricted to a project, or a member given only some projects.
    ``operator``: the installation's admin user with an admin-scoped key that no project
    restriction narrows.
    ``key_project_id``: the project the key itself is restricted to (None: the key is
    not), which withholds every account-wide permission (core/roles.py ACCOUNT_LEVEL)
    whatever the role; ``key_restricted``: the key is restricted to its account (every
    key restricted to a project is)."""

    key_id: int
    user_id: int
    account_id: int
    scope: Scope
    default_project_id: int
    role: Role = Role.OWNER
    member_id: int | None = None
    operator: bool = False
    project_ids: frozenset[int] | None = None
    key_name: str = ""
    key_project_id: int | None = None
    key_restricted: bool = False

    def require(self, scope: Scope) -> None:
        """The key's scope is at least ``scope``; the admin scope is the operator's."""
        if _RANK[self.scope] < _RANK[scope]:
            raise Forbidden(f"this API key has scope '{self.scope}', '{scope}' is required")
        if scope == Scope.ADMIN and not self.operator:
            raise Forbidden("only the installation's operator may do this")

    def allows(self, permission: Permission) -> bool:
        """Whether the role and the key's scope both allow ``permission``."""
        if needs_write_scope(permission) and _RANK[self.scope] < _RANK[Scope.WRITE]:
            return False
        if self.key_project_id is not None and permission in ACCOUNT_LEVEL:
            return False
        return self.operator or role_allows(self.role, permission)

    def require_permission(self, permission: Permission) -> None:
        """Raises Forbidden naming the role (or the key's scope) that does not allow
        ``permission``."""
        if self.allows(permission):
            return
        if needs_write_scope(permission) and _RANK[self.scope] < _RANK[Scope.WRITE]:
            raise Forbidden(f"this API key has scope '{self.scope}', 'write' is required")
        if self.key_project_id is not None and permission in ACCOUNT_LEVEL:
            self.require_unrestricted(permission.value)
        raise Forbidden(
            f"the role '{self.role}' may not do this ({permission.value})",
            {"role": self.role.value, "permission": permission.value},
        )

    def require_unrestricted(self, what: str) -> None:
        """Raises Forbidden when the key is restricted to a project: ``what`` concerns
        the whole account (details name the key's project and ``what``)."""
        if self.key_project_id is None:
            return
        raise Forbidden(
            f"this API key is restricted to project {self.key_project_id}: "
            f"this needs a key that is not restricted to a project ({what})",
            {
                "role": self.role.value,
                "permission": what,
                "restricted_to_project": self.key_project_id,
            },
        )

    def require_write(self) -> None:
        self.require_permission(Permission.WRITE_RESOURCES)

    def may_use_project(self, project_id: int) -> bool:
        return self.project_ids is None or project_id in self.project_ids


@dataclass(frozen=True)
class AccountSelection:
    """Which account a request acts for: ``account_id`` (the ``X-Gpuyard-Account``
    header) and/or ``active_iam`` (a membership id, seed 002). None: the key's own."""

    account_id: int | None = None
    active_iam: int | None = None


@dataclass(frozen=True)
class IssuedKey:
    key: str
    id: int
    prefix: str
    scope: Scope
    name: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> str:
    return "gy_" + secrets.token_urlsafe(30)


def issue_key(
    session: Session, *, user_id: int, account_id: int, name: str, scope: Scope
) -> IssuedKey:
    key = generate_key()
    row = ApiKey(
        user_id=user_id,
        account_id=account_id,
        name=name,
        prefix=key[:10],
        key_hash=hash_key(key),
        scope=scope.value,
    )
    session.add(row)
    session.flush()
    return IssuedKey(key=key, id=row.id, prefix=row.prefix, scope=scope, name=name)


def default_project_id(session: Session, account_id: int) -> int:
    pid = session.scalar(
        select(Project.id)
        .where(Project.account_id == account_id)
        .order_by(Project.is_default.desc(), Project.id)
        .limit(1)
    )
    if pid is None:
        project = Project(account_id=account_id, name="default", is_default=True)
        session.add(project)
        session.flush()
        pid = project.id
    return pid


def resolve_key(
    session: Session, key: str | None, selection: AccountSelection | None = None
) -> Principal:
    """The principal of a live key acting for the selected account. Raises
    Unauthorized (never says which part failed) for a bad key, Forbidden when the
    selection names an account or membership the key's user may not act for."""
    if not key:
        raise Unauthorized("missing API key: send 'Authorization: Bearer KEY'")
    row = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(key)))
    return _principal_of(session, row, selection)


def resolve_key_id(
    session: Session, key_id: int, selection: AccountSelection | None = None
) -> Principal:
    """:func:`resolve_key` for the key with id ``key_id`` (a session made with that
    key, re-checked on every use: revoked key, removed membership, changed role).
    Raises Unauthorized / Forbidden as :func:`resolve_key` does."""
    return _principal_of(session, session.get(ApiKey, key_id), selection)


def _principal_of(
    session: Session, row: ApiKey | None, selection: AccountSelection | None
) -> Principal:
    if row is None or row.revoked_at is not None:
        raise Unauthorized("invalid or revoked API key")
    user = session.get(User, row.user_id)
    if user is None:
        raise Unauthorized("invalid or revoked API key")
    # A key restricted to a project is no operator's: it acts only inside that project.
    operator = user.is_admin and row.scope == Scope.ADMIN.value and row.project_id is None
    account_id = _selected_account(session, row, selection)
    restricted = row.restricted or row.project_id is not None
    if restricted and account_id != row.account_id:
        raise Forbidden(f"this API key is restricted to account {row.account_id}")
    member = session.scalar(
        select(Member).where(Member.account_id == account_id, Member.user_id == row.user_id)
    )
    if member is None and not operator:
        if account_id == row.account_id:
            raise Unauthorized("invalid or revoked API key")  # membership removed
        raise Forbidden(f"this user is not a member of account {account_id}")
    if member is None and session.get(Account, account_id) is None:
        raise Forbidden(f"account {account_id} does not exist")
    project_ids = _allowed_projects(session, row, member, account_id)
    default = default_project_id(session, account_id)
    if project_ids is not None and default not in project_ids:
        default = min(project_ids) if project_ids else default
    return Principal(
        key_id=row.id,
        user_id=row.user_id,
        account_id=account_id,
        scope=Scope(row.scope),
        default_project_id=default,
        role=Role(member.role) if member is not None else Role.OWNER,
        member_id=member.id if member is not None else None,
        operator=operator,
        project_ids=project_ids,
        key_name=row.name,
        key_project_id=row.project_id,
        key_restricted=restricted,
    )


def _selected_account(session: Session, key: ApiKey, selection: AccountSelection | None) -> int:
    if selection is None:
        return key.account_id
    account_id = selection.account_id
    if selection.active_iam is not None:
        iam = selection.active_iam
        member = session.get(Member, iam) if 0 < iam < 2**31 else None
        if member is None or member.user_id != key.user_id:
            raise Forbidden(f"active_iam {iam} is not a membership of this user")
        if account_id is not None and account_id != member.account_id:
            raise Forbidden("active_iam and X-Gpuyard-Account name different accounts")
        account_id = member.account_id
    return account_id if account_id is not None else key.account_id


def _allowed_projects(
    session: Session, key: ApiKey, member: Member | None, account_id: int
) -> frozenset[int] | None:
    """The projects the caller may act in; None: every project of the account.

    A member or viewer given some projects acts only in those (none given: every
    project). A key restricted to a project acts only in it, and only while its user
    may: for a member or viewer who no longer has that project the set is empty (no
    project at all), as services/tenancy/cluster_access.py ``AccessIndex`` decides for the SSH
    gateway and the terminals."""
    given: frozenset[int] | None = None
    if member is not None and member.role in (Role.MEMBER.value, Role.VIEWER.value):
        given = (
            frozenset(
                session.scalars(
                    select(ProjectMember.project_id)
                    .join(Project, Project.id == ProjectMember.project_id)
                    .where(ProjectMember.member_id == member.id, Project.account_id == account_id)
                )
            )
            or None
        )
    if key.project_id is not None:
        pinned = frozenset({key.project_id})
        return pinned if given is None else pinned & given
    return given


def create_account(
    session: Session, *, email: str, name: str, is_admin: bool = False
) -> tuple[User, Account, Project]:
    """A user with their own account (role owner) and a default project."""
    user = User(email=email, name=name, is_admin=is_admin)
    account = Account(name=name)
    session.add_all([user, account])
    session.flush()
    session.add(Member(account_id=account.id, user_id=user.id, role="owner"))
    project = Project(account_id=account.id, name="default", is_default=True)
    session.add(project)
    session.flush()
    return user, account, project


def bootstrap_admin(session: Session) -> IssuedKey | None:
    """On the first start only: an admin user, account, default project and key.
    Returns the key to print once, or None when users already exist."""
    if session.scalar(select(User.id).limit(1)) is not None:
        return None
    user, account, _ = create_account(session, email="admin@localhost", name="admin", is_admin=True)
    return issue_key(
        session, user_id=user.id, account_id=account.id, name="admin", scope=Scope.ADMIN
    )


def admin_user(session: Session) -> User:
    user = session.scalar(select(User).where(User.is_admin.is_(True)).order_by(User.id).limit(1))
    if user is None:
        raise NotFound("no admin user: start the server once to create it")
    return user


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).order_by(ApiKey.id)))


def revoke_key(session: Session, key_id_or_prefix: str, when: datetime | None = None) -> ApiKey:
    cond = (
        ApiKey.id == int(key_id_or_prefix)
        if key_id_or_prefix.isdigit()
        else ApiKey.prefix == key_id_or_prefix
    )
    rows = list(session.scalars(select(ApiKey).where(cond)))
    if not rows:
        raise NotFound(f"no API key {key_id_or_prefix!r}")
    if len(rows) > 1:
        raise ValidationFailed("key", "prefix matches several keys; use the id")
    rows[0].revoked_at = when or utcnow()
    return rows[0]
