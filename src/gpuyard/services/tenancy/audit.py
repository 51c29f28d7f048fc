"""The audit trail: every change to accounts, memberships, keys, quotas, budgets and
credits, with who made it (user, membership, key) and the request it came with.

Recorded in the transaction of the change itself, so a change and its audit event
commit (or roll back) together.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.ids import new_request_id
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import AuditEvent, User


def record_audit(
    session: Session,
    principal: Principal | None,
    *,
    account_id: int | None,
    action: str,
    target_type: str,
    target_id: object = None,
    detail: dict[str, Any] | None = None,
    now: datetime,
) -> AuditEvent:
    """Add one audit event (``principal`` None: the control plane itself). ``action``
    is dotted, e.g. ``account.create``, ``member.role``, ``key.revoke``."""
    email = None
    if principal is not None and principal.user_id:
        email = session.scalar(select(User.email).where(User.id == principal.user_id))
    row = AuditEvent(
        account_id=account_id,
        actor_user_id=principal.user_id if principal is not None and principal.user_id else None,
        actor_email=email,
        member_id=principal.member_id if principal is not None else None,
        key_id=principal.key_id if principal is not None and principal.key_id else None,
        action=action,
        target_type=target_type,
        target_id=None if target_id is None else str(target_id),
        detail=detail or {},
        request_id=new_request_id(),
        created_at=now,
    )
    session.add(row)
    return row


@dataclass(frozen=True)
class AuditQuery:
    """Filters of ``GET /v1/audit-events``: a time window, an actor (user id or email)
    and an action (exact, or a prefix ending in ``.``/``*``)."""

    from_: datetime | None = None
    to: datetime | None = None
    actor: str | None = None
    action: str | None = None
    limit: int = 100
    before_id: int | None = None


def list_audit(session: Session, account_id: int, q: AuditQuery) -> list[AuditEvent]:
    """The account's audit events matching ``q``, newest first (at most ``q.limit``;
    page with ``before_id``)."""
    stmt = select(AuditEvent).where(AuditEvent.account_id == account_id)
    if q.from_ is not None:
        stmt = stmt.where(AuditEvent.created_at >= q.from_)
    if q.to is not None:
        stmt = stmt.where(AuditEvent.created_at < q.to)
    if q.actor:
        if q.actor.isdigit():
            stmt = stmt.where(AuditEvent.actor_user_id == int(q.actor))
        else:
            stmt = stmt.where(AuditEvent.actor_email == q.actor.lower())
    if q.action:
        prefix = q.action.rstrip("*")
        if q.action.endswith(("*", ".")):
            stmt = stmt.where(AuditEvent.action.startswith(prefix, autoescape=True))
        else:
            stmt = stmt.where(AuditEvent.action == q.action)
    if q.before_id is not None:
        stmt = stmt.where(AuditEvent.id < q.before_id)
    return list(session.scalars(stmt.order_by(AuditEvent.id.desc()).limit(q.limit)))


def audit_view(e: AuditEvent) -> dict[str, Any]:
    return {
        "id": e.id,
        "account_id": e.account_id,
        "actor": {"user_id": e.actor_user_id, "email": e.actor_email},
        "member_id": e.member_id,
        "key_id": e.key_id,
        "action": e.action,
        "target": {"type": e.target_type, "id": e.target_id},
        "detail": e.detail,
        "request_id": e.request_id,
        "created_at": e.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
