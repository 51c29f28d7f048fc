"""Whether an account may start new work: called inside the transaction that claims
capacity for a create, a start or a scale (after the claim, under the placement lock),
so two requests can never pass a check together.

An account that is suspended answers 403 ACCOUNT_SUSPENDED; one whose budget or
balance is spent 402 BUDGET_EXHAUSTED; a quota the new usage would pass 403
QUOTA_EXCEEDED (services/billing/quotas.py).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpuyard.core.errors import AccountSuspended, BudgetExhausted
from gpuyard.services.billing.quotas import check_quotas
from gpuyard.store.schema import Account


def refuse_closed_account(session: Session, account_id: int) -> None:
    """Raises AccountSuspended or BudgetExhausted when the account takes no new work.
    Where the work holds capacity, call it under the placement lock: a suspension or an
    exhaustion takes that lock before it lists what to stop, so either it sees the new
    work or the new work sees it. The account is read afresh (not from the session)."""
    account = session.get(Account, account_id, populate_existing=True)
    if account is None:
        return
    if account.status == "suspended":
        raise AccountSuspended(
            f"account {account_id} is suspended"
            + (f": {account.status_reason}" if account.status_reason else ""),
            {"account_id": account_id},
        )
    if account.exhausted_at is not None:
        what = "prepaid balance" if account.billing_mode == "prepaid" else "monthly budget"
        raise BudgetExhausted(
            f"the account's {what} is spent: add credit or raise the budget",
            {"account_id": account_id, "billing_mode": account.billing_mode},
        )


def admit(session: Session, account_id: int, project_id: int, cluster_id: str) -> None:
    """Raise unless the account may run cluster ``cluster_id`` as it is now stored
    (flushed, with its capacity claimed) in project ``project_id``."""
    refuse_closed_account(session, account_id)
    check_quotas(session, account_id, project_id, cluster_id)
