"""Budgets, prepaid balance, credits, account events and webhook deliveries, under
``/v1/accounts/{account_id}`` (another account's is 404; the operator acts in all).

- ``POST .../credits`` (the operator): a credit line; answers it and the new balance.
- ``GET .../credits`` (read_billing): the credit lines and the daily debits.
- ``GET .../budget`` (read_billing), ``PATCH .../budget`` (manage_budget; switching the
  billing mode is the operator's): the settings and where the account stands.
- ``GET .../events`` (read_billing): account events, newest first.
- ``GET .../webhook-deliveries`` (manage_budget).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas import budgets as bs
from gpuyard.api.rest.schemas.resource_params import query_id
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import account_principal, app_state
from gpuyard.core.billing.budget import micro_to_usd
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.roles import Permission
from gpuyard.services.access.resource_util import iso
from gpuyard.services.billing import budgets
from gpuyard.store.schema import AccountCredit, AccountEvent, WebhookDelivery

router = APIRouter(tags=["budgets"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)

_MAX_LIMIT = 500


def credit_view(c: AccountCredit) -> dict[str, Any]:
    return {
        "id": c.id,
        "amount": micro_to_usd(c.amount_micro),
        "amount_micro": c.amount_micro,
        "note": c.note,
        "created_by_user_id": c.created_by_user_id,
        "created_at": iso(c.created_at),
    }


def debit_view(d: budgets.Debit) -> dict[str, Any]:
    return {"day": d.day, "amount": micro_to_usd(d.amount_micro), "amount_micro": d.amount_micro}


def budget_view(v: budgets.BudgetView) -> dict[str, Any]:
    a, s = v.account, v.standing
    out: dict[str, Any] = {
        "account_id": a.id,
        "billing_mode": a.billing_mode,
        "prepaid_since": iso(a.prepaid_since),
        "monthly_budget": (
            None if a.monthly_budget_micro is None else micro_to_usd(a.monthly_budget_micro)
        ),
        "alert_percent": a.alert_percent,
        "low_balance_hours": a.low_balance_hours,
        "webhook_url": a.webhook_url,
        "spent_this_month": micro_to_usd(v.spent_this_month_micro),
        "spent_this_month_micro": v.spent_this_month_micro,
        "balance": None if v.balance_micro is None else micro_to_usd(v.balance_micro),
        "balance_micro": v.balance_micro,
        "spend_rate_per_hour": micro_to_usd(s.rate_micro),
        "exhausts_at": iso(v.exhausts_at),
        "exhausted": a.exhausted_at is not None,
        "exhausted_at": iso(a.exhausted_at),
        "alert": v.alert,
    }
    if v.webhook_secret is not None:
        out["webhook_secret"] = v.webhook_secret
    return out


def event_view(e: AccountEvent) -> dict[str, Any]:
    return {
        "id": e.id,
        "kind": e.kind,
        "message": e.message,
        "detail": e.detail or {},
        "created_at": iso(e.created_at),
    }


def delivery_view(d: WebhookDelivery) -> dict[str, Any]:
    return {
        "id": d.id,
        "event_id": d.event_id,
        "url": d.url,
        "status": d.status,
        "attempts": d.attempts,
        "next_attempt_at": iso(d.next_attempt_at) if d.status == "pending" else None,
        "last_error": d.last_error,
        "created_at": iso(d.created_at),
        "delivered_at": iso(d.delivered_at),
    }


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None or raw == "":
        return 100
    if not raw.isdigit() or not 1 <= int(raw) <= _MAX_LIMIT:
        raise ValidationFailed("limit", f"must be an integer from 1 to {_MAX_LIMIT}")
    return int(raw)


@router.post(
    "/v1/accounts/{account_id}/credits",
    status_code=201,
    responses=documented(bs.CreditAddedEnvelope, 201),
)
async def add_credit(account_id: IdPath, body: bs.AddCredit, request: Request) -> JSONResponse:
    """Add a credit line to the account's prepaid ledger: a top-up (``amount`` > 0,
    USD, at most 6 decimals) or a correction (< 0). The operator's alone. A spent
    account takes new work again once its balance is positive."""
    principal = await account_principal(request, account_id, Permission.READ_BILLING)
    ctx = app_state(request).ctx
    added = await run_in_threadpool(
        budgets.add_credit, ctx, principal, account_id, body.amount_micro, body.note
    )
    return ok(
        {
            "credit": credit_view(added.credit),
            "balance": micro_to_usd(added.balance_micro),
            "balance_micro": added.balance_micro,
        },
        status_code=201,
    )


@router.get("/v1/accounts/{account_id}/credits", responses=documented(bs.CreditLedgerEnvelope))
async def list_credits(account_id: IdPath, request: Request) -> JSONResponse:
    """The credit lines (newest first) and the debits: the spend per UTC day since the
    account became prepaid (postpaid: this month). The debits add up exactly to the
    bill of that period; ``balance`` is the credits less the debits (postpaid: the
    credits)."""
    await account_principal(request, account_id, Permission.READ_BILLING)
    ctx = app_state(request).ctx
    ledger = await run_in_threadpool(budgets.ledger, ctx, account_id)
    return ok(
        {
            "billing_mode": ledger.billing_mode,
            "since": iso(ledger.since),
            "credits": [credit_view(c) for c in ledger.credits],
            "debits": [
                {
                    "day": d.day,
                    "amount": micro_to_usd(d.amount_micro),
                    "amount_micro": d.amount_micro,
                }
                for d in ledger.debits
            ],
            "credits_total": micro_to_usd(ledger.credits_micro),
            "credits_total_micro": ledger.credits_micro,
            "debits_total": micro_to_usd(ledger.debits_micro),
            "debits_total_micro": ledger.debits_micro,
            "balance": micro_to_usd(ledger.balance_micro),
            "balance_micro": ledger.balance_micro,
        }
    )


@router.get("/v1/accounts/{account_id}/budget", responses=documented(bs.BudgetEnvelope))
async def get_budget(account_id: IdPath, request: Request) -> JSONResponse:
    """The account's budget settings and where it stands: spend this month, balance
    (prepaid), spend rate, when the budget or balance runs out at that rate, whether
    it is spent (new work refused with 402) and whether the alert holds."""
    await account_principal(request, account_id, Permission.READ_BILLING)
    view = await run_in_threadpool(budgets.budget_view, app_state(request).ctx, account_id)
    return ok(budget_view(view))


@router.patch("/v1/accounts/{account_id}/budget", responses=documented(bs.BudgetEnvelope))
async def update_budget(
    account_id: IdPath, body: bs.UpdateBudget, request: Request
) -> JSONResponse:
    """Change the monthly budget (USD; null: none), the alert percentage, the
    low-balance warning (hours of spend left) or the webhook (null: none). A new
    ``webhook_url`` must resolve to public addresses (unless the operator allows
    private ones) and gets a new signing secret, answered once as ``webhook_secret``.
    ``billing_mode`` (postpaid or prepaid) is the operator's to switch."""
    principal = await account_principal(request, account_id, Permission.MANAGE_BUDGET)
    sent = body.model_fields_set
    change = budgets.BudgetChange(
        fields=frozenset(
            "monthly_budget_micro" if name == "monthly_budget" else name for name in sent
        ),
        billing_mode=body.billing_mode,
        monthly_budget_micro=body.monthly_budget_micro,
        alert_percent=body.alert_percent,
        low_balance_hours=(
            None if body.low_balance_hours is None else float(body.low_balance_hours)
        ),
        webhook_url=body.webhook_url,
    )
    ctx = app_state(request).ctx
    view = await run_in_threadpool(budgets.update_budget, ctx, principal, account_id, change)
    return ok(budget_view(view))


@router.get("/v1/accounts/{account_id}/events", responses=documented(bs.AccountEventListEnvelope))
async def list_account_events(account_id: IdPath, request: Request) -> JSONResponse:
    """The account's events (budget alerts, spending stopped and resumed), newest
    first: at most ``limit`` (default 100), before ``before_id`` to page."""
    await account_principal(request, account_id, Permission.READ_BILLING)
    limit, before = _limit(request), query_id(request, "before_id")
    rows = await run_in_threadpool(
        budgets.list_events, app_state(request).ctx, account_id, limit, before
    )
    return ok({"events": [event_view(e) for e in rows]})


@router.get(
    "/v1/accounts/{account_id}/webhook-deliveries",
    responses=documented(bs.WebhookDeliveryListEnvelope),
)
async def list_webhook_deliveries(account_id: IdPath, request: Request) -> JSONResponse:
    """The account's webhook deliveries, newest first (at most ``limit``)."""
    await account_principal(request, account_id, Permission.MANAGE_BUDGET)
    rows = await run_in_threadpool(
        budgets.list_deliveries, app_state(request).ctx, account_id, _limit(request)
    )
    return ok({"deliveries": [delivery_view(d) for d in rows]})
