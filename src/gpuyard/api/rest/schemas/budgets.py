"""OpenAPI models of the budget routes (api/rest/tenancy/budgets.py): request bodies and responses.

Money is shown twice: in USD (a float, for people) and in integer micro-USD (exact,
for programs that add figures up).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from gpuyard.api.rest.schemas.responses import Meta, StrictIn, StrictOut
from gpuyard.core.billing.budget import MAX_USD, usd_to_micro
from gpuyard.core.input_rules import TEXT_PATTERN, check_text

Usd = Annotated[
    StrictInt | StrictFloat,
    Field(ge=-float(MAX_USD), le=float(MAX_USD), description="USD, at most 6 decimals"),
]


def _micro(value: int | float | None) -> int | None:
    return None if value is None else usd_to_micro(value)


# -- request bodies -----------------------------------------------------------------


class AddCredit(StrictIn):
    """A credit line: a top-up (positive) or a correction (negative), in USD."""

    amount: Usd
    note: Annotated[
        StrictStr, Field(max_length=500, json_schema_extra={"pattern": TEXT_PATTERN})
    ] = ""

    @field_validator("amount")
    @classmethod
    def _amount(cls, value: int | float) -> int | float:
        if usd_to_micro(value) == 0:
            raise ValueError("must not be 0")
        return value

    _note = field_validator("note")(check_text)

    @property
    def amount_micro(self) -> int:
        return usd_to_micro(self.amount)


class UpdateBudget(StrictIn):
    """The fields to change; ``monthly_budget`` or ``webhook_url`` null removes it.
    Switching ``billing_mode`` is the operator's."""

    billing_mode: Literal["postpaid", "prepaid"] | None = None
    monthly_budget: Annotated[StrictInt | StrictFloat, Field(gt=0, le=float(MAX_USD))] | None = None
    alert_percent: Annotated[StrictInt, Field(ge=1, le=100)] | None = None
    low_balance_hours: Annotated[StrictInt | StrictFloat, Field(ge=0, le=24 * 366)] | None = None
    webhook_url: Annotated[StrictStr, Field(min_length=1, max_length=2000)] | None = None

    @field_validator("monthly_budget")
    @classmethod
    def _budget(cls, value: int | float | None) -> int | float | None:
        if value is not None and usd_to_micro(value, field="monthly_budget") <= 0:
            raise ValueError("must be at least 0.000001")
        return value

    @model_validator(mode="after")
    def _not_nulls(self) -> UpdateBudget:
        for name in ("billing_mode", "alert_percent", "low_balance_hours"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} may not be null")
        return self

    @property
    def monthly_budget_micro(self) -> int | None:
        return _micro(self.monthly_budget)


# -- responses ----------------------------------------------------------------------


class Credit(StrictOut):
    id: int
    amount: float
    amount_micro: int
    note: str
    created_by_user_id: int | None
    created_at: str | None


class CreditAdded(StrictOut):
    credit: Credit
    balance: float
    balance_micro: int


class CreditAddedEnvelope(StrictOut):
    success: Literal[True]
    data: CreditAdded
    meta: Meta


class Debit(StrictOut):
    day: str
    amount: float
    amount_micro: int


class CreditLedger(StrictOut):
    billing_mode: Literal["postpaid", "prepaid"]
    since: str | None
    credits: list[Credit]
    debits: list[Debit]
    credits_total: float
    credits_total_micro: int
    debits_total: float
    debits_total_micro: int
    balance: float
    balance_micro: int


class CreditLedgerEnvelope(StrictOut):
    success: Literal[True]
    data: CreditLedger
    meta: Meta


class Budget(StrictOut):
    account_id: int
    billing_mode: Literal["postpaid", "prepaid"]
    prepaid_since: str | None
    monthly_budget: float | None
    alert_percent: int
    low_balance_hours: float
    webhook_url: str | None
    spent_this_month: float
    spent_this_month_micro: int
    balance: float | None
    balance_micro: int | None
    spend_rate_per_hour: float
    exhausts_at: str | None
    exhausted: bool
    exhausted_at: str | None
    alert: bool
    # Only in the answer of the PATCH that set a new webhook_url: shown once.
    webhook_secret: str | None = None


class BudgetEnvelope(StrictOut):
    success: Literal[True]
    data: Budget
    meta: Meta


class AccountEvent(StrictOut):
    id: int
    kind: str
    message: str
    detail: dict[str, Any]
    created_at: str | None


class AccountEventList(StrictOut):
    events: list[AccountEvent]


class AccountEventListEnvelope(StrictOut):
    success: Literal[True]
    data: AccountEventList
    meta: Meta


class WebhookDelivery(StrictOut):
    id: int
    event_id: int
    url: str
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    next_attempt_at: str | None
    last_error: str | None
    created_at: str | None
    delivered_at: str | None


class WebhookDeliveryList(StrictOut):
    deliveries: list[WebhookDelivery]


class WebhookDeliveryListEnvelope(StrictOut):
    success: Literal[True]
    data: WebhookDeliveryList
    meta: Meta
