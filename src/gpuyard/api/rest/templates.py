"""``/v1/templates``: the account's cluster templates (saved configurations a cluster
create names with ``template_id``). ``project_id`` and ``active_iam`` query
parameters scope them as other project resources."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.pagination import CURSOR_QUERY, pagination
from gpuyard.api.rest.schemas import templates as ts
from gpuyard.api.rest.schemas.resource_params import project_ref
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.clusters import templates as svc
from gpuyard.services.clusters.template_inputs import CreateTemplate, UpdateTemplate
from gpuyard.services.tenancy.auth import Principal

# JSON bodies above a few KiB are parsed off the event loop (api/http/json_body.py).
router = APIRouter(tags=["templates"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)

TEMPLATE_ID = Path(max_length=svc.MAX_TEMPLATE_ID_CHARS, description="The template's id")


@router.get("/v1/templates", responses=documented(ts.TemplateListEnvelope))
def list_templates(
    request: Request,
    principal: Principal = Depends(current_principal),
    per_page: int = Query(default=svc.DEFAULT_PER_PAGE, ge=1, le=svc.MAX_PER_PAGE),
    cursor: str | None = CURSOR_QUERY,
) -> JSONResponse:
    """The account's templates (only ``project_id``'s when given), oldest first. Page
    with ``cursor`` (the previous answer's ``pagination.next_cursor``)."""
    result = svc.template_page(
        app_state(request).ctx, principal, project_ref(request), per_page=per_page, cursor=cursor
    )
    return ok(
        {
            "templates": [svc.template_view(t) for t in result.templates],
            "pagination": pagination(1, per_page, result.total, result.next_cursor),
        }
    )


@router.post("/v1/templates", status_code=201, responses=documented(ts.TemplateEnvelope, 201))
def create_template(
    body: CreateTemplate, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Save a template in ``project_id`` (default: the default project). Names are
    unique in the account (409 TEMPLATE_EXISTS); templates are never public."""
    row = svc.create_template(app_state(request).ctx, principal, project_ref(request), body)
    return ok(svc.template_view(row), status_code=201)


@router.get("/v1/templates/{template_id}", responses=documented(ts.TemplateEnvelope))
def get_template(
    request: Request,
    template_id: str = TEMPLATE_ID,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    row = svc.show_template(app_state(request).ctx, principal, project_ref(request), template_id)
    return ok(svc.template_view(row))


@router.patch("/v1/templates/{template_id}", responses=documented(ts.TemplateEnvelope))
def update_template(
    body: UpdateTemplate,
    request: Request,
    template_id: str = TEMPLATE_ID,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Change the fields sent; ``env`` replaces the map (the mask keeps a secret).
    Clusters made from the template keep what they were made with."""
    row = svc.update_template(
        app_state(request).ctx, principal, project_ref(request), template_id, body
    )
    return ok(svc.template_view(row))


@router.delete("/v1/templates/{template_id}", responses=documented(ts.TemplateDeletedEnvelope))
def delete_template(
    request: Request,
    template_id: str = TEMPLATE_ID,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Delete a template; clusters made from it keep running."""
    svc.delete_template(app_state(request).ctx, principal, project_ref(request), template_id)
    return ok({"id": template_id, "deleted": True})
