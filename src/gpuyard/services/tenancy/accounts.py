"""Accounts (tenants): created by the operator with a first owner, listed, renamed,
suspended and resumed.

A suspended account keeps its data and reads; its running clusters are stopped
(volumes kept) and services/billing/admission.py refuses new work until it is resumed.
Every change is audited in its own transaction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpuyard.core.errors import NotFound, ValidationFailed
from gpuyard.core.input_rules import check_name
from gpuyard.core.roles import Permission, Role
from gpuyard.services.access.resource_util import iso
from gpuyard.services.context import Context
from gpuyard.services.tenancy.account_stops import RunningWork, running_work, stop_work
from gpuyard.services.tenancy.audit import record_audit
from gpuyard.services.tenancy.auth import IssuedKey, Principal, Scope, issue_key
from gpuyard.store.schema import Account, Member, Project, User

# One ``@``, something on each side, no spaces or control characters: the address is
# where an invitation goes, so it must at least look like one.
_EMAIL = re.compile(r"^[^@\s\x00-\x1f\x7f]+@[^@\s\x00-\x1f\x7f]+$")
MAX_EMAIL = 320
STATUSES = ("active", "suspended")


class AccountNotFound(NotFound):
    code = "ACCOUNT_NOT_FOUND"


def normalize_email(value: str, field: str) -> str:
    """``value`` stripped and lower-cased; ValidationFailed(field) unless it looks like
    an e-mail address of at most 320 characters."""
    email = value.strip().lower()
    if not email or len(email) > MAX_EMAIL or not _EMAIL.match(email):
        raise ValidationFailed(field, "must be an e-mail address (name@domain)")
    return email


def clean_name(value: str, field: str = "name") -> str:
    """A stripped name of 1 to 200 characters without control characters."""
    name = value.strip()
    if not name or len(name) > 200:
        raise ValidationFailed(field, "must be 1 to 200 characters")
    try:
        return check_name(name)
    except ValueError as exc:
        raise ValidationFailed(field, str(exc)) from exc


def member_count(session: Session, account_id: int) -> int:
    return int(session.scalar(select(func.count()).where(Member.account_id == account_id)) or 0)


def account_view(session: Session, a: Account) -> dict[str, Any]:
    return {
        "id": a.id,
        "name": a.name,
        "status": a.status,
        "status_reason": a.status_reason,
        "billing_mode": a.billing_mode,
        "created_at": iso(a.created_at),
        "member_count": member_count(session, a.id),
    }


def project_view(p: Project) -> dict[str, Any]:
    return {"id": p.id, "name": p.name, "is_default": p.is_default, "created_at": iso(p.created_at)}


def key_view(k: IssuedKey) -> dict[str, Any]:
    """A key just issued: the only time its secret is shown."""
    return {"id": k.id, "key": k.key, "prefix": k.prefix, "name": k.name, "scope": k.scope.value}


def create_tenant(
    ctx: Context, principal: Principal, name: str, owner_email: str, owner_name: str | None
) -> dict[str, Any]:
    """A new account with a default project and its owner (a new user, or the existing
    user with that e-mail), and the owner's first key for it (scope write). Operator
    only. Raises Forbidden, ValidationFailed."""
    principal.require(Scope.ADMIN)
    name = clean_name(name)
    email = normalize_email(owner_email, "owner_email")
    display = clean_name(owner_name, "owner_name") if owner_name is not None else None
    now = ctx.clock.now()
    with ctx.transaction() as session:
        user = session.scalar(select(User).where(User.email == email))
        if user is None:
            user = User(email=email, name=display or email.split("@")[0], created_at=now)
            session.add(user)
        account = Account(name=name, created_at=now)
        session.add(account)
        session.flush()
        session.add(
            Member(account_id=account.id, user_id=user.id, role=Role.OWNER.value, created_at=now)
        )
        project = Project(account_id=account.id, name="default", is_default=True, created_at=now)
        session.add(project)
        session.flush()
        key = issue_key(
            session, user_id=user.id, account_id=account.id, name="owner", scope=Scope.WRITE
        )
        record_audit(
            session,
            principal,
            account_id=account.id,
            action="account.create",
            target_type="account",
            target_id=account.id,
            detail={"name": name, "owner_email": email, "owner_user_id": user.id},
            now=now,
        )
        return {
            "account": account_view(session, account),
            "project": project_view(project),
            "owner": {"user_id": user.id, "email": email},
            "api_key": key_view(key),
        }


@dataclass(frozen=True)
class AccountPage:
    accounts: list[dict[str, Any]]
    total: int


def list_accounts(ctx: Context, principal: Principal, page: int, per_page: int) -> AccountPage:
    """Every account for the operator, else the caller's accounts; a key restricted to
    its account (or a project of it) lists that account only. Oldest first."""
    with ctx.read() as session:
        stmt = select(Account)
        count = select(func.count()).select_from(Account)
        if principal.key_restricted:
            stmt = stmt.where(Account.id == principal.account_id)
            count = count.where(Account.id == principal.account_id)
        if not principal.operator:
            mine = select(Member.account_id).where(Member.user_id == principal.user_id)
            stmt = stmt.where(Account.id.in_(mine))
            count = count.where(Account.id.in_(mine))
        rows = session.scalars(
            stmt.order_by(Account.id).offset((page - 1) * per_page).limit(per_page)
        )
        views = [account_view(session, a) for a in rows]
        return AccountPage(views, int(session.scalar(count) or 0))


def get_account(ctx: Context, account_id: int) -> dict[str, Any]:
    """The account (the caller was checked to act in it). Raises AccountNotFound."""
    with ctx.read() as session:
        account = session.get(Account, account_id)
        if account is None:
            raise AccountNotFound(f"account {account_id} not found", {"account_id": account_id})
        return account_view(session, account)


def update_account(
    ctx: Context,
    principal: Principal,
    account_id: int,
    *,
    name: str | None,
    status: str | None,
    reason: str | None,
) -> dict[str, Any]:
    """Rename (owner or operator) and/or suspend or resume (operator only) the account.
    A suspension stops every running or starting cluster of the account, keeping its
    volumes; a resume starts nothing. Raises Forbidden, ValidationFailed,
    AccountNotFound. Idempotent: setting the current status changes nothing."""
    if name is None and status is None:
        raise ValidationFailed("name", "give name and/or status")
    if status is not None:
        principal.require(Scope.ADMIN)
        if status not in STATUSES:
            raise ValidationFailed("status", "must be active or suspended")
    if name is not None:
        if not principal.operator:
            principal.require_permission(Permission.MANAGE_ACCOUNT)
        name = clean_name(name)
    if reason is not None:
        reason = reason.strip()[:500] or None
    now = ctx.clock.now()
    to_stop = RunningWork()
    with ctx.transaction() as session:
        account = session.get(Account, account_id)
        if account is None:
            raise AccountNotFound(f"account {account_id} not found", {"account_id": account_id})
        if name is not None and name != account.name:
            record_audit(
                session,
                principal,
                account_id=account_id,
                action="account.update",
                target_type="account",
                target_id=account_id,
                detail={"name": {"from": account.name, "to": name}},
                now=now,
            )
            account.name = name
        if status is not None and status != account.status:
            account.status = status
            account.status_reason = reason if status == "suspended" else None
            account.status_changed_at = now
            record_audit(
                session,
                principal,
                account_id=account_id,
                action="account.suspend" if status == "suspended" else "account.resume",
                target_type="account",
                target_id=account_id,
                detail={"reason": reason},
                now=now,
            )
        elif status == "suspended" and reason is not None and reason != account.status_reason:
            account.status_reason = reason
        if account.status == "suspended":
            # Also on a repeated suspension: a cluster that slipped through is stopped.
            to_stop = running_work(session, account_id)
        view = account_view(session, account)
    if status == "suspended":
        why = view["status_reason"]
        stop_reason = "account suspended" + (f": {why}" if why else "")
        stop_work(ctx, account_id, to_stop, stop_reason)
    return view
