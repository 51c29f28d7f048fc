"""``/v1/registry-auths``: the acting account's private container registry
credentials (services/tenancy/registry_auths.py). The password is taken, sealed and
never answered."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas import resources as rs
from gpuyard.api.rest.schemas.resource_params import query_id
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.tenancy import registry_auths as auths
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["registry-auths"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)


@router.get("/v1/registry-auths", responses=documented(rs.RegistryAuthListEnvelope))
def list_auths(request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    """The acting account's registry credentials, oldest first (id and name only)."""
    active_iam = query_id(request, "active_iam")
    rows = auths.list_registry_auths(app_state(request).ctx, principal, active_iam)
    return ok({"registry_auths": [auths.registry_auth_view(r) for r in rows]})


@router.post(
    "/v1/registry-auths", status_code=201, responses=documented(rs.RegistryAuthEnvelope, 201)
)
def create_auth(
    body: rs.CreateRegistryAuth, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Store credentials for a private registry (a name unique in the account, a
    username and a password or token). Name them on a cluster as ``registry_auth_id``:
    its image is pulled with them."""
    active_iam = query_id(request, "active_iam")
    row = auths.create_registry_auth(
        app_state(request).ctx, principal, active_iam, body.name, body.username, body.password
    )
    return ok(auths.registry_auth_view(row), status_code=201)


@router.patch(
    "/v1/registry-auths/{registry_auth_id}", responses=documented(rs.RegistryAuthEnvelope)
)
def update_auth(
    registry_auth_id: IdPath,
    body: rs.UpdateRegistryAuth,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Change credentials' ``username``, ``password`` or ``name`` (the fields sent, at
    least one). Each cluster naming them pulls with the new ones from its next start."""
    active_iam = query_id(request, "active_iam")
    row = auths.update_registry_auth(
        app_state(request).ctx,
        principal,
        active_iam,
        registry_auth_id,
        body.username,
        body.password,
        name=body.name,
    )
    return ok(auths.registry_auth_view(row))


@router.delete("/v1/registry-auths/{registry_auth_id}", responses=documented(rs.DeletedEnvelope))
def delete_auth(
    registry_auth_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Delete credentials. Refused (409 REGISTRY_AUTH_IN_USE, naming them) while a
    template or a cluster that is not terminated names them."""
    active_iam = query_id(request, "active_iam")
    auths.delete_registry_auth(app_state(request).ctx, principal, active_iam, registry_auth_id)
    return ok({"id": registry_auth_id, "deleted": True})
