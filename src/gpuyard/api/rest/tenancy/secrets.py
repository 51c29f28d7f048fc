"""``/v1/secrets``: the acting account's named secrets, which clusters' env refers to
as ``{{ RUNPOD_SECRET_name }}``. Answers never hold a value;
services/tenancy/account_secrets.py says who may do what."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas import resources as rs
from gpuyard.api.rest.schemas import secrets as ss
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.tenancy import account_secrets as secrets
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["secrets"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)


@router.get("/v1/secrets", responses=documented(ss.SecretListEnvelope))
def list_secrets(
    request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """The account's secrets by name: names, descriptions and references, no values."""
    rows = secrets.list_secrets(app_state(request).ctx, principal)
    return ok({"secrets": [secrets.secret_view(r) for r in rows]})


@router.post("/v1/secrets", status_code=201, responses=documented(ss.SecretEnvelope, 201))
def create_secret(
    body: ss.CreateSecret, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Store a secret (its value encrypted). A cluster's env uses it as
    ``{{ RUNPOD_SECRET_<name> }}``; the value is put in when the container starts."""
    row = secrets.create_secret(
        app_state(request).ctx, principal, body.name, body.value, body.description
    )
    return ok(secrets.secret_view(row), status_code=201)


@router.get("/v1/secrets/{secret_id}", responses=documented(ss.SecretEnvelope))
def get_secret(
    secret_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    row = secrets.show_secret(app_state(request).ctx, principal, secret_id)
    return ok(secrets.secret_view(row))


@router.patch("/v1/secrets/{secret_id}", responses=documented(ss.SecretEnvelope))
def update_secret(
    secret_id: IdPath,
    body: ss.UpdateSecret,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """A new value and/or description. Clusters that use the secret get the new value
    at their next start (a running container keeps the one it started with)."""
    row = secrets.update_secret(
        app_state(request).ctx, principal, secret_id, body.value, body.description
    )
    return ok(secrets.secret_view(row))


@router.delete("/v1/secrets/{secret_id}", responses=documented(rs.DeletedEnvelope))
def delete_secret(
    secret_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Delete a secret. A cluster whose env still refers to it fails its next start
    with an error naming the secret."""
    secrets.delete_secret(app_state(request).ctx, principal, secret_id)
    return ok({"id": secret_id, "deleted": True})
