"""Reading an account's audit trail (``GET /v1/audit-events``): owners, admins and the
operator (READ_AUDIT), newest first, filtered by time, actor and action."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.roles import Permission
from gpuyard.services.context import Context
from gpuyard.services.tenancy.audit import AuditQuery, audit_view, list_audit
from gpuyard.services.tenancy.auth import Principal


def parse_time(field: str, value: str | None) -> datetime | None:
    """An ISO 8601 date or datetime (naive means UTC), None when absent; else
    ValidationFailed(field)."""
    if value is None or value == "":
        return None
    try:
        t = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace(" ", "+"))
    except ValueError as exc:
        raise ValidationFailed(
            field, f"{value[:60]!r} is not an ISO 8601 date or datetime (2025-01-31T12:00:00Z)"
        ) from exc
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def audit_page(
    ctx: Context,
    principal: Principal,
    *,
    from_text: str | None,
    to_text: str | None,
    actor: str | None,
    action: str | None,
    limit: int,
    before_id: int | None,
) -> dict[str, Any]:
    """The acting account's audit events in ``[from, to)`` (ISO 8601 texts), newest
    first, at most ``limit``; ``next_before_id`` pages on (None on the last page). The
    permission is checked before the filters are read: Forbidden wins over a
    malformed time (ValidationFailed naming ``from`` / ``to``)."""
    principal.require_permission(Permission.READ_AUDIT)
    q = AuditQuery(
        from_=parse_time("from", from_text),
        to=parse_time("to", to_text),
        actor=actor.strip() if actor else None,
        action=action.strip() if action else None,
        limit=limit,
        before_id=before_id,
    )
    with ctx.read() as session:
        rows = list_audit(session, principal.account_id, q)
        events = [audit_view(e) for e in rows]
    more = len(rows) == q.limit
    return {"events": events, "next_before_id": rows[-1].id if more and rows else None}
