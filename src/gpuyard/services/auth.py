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
from gpuyard.store.schema import Account, ApiKey, Member, Project, User, utcnow


class Scope(StrEnum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


_RANK = {Scope.READ: 0, Scope.WRITE: 1, Scope.ADMIN: 2}


@dataclass(frozen=True)
class Principal:
    """Who is calling: resolved from an API key for every request."""

    key_id: int
    user_id: int
    account_id: int
    scope: Scope
    default_project_id: int

    def require(self, scope: Scope) -> None:
        if _RANK[self.scope] < _RANK[scope]:
            raise Forbidden(f"this API key has scope '{self.scope}', '{scope}' is required")

    def require_write(self) -> None:
        self.require(Scope.WRITE)


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


def resolve_key(session: Session, key: str | None) -> Principal:
    """The principal of a live key. Raises Unauthorized (never says which part failed)."""
    if not key:
        raise Unauthorized("missing API key: send 'Authorization: Bearer KEY'")
    row = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(key)))
    if row is None or row.revoked_at is not None:
        raise Unauthorized("invalid or revoked API key")
    return Principal(
        key_id=row.id,
        user_id=row.user_id,
        account_id=row.account_id,
        scope=Scope(row.scope),
        default_project_id=default_project_id(session, row.account_id),
    )


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
