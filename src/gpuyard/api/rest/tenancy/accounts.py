"""``/v1/accounts``: accounts (the operator creates, suspends and resumes them), their
invitations and members; ``/v1/invitations/{token}/accept`` (no key needed).

Routes under ``/v1/accounts/{account_id}`` act in that account through
``account_principal``: an account the caller is no member of is 404.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas import tenancy as ts
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import (
    account_principal,
    app_state,
    key_from_request,
    request_principal,
)
from gpuyard.core.roles import Permission
from gpuyard.services.tenancy import accounts, members
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["accounts"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)

Page = Annotated[int, Query(ge=1, le=1_000_000, description="1-based page")]
PerPage = Annotated[int, Query(ge=1, le=500, description="accounts per page")]
Token = Annotated[
    str,
    Path(
        min_length=8,
        max_length=100,
        pattern="^[A-Za-z0-9_-]+$",
        description="the invitation's token (gyi_...)",
    ),
]


# -- accounts -------------------------------------------------------------------------


@router.post("/v1/accounts", status_code=201, responses=documented(ts.AccountCreatedEnvelope, 201))
def create_account(
    body: ts.CreateAccount, request: Request, principal: Principal = Depends(request_principal)
) -> JSONResponse:
    """Create an account with a default project and its owner (operator only). An
    existing user with ``owner_email`` becomes its owner; either way the owner's first
    key for the account (scope write) is answered, once."""
    data = accounts.create_tenant(
        app_state(request).ctx, principal, body.name, body.owner_email, body.owner_name
    )
    return ok(data, status_code=201)


@router.get("/v1/accounts", responses=documented(ts.AccountListEnvelope))
def list_accounts(
    request: Request,
    page: Page = 1,
    per_page: PerPage = 50,
    principal: Principal = Depends(request_principal),
) -> JSONResponse:
    """Every account for the operator; anybody else, the accounts they are a member
    of. Oldest first, paged."""
    found = accounts.list_accounts(app_state(request).ctx, principal, page, per_page)
    return ok(
        {"accounts": found.accounts, "page": page, "per_page": per_page, "total": found.total}
    )


@router.get("/v1/accounts/{account_id}", responses=documented(ts.AccountEnvelope))
async def get_account(account_id: IdPath, request: Request) -> JSONResponse:
    """One account (its members and the operator; anybody else 404)."""
    await account_principal(request, account_id, None)
    state = app_state(request)
    return ok(await run_in_threadpool(accounts.get_account, state.ctx, account_id))


@router.patch("/v1/accounts/{account_id}", responses=documented(ts.AccountEnvelope))
async def update_account(
    account_id: IdPath, body: ts.UpdateAccount, request: Request
) -> JSONResponse:
    """Rename (owner, operator) and suspend or resume (operator) the account. A
    suspension stops its running clusters (volumes kept) and refuses new work with
    403 ACCOUNT_SUSPENDED; a resume lets its members start them again."""
    principal = await account_principal(request, account_id, None)
    state = app_state(request)
    data = await run_in_threadpool(
        accounts.update_account,
        state.ctx,
        principal,
        account_id,
        name=body.name,
        status=body.status,
        reason=body.reason,
    )
    return ok(data)


# -- invitations ------------------------------------------------------------------------


@router.post(
    "/v1/accounts/{account_id}/invitations",
    status_code=201,
    responses=documented(ts.InvitationCreatedEnvelope, 201),
)
async def create_invitation(
    account_id: IdPath, body: ts.CreateInvitation, request: Request
) -> JSONResponse:
    """Invite an e-mail address as ``role`` (only an owner invites owners). The token
    is answered once and is valid for 7 days."""
    principal = await account_principal(request, account_id, Permission.MANAGE_MEMBERS)
    state = app_state(request)
    made = await run_in_threadpool(
        members.create_invitation,
        state.ctx,
        principal,
        account_id,
        body.email,
        body.role,
        body.project_ids,
    )
    return ok({"invitation": made.invitation, "token": made.token}, status_code=201)


@router.get(
    "/v1/accounts/{account_id}/invitations", responses=documented(ts.InvitationListEnvelope)
)
async def list_invitations(account_id: IdPath, request: Request) -> JSONResponse:
    """The account's invitations, newest first, with their status."""
    await account_principal(request, account_id, Permission.MANAGE_MEMBERS)
    state = app_state(request)
    rows = await run_in_threadpool(members.list_invitations, state.ctx, account_id)
    return ok({"invitations": rows})


@router.delete(
    "/v1/accounts/{account_id}/invitations/{invitation_id}",
    responses=documented(ts.InvitationEnvelope),
)
async def revoke_invitation(
    account_id: IdPath, invitation_id: IdPath, request: Request
) -> JSONResponse:
    """Revoke an invitation not yet accepted (404 once accepted)."""
    principal = await account_principal(request, account_id, Permission.MANAGE_MEMBERS)
    state = app_state(request)
    data = await run_in_threadpool(
        members.revoke_invitation, state.ctx, principal, account_id, invitation_id
    )
    return ok(data)


@router.post(
    "/v1/invitations/{token}/accept",
    status_code=201,
    responses=documented(ts.InvitationAcceptedEnvelope, 201),
)
async def accept_invitation(
    token: Token, request: Request, body: ts.AcceptInvitation | None = None
) -> JSONResponse:
    """Accept an invitation, as the invited e-mail's user only. For an e-mail no user
    has yet, no key is needed: that user is created with a first key (scope write) for
    the account, shown once. An existing user accepts with an API key of their own
    (write scope, not restricted to an account or project; 401 without one, 403 for
    another user's) and gets only the membership (their keys select the account with
    ``X-Gpuyard-Account``). Unknown, used, revoked or expired tokens are 404
    INVITATION_NOT_FOUND (``details.reason`` says which); already a member 409
    CONFLICT."""
    caller = None
    if key_from_request(request):
        caller = await request_principal(request)
    state = app_state(request)
    data = await run_in_threadpool(
        members.accept_invitation,
        state.ctx,
        token,
        name=body.name if body is not None else None,
        caller=caller,
    )
    return ok(data, status_code=201)


# -- members -------------------------------------------------------------------------------


@router.get("/v1/accounts/{account_id}/members", responses=documented(ts.MemberListEnvelope))
async def list_members(account_id: IdPath, request: Request) -> JSONResponse:
    """The account's members (every role sees them), oldest first."""
    await account_principal(request, account_id, None)
    state = app_state(request)
    return ok({"members": await run_in_threadpool(members.list_members, state.ctx, account_id)})


@router.patch(
    "/v1/accounts/{account_id}/members/{member_id}", responses=documented(ts.MemberEnvelope)
)
async def change_role(
    account_id: IdPath, member_id: IdPath, body: ts.UpdateMember, request: Request
) -> JSONResponse:
    """Change a member's role (the caller must be allowed to grant the old and the new
    role; the last owner stays owner: 409)."""
    principal = await account_principal(request, account_id, Permission.MANAGE_MEMBERS)
    state = app_state(request)
    data = await run_in_threadpool(
        members.change_role, state.ctx, principal, account_id, member_id, body.role
    )
    state.keys.clear()  # the role is part of every cached principal of that user
    return ok(data)


@router.delete(
    "/v1/accounts/{account_id}/members/{member_id}",
    responses=documented(ts.MemberRemovedEnvelope),
)
async def remove_member(account_id: IdPath, member_id: IdPath, request: Request) -> JSONResponse:
    """Remove a membership (a member may leave; not the last owner). Every key that
    user made for this account is revoked at once."""
    principal = await account_principal(request, account_id, None)
    state = app_state(request)
    revoked = await run_in_threadpool(
        members.remove_member, state.ctx, principal, account_id, member_id
    )
    state.keys.clear()
    return ok({"id": member_id, "deleted": True, "keys_revoked": revoked})
