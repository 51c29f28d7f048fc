"""``GET /v1/audit-events``: the acting account's audit trail (owners, admins and the
operator), newest first, filtered by time, actor and action, paged by ``before_id``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.rest.schemas import tenancy as ts
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, request_principal
from gpuyard.services.clusters.requests import MAX_ID
from gpuyard.services.tenancy.audit_trail import audit_page
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["audit"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)

MAX_LIMIT = 500


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
    page = audit_page(
        app_state(request).ctx,
        principal,
        from_text=from_,
        to_text=to,
        actor=actor,
        action=action,
        limit=limit,
        before_id=before_id,
    )
    return ok(page)
