"""The budget watch: fires budget alerts and stops spending at the crossing, and sends
the webhooks of account events.

Spend grows linearly between changes of an account's open usage intervals, so each
account's next crossing (alert, exhaustion, or a new month for a postpaid budget) is a
deadline computed from its spend rate (services/billing/budgets.py ``enforce_budget``). The
reconciler sleeps no longer than until the earliest deadline (``seconds_until_next``),
so a stop fires within about a second of the crossing, not on a polling interval.

Each pass reads a cheap fingerprint of every watched account — its settings, its
credits and the set of its open usage intervals (count, rate sum, newest id: a create,
start, stop or rate change alters it) — and checks again only the accounts whose
fingerprint changed or whose deadline came. An account whose check fails is retried on
the next pass and never holds up the others.

Due webhook deliveries are handed to ``dispatch`` (the reconciler's work queue; by
default sent in this thread), and the next retry is one of the deadlines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, or_, select

from gpuyard.core.billing.budget import PREPAID, first_due
from gpuyard.services.billing.budgets import Check, enforce_budget
from gpuyard.services.context import Context
from gpuyard.services.tenancy import webhooks
from gpuyard.store.schema import Account, AccountCredit, Project, UsageInterval

log = logging.getLogger(__name__)


@dataclass
class _Plan:
    fingerprint: Hashable
    recheck_at: datetime | None


class BudgetWatch:
    def __init__(
        self,
        ctx: Context,
        *,
        dispatch: Callable[[int], None] | None = None,
        on_check: Callable[[Check], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.dispatch = dispatch or (lambda delivery_id: webhooks.deliver(ctx, delivery_id))
        self.on_check = on_check
        self.next_due: datetime | None = None
        self._plans: dict[int, _Plan] = {}

    def seconds_until_next(self) -> float | None:
        if self.next_due is None:
            return None
        return max(0.0, (self.next_due - self.ctx.clock.now()).total_seconds())

    def forget(self) -> None:
        """Check every account again on the next run (after a duty handover)."""
        self._plans.clear()

    def run(self) -> list[Check]:
        """Check the accounts that changed or whose deadline came; dispatch the due
        webhook deliveries; remember the next deadline."""
        fingerprints = self._fingerprints()
        now = self.ctx.clock.now()
        checks: list[Check] = []
        for account_id in [a for a in self._plans if a not in fingerprints]:
            del self._plans[account_id]
        for account_id, fingerprint in fingerprints.items():
            plan = self._plans.get(account_id)
            due = plan is not None and plan.recheck_at is not None and plan.recheck_at <= now
            if plan is not None and plan.fingerprint == fingerprint and not due:
                continue
            try:
                check = enforce_budget(self.ctx, account_id)
            except Exception:  # this account's trouble is its own; retried next pass
                log.exception("budget check of account %s failed", account_id)
                self._plans.pop(account_id, None)
                continue
            self._plans[account_id] = _Plan(fingerprint, check.recheck_at)
            checks.append(check)
            if self.on_check is not None:
                self.on_check(check)
        for delivery_id in webhooks.due_deliveries(self.ctx):
            self.dispatch(delivery_id)
        self.next_due = first_due(
            webhooks.next_due(self.ctx), *(p.recheck_at for p in self._plans.values())
        )
        return checks

    def _fingerprints(self) -> dict[int, Hashable]:
        """Every account with a budget, a prepaid balance or spending stopped, and what
        its deadlines depend on."""
        with self.ctx.read() as session:
            accounts = list(
                session.execute(
                    select(
                        Account.id,
                        Account.billing_mode,
                        Account.prepaid_since,
                        Account.monthly_budget_micro,
                        Account.alert_percent,
                        Account.low_balance_hours,
                        Account.exhausted_at,
                    ).where(
                        or_(
                            Account.billing_mode == PREPAID,
                            Account.monthly_budget_micro.is_not(None),
                            Account.exhausted_at.is_not(None),
                        )
                    )
                )
            )
            if not accounts:
                return {}
            ids = [row.id for row in accounts]
            open_intervals = {
                row[0]: tuple(row[1:])
                for row in session.execute(
                    select(
                        Project.account_id,
                        func.count(UsageInterval.id),
                        func.sum(UsageInterval.rate_micro),
                        func.max(UsageInterval.id),
                    )
                    .join(Project, Project.id == UsageInterval.project_id)
                    .where(UsageInterval.ended_at.is_(None), Project.account_id.in_(ids))
                    .group_by(Project.account_id)
                )
            }
            credits = {
                row[0]: tuple(row[1:])
                for row in session.execute(
                    select(
                        AccountCredit.account_id,
                        func.count(AccountCredit.id),
                        func.sum(AccountCredit.amount_micro),
                    )
                    .where(AccountCredit.account_id.in_(ids))
                    .group_by(AccountCredit.account_id)
                )
            }
        return {
            row.id: (tuple(row), open_intervals.get(row.id), credits.get(row.id))
            for row in accounts
        }
