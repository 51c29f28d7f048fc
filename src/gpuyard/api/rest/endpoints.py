"""``/v1/endpoints``: the account's serverless endpoints (an image and a handler whose
workers the reconciler starts as their job queue grows and stops as it empties; the
job API is RunPod's, under ``/runpod/v2/{endpoint_id}``). ``project_id`` and
``active_iam`` query parameters scope them as other project resources."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.pagination import CURSOR_QUERY, pagination
from gpuyard.api.rest.schemas import endpoints as es
from gpuyard.api.rest.schemas.resource_params import project_ref
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.serverless import endpoints as svc
from gpuyard.services.serverless.endpoint_inputs import CreateEndpoint, UpdateEndpoint
from gpuyard.services.serverless.endpoint_views import endpoint_view
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["endpoints"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)

ENDPOINT_ID = Path(max_length=svc.MAX_ENDPOINT_ID_CHARS, description="The endpoint's id")


def _view(read: svc.EndpointRead) -> dict[str, object]:
    return endpoint_view(read.row, read.counts)


@router.get("/v1/endpoints", responses=documented(es.EndpointListEnvelope))
def list_endpoints(
    request: Request,
    principal: Principal = Depends(current_principal),
    per_page: int = Query(default=svc.DEFAULT_PER_PAGE, ge=1, le=svc.MAX_PER_PAGE),
    cursor: str | None = CURSOR_QUERY,
) -> JSONResponse:
    """The account's live endpoints (only ``project_id``'s when given), oldest first,
    with their workers and jobs now. Page with ``cursor`` (the previous answer's
    ``pagination.next_cursor``)."""
    result = svc.endpoint_page(
        app_state(request).ctx, principal, project_ref(request), per_page=per_page, cursor=cursor
    )
    return ok(
        {
            "endpoints": [_view(e) for e in result.endpoints],
            "pagination": pagination(1, per_page, result.total, result.next_cursor),
        }
    )


@router.post("/v1/endpoints", status_code=201, responses=documented(es.EndpointEnvelope, 201))
def create_endpoint(
    body: CreateEndpoint, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Create an endpoint in ``project_id`` (default: the default project) from
    ``image`` or ``template_id``. Names are unique in the account (409
    ENDPOINT_EXISTS); a template or network volume that is not the account's is 404."""
    read = svc.create_endpoint(app_state(request).ctx, principal, project_ref(request), body)
    return ok(_view(read), status_code=201)


@router.get("/v1/endpoints/{endpoint_id}", responses=documented(es.EndpointEnvelope))
def get_endpoint(
    request: Request,
    endpoint_id: str = ENDPOINT_ID,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    read = svc.show_endpoint(app_state(request).ctx, principal, project_ref(request), endpoint_id)
    return ok(_view(read))


@router.patch("/v1/endpoints/{endpoint_id}", responses=documented(es.EndpointEnvelope))
def update_endpoint(
    body: UpdateEndpoint,
    request: Request,
    endpoint_id: str = ENDPOINT_ID,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Change the fields sent and bump ``version``: workers started from now on get the
    change; running jobs finish where they run. ``env`` replaces the map (the mask
    keeps a secret)."""
    read = svc.update_endpoint(
        app_state(request).ctx, principal, project_ref(request), endpoint_id, body
    )
    return ok(_view(read))


@router.delete("/v1/endpoints/{endpoint_id}", responses=documented(es.EndpointDeletedEnvelope))
def delete_endpoint(
    request: Request,
    endpoint_id: str = ENDPOINT_ID,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Delete an endpoint: it takes no new jobs and is gone from reads at once (its
    name free again); its workers finish their jobs and are stopped."""
    svc.delete_endpoint(app_state(request).ctx, principal, project_ref(request), endpoint_id)
    return ok({"id": endpoint_id, "deleted": True, "status": "deleting"})
