"""``/v1/reserved-ips``: public addresses a project holds from the admin's pool."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas import resources as rs
from gpuyard.api.rest.schemas.resource_params import project_ref, query_id
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.core.errors import ValidationFailed
from gpuyard.services.access import reserved_ips
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["reserved-ips"], responses=ERROR_RESPONSES)


@router.get("/v1/reserved-ips", responses=documented(rs.ReservedIpListEnvelope))
def list_ips(request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    """The project's reserved IPs (``project_id``; default: the default project)."""
    rows = reserved_ips.list_reserved_ips(app_state(request).ctx, principal, project_ref(request))
    return ok({"reserved_ips": [reserved_ips.reserved_ip_view(r) for r in rows]})


@router.post("/v1/reserved-ips", status_code=201, responses=documented(rs.ReservedIpEnvelope, 201))
async def allocate_ip(
    request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Reserve the lowest free address of the pool for the project. No pool, or
    every address taken: 409 INSUFFICIENT_CAPACITY."""
    # The project comes from the query string; a body (say {"project_id": 3}) would
    # otherwise be ignored silently and the address land in the default project.
    if (await request.body()).strip() not in (b"", b"{}", b"null"):
        raise ValidationFailed(
            "body", "takes no body: pass project_id and active_iam as query parameters"
        )
    project_id = query_id(request, "project_id")
    active_iam = query_id(request, "active_iam")
    row = await run_in_threadpool(
        reserved_ips.allocate_reserved_ip,
        app_state(request).ctx,
        principal,
        project_id,
        active_iam,
    )
    return ok(reserved_ips.reserved_ip_view(row), status_code=201)


@router.get("/v1/reserved-ips/{reserved_ip_id}", responses=documented(rs.ReservedIpEnvelope))
def get_ip(
    reserved_ip_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    ctx = app_state(request).ctx
    row = reserved_ips.show_reserved_ip(ctx, principal, reserved_ip_id, project_ref(request))
    return ok(reserved_ips.reserved_ip_view(row))


@router.delete("/v1/reserved-ips/{reserved_ip_id}", responses=documented(rs.DeletedEnvelope))
def release_ip(
    reserved_ip_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Release an address back to the pool; one attached to a training cluster is
    409 INVALID_STATE (detach it first)."""
    ctx = app_state(request).ctx
    reserved_ips.release_reserved_ip(ctx, principal, reserved_ip_id, project_ref(request))
    return ok({"id": reserved_ip_id, "deleted": True})
