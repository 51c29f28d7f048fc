"""``/v1/me`` (the caller and their memberships) and ``/v1/api-keys`` (the caller's
keys in the acting account; every key of it for those who manage its members)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas import tenancy as ts
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal, request_principal
from gpuyard.services.tenancy import api_keys, members
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["me"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)


@router.get("/v1/me", responses=documented(ts.MeEnvelope))
def me(request: Request, principal: Principal = Depends(request_principal)) -> JSONResponse:
    """Who the key belongs to, the membership the request acts through (the account
    chosen by ``X-Gpuyard-Account`` / ``active_iam``, else the key's) and every
    membership of the user."""
    return ok(members.me_view(app_state(request).ctx, principal))


@router.get("/v1/api-keys", responses=documented(ts.ApiKeyListEnvelope))
def list_api_keys(
    request: Request,
    all_: Annotated[
        bool, Query(alias="all", description="every key of the account (MANAGE_MEMBERS)")
    ] = False,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """The caller's live keys for the acting account (``all=true``: everyone's)."""
    rows = api_keys.list_keys(app_state(request).ctx, principal, all_)
    return ok({"api_keys": rows})


@router.post("/v1/api-keys", status_code=201, responses=documented(ts.ApiKeyCreatedEnvelope, 201))
def create_api_key(
    body: ts.CreateApiKey, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """A new key of the caller for the acting account, shown once. ``project_id``
    restricts it to that project (and the account); ``restrict_to_account`` to the
    account. Scope admin is the operator's. A key never reaches further than the key
    that made it."""
    data = api_keys.create_key(
        app_state(request).ctx,
        principal,
        name=body.name,
        scope=body.scope,
        restrict_to_account=body.restrict_to_account,
        project_id=body.project_id,
    )
    return ok(data, status_code=201)


@router.delete("/v1/api-keys/{key_id}", responses=documented(ts.ApiKeyEnvelope))
def revoke_api_key(
    key_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Revoke a key: the caller's own, or any key of the account with MANAGE_MEMBERS.
    It is refused at once by this server (other replicas within seconds)."""
    state = app_state(request)
    data = api_keys.revoke_key(state.ctx, principal, key_id)
    state.keys.clear()
    return ok(data)
