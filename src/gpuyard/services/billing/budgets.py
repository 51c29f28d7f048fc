"""Budgets, prepaid balances, credits and budget alerts of accounts.

Spend is read from the usage ledger (services/billing/metering.py), never kept apart: a
postpaid account's spend is its bill over the current UTC month, a prepaid account's
balance is the sum of its credits less its bill since it became prepaid. The spend
rate is the sum of its open usage intervals' rates (micro-USD per hour).

``enforce_budget`` is what the budget watch (reconciler/duties/budgets.py) runs at each
deadline: alerts (an account event, once per period, and a webhook), and at 100 % the
account is marked exhausted (new work answers 402 BUDGET_EXHAUSTED, see
services/billing/admission.py) and its running clusters are stopped, volumes kept, with the
reason in each cluster's events. A credit, a raised budget or a new month lifts the
mark when money is left again, in the same transaction as the change (or at the
watch's next check, for a new month).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuyard.core.billing.budget import (
    BILLING_MODES,
    POSTPAID,
    PREPAID,
    Standing,
    alert_threshold_micro,
    first_due,
    micro_to_usd,
    month_key,
    month_start,
    next_month_start,
)
from gpuyard.core.billing.ledger import SECONDS_PER_HOUR
from gpuyard.core.errors import Forbidden, NotFound, ValidationFailed
from gpuyard.services.billing import metering
from gpuyard.services.context import Context
from gpuyard.services.tenancy import webhooks
from gpuyard.services.tenancy.account_stops import RunningWork, running_work, stop_work
from gpuyard.services.tenancy.audit import record_audit
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.secrets import secret_box
from gpuyard.store.schema import (
    Account,
    AccountCredit,
    AccountEvent,
    Project,
    UsageInterval,
    WebhookDelivery,
)

BUDGET_ALERT = "budget.alert"
BUDGET_EXHAUSTED = "budget.exhausted"
BALANCE_LOW = "balance.low"
BALANCE_EXHAUSTED = "balance.exhausted"
SPENDING_RESUMED = "spending.resumed"
# A training cluster's auto-termination policy stopped or deleted it.
TRAINING_AUTO_TERMINATED = "training.auto_terminated"
# Account events that go to the webhook.
WEBHOOK_KINDS = frozenset(
    {BUDGET_ALERT, BUDGET_EXHAUSTED, BALANCE_LOW, BALANCE_EXHAUSTED, TRAINING_AUTO_TERMINATED}
)
MAX_LOW_BALANCE_HOURS = 24.0 * 366


# -- reads ---------------------------------------------------------------------------


def load_account(session: Session, account_id: int) -> Account:
    account = session.get(Account, account_id)
    if account is None:
        raise NotFound(f"account {account_id} not found", {"account_id": account_id})
    return account


def spend_rate_micro(session: Session, account_id: int) -> int:
    """What the account's open usage intervals bill per hour now (micro-USD)."""
    total = session.scalar(
        select(func.coalesce(func.sum(UsageInterval.rate_micro), 0))
        .join(Project, Project.id == UsageInterval.project_id)
        .where(Project.account_id == account_id, UsageInterval.ended_at.is_(None))
    )
    return int(total or 0)


def credits_micro(session: Session, account_id: int) -> tuple[int, int]:
    """The sum of the account's credit lines (micro-USD) and the latest line's id."""
    row = session.execute(
        select(
            func.coalesce(func.sum(AccountCredit.amount_micro), 0),
            func.coalesce(func.max(AccountCredit.id), 0),
        ).where(AccountCredit.account_id == account_id)
    ).one()
    return int(row[0]), int(row[1])


def spend_window(account: Account, now: datetime) -> datetime:
    """Where the spend that counts starts: the month (postpaid) or the switch to
    prepaid."""
    if account.billing_mode == PREPAID and account.prepaid_since is not None:
        return account.prepaid_since
    return month_start(now)


def standing(session: Session, account: Account, now: datetime) -> Standing:
    """The account's money at ``now`` (core/billing/budget.py)."""
    since = spend_window(account, now)
    spent = metering.bill(
        session, account.id, None, since, now, metering.GroupBy.CLUSTER, now
    ).total_micro
    if account.billing_mode == PREPAID:
        limit: int | None = credits_micro(session, account.id)[0]
    else:
        limit = account.monthly_budget_micro
    return Standing(
        mode=account.billing_mode,
        limit_micro=limit,
        spent_micro=spent,
        rate_micro=spend_rate_micro(session, account.id),
        alert_percent=account.alert_percent,
        low_balance_hours=account.low_balance_hours,
    )


def _period(session: Session, account: Account, now: datetime) -> str:
    """What makes an alert new: the month and budget (postpaid), the latest credit
    and the switch to prepaid (prepaid)."""
    if account.billing_mode == PREPAID:
        since = account.prepaid_since.isoformat() if account.prepaid_since else "-"
        return f"{credits_micro(session, account.id)[1]}:{since}"
    return f"{month_key(now)}:{account.monthly_budget_micro}:{account.alert_percent}"


def _kinds(account: Account) -> tuple[str, str]:
    if account.billing_mode == PREPAID:
        return BALANCE_LOW, BALANCE_EXHAUSTED
    return BUDGET_ALERT, BUDGET_EXHAUSTED


def _dedupe(account: Account, kind: str, period: str) -> str:
    return f"{account.id}:{kind}:{period}"[:200]


# -- account events ------------------------------------------------------------------


def record_account_event(
    session: Session,
    account: Account,
    kind: str,
    message: str,
    now: datetime,
    *,
    detail: dict[str, Any] | None = None,
    dedupe: str | None = None,
) -> AccountEvent | None:
    """Add an account event (and a webhook delivery for alert kinds); None when one
    with ``dedupe`` exists already (an alert fires once per period)."""
    if dedupe is not None:
        seen = session.scalar(select(AccountEvent.id).where(AccountEvent.dedupe == dedupe))
        if seen is not None:
            return None
    event = AccountEvent(
        account_id=account.id,
        kind=kind,
        message=message[:1000],
        detail=detail or {},
        dedupe=dedupe,
        created_at=now,
    )
    try:
        with session.begin_nested():
            session.add(event)
            session.flush()
    except IntegrityError:  # recorded meanwhile by another writer
        return None
    if kind in WEBHOOK_KINDS:
        webhooks.enqueue(session, account, event, now)
    return event


def _figures(s: Standing) -> dict[str, Any]:
    return {
        "billing_mode": s.mode,
        "limit": None if s.limit_micro is None else micro_to_usd(s.limit_micro),
        "spent": micro_to_usd(s.spent_micro),
        "remaining": None if s.remaining_micro is None else micro_to_usd(s.remaining_micro),
        "spend_rate_per_hour": micro_to_usd(s.rate_micro),
    }


# -- the watch's check -----------------------------------------------------------------


@dataclass
class Check:
    """What one check of an account did, and when it should be checked again."""

    account_id: int
    recheck_at: datetime | None = None
    exhausted: bool = False
    events: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)


def enforce_budget(ctx: Context, account_id: int) -> Check:
    """Bring the account's alert and exhaustion up to date at ``ctx.clock.now()``:
    record due alerts, mark a spent account exhausted and stop its running clusters
    (or lift the mark when money is left again). Returns when to check next: the
    earliest future crossing at the current rate (or a new month)."""
    now = ctx.clock.now()
    check = Check(account_id)
    to_stop = RunningWork()
    with ctx.transaction() as session:
        account = session.get(Account, account_id)
        if account is None:
            return check
        s = standing(session, account, now)
        period = _period(session, account, now)
        alert_kind, exhausted_kind = _kinds(account)
        figures = _figures(s)
        if s.exhausted:
            check.exhausted = True
            if account.exhausted_at is None:
                account.exhausted_at = now
            what = "prepaid balance" if account.billing_mode == PREPAID else "monthly budget"
            event = record_account_event(
                session,
                account,
                exhausted_kind,
                f"the {what} is spent: running clusters are stopped (volumes kept) and "
                "new work is refused until credit is added",
                now,
                detail=figures,
                dedupe=_dedupe(account, exhausted_kind, period),
            )
            if event is not None:
                check.events.append(exhausted_kind)
            to_stop = running_work(session, account_id)
        else:
            if account.exhausted_at is not None:
                account.exhausted_at = None
                record_account_event(
                    session, account, SPENDING_RESUMED, "money is left again", now, detail=figures
                )
                check.events.append(SPENDING_RESUMED)
            alert_dedupe = _dedupe(account, alert_kind, period)
            alerted = (
                session.scalar(select(AccountEvent.id).where(AccountEvent.dedupe == alert_dedupe))
                is not None
            )
            if not alerted and s.alerting():
                record_account_event(
                    session,
                    account,
                    alert_kind,
                    _alert_message(s),
                    now,
                    detail=figures,
                    dedupe=alert_dedupe,
                )
                check.events.append(alert_kind)
                alerted = True
            new_month = next_month_start(now) if account.billing_mode == POSTPAID else None
            check.recheck_at = first_due(
                s.exhausts_at(now),
                None if alerted else s.alert_at(now),
                new_month if s.limited else None,
            )
        if s.exhausted and account.billing_mode == POSTPAID and s.limited:
            check.recheck_at = next_month_start(now)
    reason = (
        "budget exhausted: the account's "
        + ("prepaid balance" if s.mode == PREPAID else "monthly budget")
        + " is spent (volume kept; add credit or raise the budget, then start it again)"
    )
    check.stopped = stop_work(ctx, account_id, to_stop, reason)
    if check.events:
        ctx.wake()
    return check


def _alert_message(s: Standing) -> str:
    if s.mode == PREPAID:
        hours = s.hours_left()
        left = "" if hours is None else f" (about {hours:.1f} h at the current rate)"
        remaining = micro_to_usd(s.remaining_micro or 0)
        return f"the prepaid balance is low: ${remaining:.2f} left{left}"
    assert s.limit_micro is not None
    percent = 100 * s.spent_micro / s.limit_micro if s.limit_micro else 100.0
    return (
        f"{percent:.0f}% of the monthly budget is spent "
        f"(${micro_to_usd(s.spent_micro):.2f} of ${micro_to_usd(s.limit_micro):.2f})"
    )


def _lift_if_funded(session: Session, account: Account, now: datetime) -> bool:
    """Clear ``exhausted_at`` when money is left again (same transaction as the
    change that left it); True when lifted."""
    if account.exhausted_at is None:
        return False
    s = standing(session, account, now)
    if s.exhausted:
        return False
    account.exhausted_at = None
    record_account_event(
        session, account, SPENDING_RESUMED, "money is left again", now, detail=_figures(s)
    )
    return True


# -- credits ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CreditAdded:
    credit: AccountCredit
    balance_micro: int
    lifted: bool


def add_credit(
    ctx: Context, principal: Principal, account_id: int, amount_micro: int, note: str
) -> CreditAdded:
    """A credit line (a top-up, or a negative correction) added by the operator; the
    balance after it. Lifts a spent account's mark when money is left."""
    if not principal.operator:
        raise Forbidden("only the installation's operator adds credit")
    if amount_micro == 0:
        raise ValidationFailed("amount", "must not be 0")
    now = ctx.clock.now()
    with ctx.transaction() as session:
        account = load_account(session, account_id)
        row = AccountCredit(
            account_id=account_id,
            amount_micro=amount_micro,
            note=note,
            created_by_user_id=principal.user_id or None,
            created_at=now,
        )
        session.add(row)
        session.flush()
        lifted = account.billing_mode == PREPAID and _lift_if_funded(session, account, now)
        balance = balance_micro(session, account, now)
        record_audit(
            session,
            principal,
            account_id=account_id,
            action="credit.add",
            target_type="credit",
            target_id=row.id,
            detail={"amount": micro_to_usd(amount_micro), "note": note, "lifted": lifted},
            now=now,
        )
        session.expunge(row)
    ctx.wake()
    return CreditAdded(row, balance, lifted)


def balance_micro(session: Session, account: Account, now: datetime) -> int:
    """Credits less the spend since the account became prepaid (its creation when
    never prepaid: the figure a switch to prepaid would start from is the credits)."""
    credits = credits_micro(session, account.id)[0]
    if account.billing_mode != PREPAID or account.prepaid_since is None:
        return credits
    spent = metering.bill(
        session, account.id, None, account.prepaid_since, now, metering.GroupBy.CLUSTER, now
    ).total_micro
    return credits - spent


@dataclass(frozen=True)
class Debit:
    day: str
    amount_micro: int


@dataclass(frozen=True)
class Ledger:
    billing_mode: str
    credits: list[AccountCredit]
    debits: list[Debit]
    since: datetime
    credits_micro: int
    debits_micro: int
    balance_micro: int


def ledger(ctx: Context, account_id: int) -> Ledger:
    """The account's credit lines (newest first) and its debits: the spend per UTC day
    since it became prepaid (postpaid: this month). The debits sum exactly to the
    bill's total: each day is the growth of the running total rounded down, so the
    rounding of the days never adds up to more (or less) than the bill's."""
    now = ctx.clock.now()
    with ctx.read() as session:
        account = load_account(session, account_id)
        since = spend_window(account, now)
        rows = list(
            session.scalars(
                select(AccountCredit)
                .where(AccountCredit.account_id == account_id)
                .order_by(AccountCredit.id.desc())
            )
        )
        bill = metering.bill(session, account_id, None, since, now, metering.GroupBy.DAY, now)
        credits = sum(r.amount_micro for r in rows)
    debits: list[Debit] = []
    running, shown = 0, 0
    for line in bill.lines:
        running += sum(line.amounts.values())
        total = running // SECONDS_PER_HOUR
        debits.append(Debit(line.key, total - shown))
        shown = total
    assert shown == bill.total_micro
    balance = credits - shown if account.billing_mode == PREPAID else credits
    return Ledger(account.billing_mode, rows, debits, since, credits, shown, balance)


# -- budget settings -------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetChange:
    """Fields of ``PATCH .../budget``; ``fields`` says which were sent (a None there
    clears the budget or the webhook)."""

    fields: frozenset[str]
    billing_mode: str | None = None
    monthly_budget_micro: int | None = None
    alert_percent: int | None = None
    low_balance_hours: float | None = None
    webhook_url: str | None = None


@dataclass(frozen=True)
class BudgetView:
    account: Account
    standing: Standing
    spent_this_month_micro: int
    balance_micro: int | None
    exhausts_at: datetime | None
    alert: bool
    webhook_secret: str | None = None


def budget_view(ctx: Context, account_id: int) -> BudgetView:
    now = ctx.clock.now()
    with ctx.read() as session:
        return _view(session, load_account(session, account_id), now)


def _view(
    session: Session, account: Account, now: datetime, secret: str | None = None
) -> BudgetView:
    s = standing(session, account, now)
    if account.billing_mode == POSTPAID:
        month = s.spent_micro
    else:
        month = metering.bill(
            session, account.id, None, month_start(now), now, metering.GroupBy.CLUSTER, now
        ).total_micro
    session.expunge(account)
    return BudgetView(
        account=account,
        standing=s,
        spent_this_month_micro=month,
        balance_micro=s.remaining_micro if account.billing_mode == PREPAID else None,
        exhausts_at=None if account.exhausted_at is not None else s.exhausts_at(now),
        alert=s.alerting(),
        webhook_secret=secret,
    )


def _validate(change: BudgetChange) -> None:
    """Raises ValidationFailed naming the first field of ``change`` out of range."""
    sent = change.fields
    if "billing_mode" in sent and change.billing_mode not in BILLING_MODES:
        raise ValidationFailed("billing_mode", f"one of {', '.join(BILLING_MODES)}")
    percent = change.alert_percent
    if "alert_percent" in sent and (percent is None or not 1 <= percent <= 100):
        raise ValidationFailed("alert_percent", "must be 1 to 100")
    hours = change.low_balance_hours
    if "low_balance_hours" in sent and (hours is None or not 0 <= hours <= MAX_LOW_BALANCE_HOURS):
        raise ValidationFailed("low_balance_hours", f"must be 0 to {MAX_LOW_BALANCE_HOURS:g}")
    budget = change.monthly_budget_micro
    if "monthly_budget_micro" in sent and budget is not None and budget <= 0:
        raise ValidationFailed("monthly_budget", "must be more than 0 (or null: no budget)")


def update_budget(
    ctx: Context, principal: Principal, account_id: int, change: BudgetChange
) -> BudgetView:
    """Apply ``change`` (MANAGE_BUDGET is checked by the caller; switching the billing
    mode is the operator's). A new webhook URL is checked (services/tenancy/webhooks.py) and
    gets a new secret, answered once in the view. Audited as ``budget.update``."""
    _validate(change)
    secret: str | None = None
    if "webhook_url" in change.fields and change.webhook_url is not None:
        # Resolved before the transaction: a slow DNS answer holds no write lock.
        webhooks.check_target(change.webhook_url, allow_private=ctx.settings.webhook_allow_private)
        secret = webhooks.new_secret()
    now = ctx.clock.now()
    with ctx.transaction() as session:
        account = load_account(session, account_id)
        changed: dict[str, Any] = {}
        if "billing_mode" in change.fields and change.billing_mode != account.billing_mode:
            if not principal.operator:
                raise Forbidden("only the installation's operator switches the billing mode")
            account.billing_mode = str(change.billing_mode)
            if account.billing_mode == PREPAID:
                account.prepaid_since = now
            changed["billing_mode"] = account.billing_mode
        if "monthly_budget_micro" in change.fields:
            account.monthly_budget_micro = change.monthly_budget_micro
            changed["monthly_budget"] = (
                None
                if change.monthly_budget_micro is None
                else micro_to_usd(change.monthly_budget_micro)
            )
        if "alert_percent" in change.fields and change.alert_percent is not None:
            account.alert_percent = change.alert_percent
            changed["alert_percent"] = change.alert_percent
        if "low_balance_hours" in change.fields and change.low_balance_hours is not None:
            account.low_balance_hours = change.low_balance_hours
            changed["low_balance_hours"] = change.low_balance_hours
        if "webhook_url" in change.fields:
            account.webhook_url = change.webhook_url
            account.webhook_secret = (
                secret_box(ctx.settings).seal(secret) if secret is not None else None
            )
            changed["webhook_url"] = change.webhook_url
        session.flush()
        if account.exhausted_at is not None:
            changed["lifted"] = _lift_if_funded(session, account, now)
        record_audit(
            session,
            principal,
            account_id=account_id,
            action="budget.update",
            target_type="account",
            target_id=account_id,
            detail=changed,
            now=now,
        )
        session.flush()
        view = _view(session, account, now, secret)
    ctx.wake()
    return view


# -- lists -------------------------------------------------------------------------------


def list_events(
    ctx: Context, account_id: int, limit: int = 100, before_id: int | None = None
) -> list[AccountEvent]:
    """The account's events, newest first."""
    with ctx.read() as session:
        load_account(session, account_id)
        q = select(AccountEvent).where(AccountEvent.account_id == account_id)
        if before_id is not None:
            q = q.where(AccountEvent.id < before_id)
        rows = list(session.scalars(q.order_by(AccountEvent.id.desc()).limit(limit)))
        session.expunge_all()
        return rows


def list_deliveries(ctx: Context, account_id: int, limit: int = 100) -> list[WebhookDelivery]:
    """The account's webhook deliveries, newest first."""
    with ctx.read() as session:
        load_account(session, account_id)
        rows = list(
            session.scalars(
                select(WebhookDelivery)
                .where(WebhookDelivery.account_id == account_id)
                .order_by(WebhookDelivery.id.desc())
                .limit(limit)
            )
        )
        session.expunge_all()
        return rows


def alert_threshold_of(account: Account) -> int | None:
    """The postpaid spend (micro-USD) at which the alert fires (None: no budget)."""
    if account.monthly_budget_micro is None:
        return None
    return alert_threshold_micro(account.monthly_budget_micro, account.alert_percent)
