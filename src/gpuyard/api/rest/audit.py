"""``GET /v1/audit-events``: the acting account's audit trail (owners, admins and the
operator), newest first, filtered by time, actor and action, paged by ``before_id``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.rest.schemas import tenancy as ts
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, request_principal
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.roles import Permission
from gpuyard.services.clusters.requests import MAX_ID
from gpuyard.services.context import Context
from gpuyard.services.tenancy.audit import AuditQuery, audit_view, list_audit
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["audit"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)

MAX_LIMIT = 500


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


def _events(ctx: Context, account_id: int, q: AuditQuery) -> dict[str, Any]:
    with ctx.read() as session:
        rows = list_audit(session, account_id, q)
        events = [audit_view(e) for e in rows]
    more = len(rows) == q.limit
    return {"events": events, "next_before_id": rows[-1].id if more and rows else None}


@router.get("/v1/audit-events", responses=documented(ts.AuditEventListEnvelope))
def audit_events(
    request: Request,
    from_: Annotated[str | None, Query(alias="from", max_length=64)] = None,
    to: Annotated[str | None, Query(max_length=64)] = None,
    actor: Annotated[
        str | None, Query(max_length=320, description="a user id or e-mail address")
    ] = None,
    action: Annotated[
        str | None,
        Query(max_length=64, description="exact (key.revoke) or a prefix (key.* or key.)"),
    ] = None,
    before_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    principal: Principal = Depends(request_principal),
) -> JSONResponse:
    """The acting account's audit events (READ_AUDIT: owners, admins, the operator),
    newest first. ``from``/``to``: ISO 8601, ``[from, to)``. Page on with
    ``before_id`` = the answer's ``next_before_id`` (null on the last page)."""
    principal.require_permission(Permission.READ_AUDIT)
    q = AuditQuery(
        from_=parse_time("from", from_),
        to=parse_time("to", to),
        actor=actor.strip() if actor else None,
        action=action.strip() if action else None,
        limit=limit,
        before_id=before_id,
    )
    return ok(_events(app_state(request).ctx, principal.account_id, q))
