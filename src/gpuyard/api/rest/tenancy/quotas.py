"""``/v1/accounts/{account_id}/quotas``: an account's and its projects' limits and
usage (any member, the operator); setting the account's (the operator) and a
project's (the operator, the account's owners and admins). Another account is 404.

A create, start or scale that would pass a quota answers 403 QUOTA_EXCEEDED from the
cluster routes themselves (services/billing/quotas.py check_quotas)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas import quotas as qs
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import account_principal, app_state
from gpuyard.core.roles import Permission
from gpuyard.services.billing import quotas

router = APIRouter(tags=["quotas"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)


@router.get("/v1/accounts/{account_id}/quotas", responses=documented(qs.AccountQuotasEnvelope))
async def show_quotas(account_id: IdPath, request: Request) -> JSONResponse:
    """The account's limits and usage, and each of its projects' (those the caller
    may act in), oldest project first. A limit of null is no limit."""
    principal = await account_principal(request, account_id, None)
    state = app_state(request)
    return ok(await run_in_threadpool(quotas.show_quotas, state.ctx, principal, account_id))


@router.put("/v1/accounts/{account_id}/quotas", responses=documented(qs.QuotasSetEnvelope))
async def set_account_quotas(
    account_id: IdPath, body: qs.SetQuotas, request: Request
) -> JSONResponse:
    """Set the account's limits (the operator only): a field sent as a number sets
    it, as null removes it, left out keeps it. Recorded as audit event quota.set."""
    principal = await account_principal(request, account_id, None)
    state = app_state(request)
    data = await run_in_threadpool(
        quotas.set_quotas, state.ctx, principal, account_id, body.change()
    )
    return ok(data)


@router.put(
    "/v1/accounts/{account_id}/projects/{project_id}/quotas",
    responses=documented(qs.QuotasSetEnvelope),
)
async def set_project_quotas(
    account_id: IdPath, project_id: IdPath, body: qs.SetQuotas, request: Request
) -> JSONResponse:
    """Set a project's limits (the operator, the account's owners and admins); none
    may pass the account's limit of the same resource (400 naming the field)."""
    principal = await account_principal(request, account_id, Permission.MANAGE_PROJECTS)
    state = app_state(request)
    data = await run_in_threadpool(
        quotas.set_quotas, state.ctx, principal, account_id, body.change(), project_id
    )
    return ok(data)
