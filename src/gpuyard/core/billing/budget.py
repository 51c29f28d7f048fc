"""Budget and prepaid-balance arithmetic: what is left, when it runs out, when to alert.

Pure integers where money is concerned: amounts are micro-USD, spend rates micro-USD
per hour (the usage ledger's units, core/billing/ledger.py). A deadline is the first whole
second at which the ledger's spend reaches a threshold at the current rate; the
reconciler sleeps until the earliest one (reconciler/duties/budgets.py), so a stop fires
within about a second of the crossing instead of on a polling interval.

Two kinds of account:

- **postpaid** with a ``monthly_budget_micro``: the limit is the budget, the spend is
  the current UTC calendar month's; an alert at ``alert_percent`` of the budget.
- **prepaid**: the limit is the sum of the credits, the spend is everything since the
  account became prepaid; an alert when the balance lasts less than
  ``low_balance_hours`` at the current rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation

from gpuyard.core.billing.ledger import MICRO, SECONDS_PER_HOUR

POSTPAID = "postpaid"
PREPAID = "prepaid"
BILLING_MODES = (POSTPAID, PREPAID)

# Largest amount one credit (or a budget) may carry: $1e12, far below 2**63 micro-USD.
MAX_USD = Decimal(10) ** 12


def usd_to_micro(value: Decimal | float | int | str, *, field: str = "amount") -> int:
    """An amount in USD (at most 6 decimals) as exact integer micro-USD. Raises
    ValueError naming the problem (NaN, infinity, too many decimals, too large)."""
    try:
        d = value if isinstance(value, Decimal) else Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{field} must be a number of USD") from None
    if not d.is_finite():
        raise ValueError(f"{field} must be a finite number of USD")
    if abs(d) > MAX_USD:
        raise ValueError(f"{field} must be at most {MAX_USD} USD")
    scaled = d * MICRO
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{field} has more than 6 decimals (micro-USD is the unit)")
    return int(scaled)


def micro_to_usd(micro_usd: int) -> float:
    return micro_usd / MICRO


def month_start(now: datetime) -> datetime:
    """The first instant of ``now``'s UTC calendar month."""
    t = now.astimezone(UTC)
    return t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month_start(now: datetime) -> datetime:
    start = month_start(now)
    return (start + timedelta(days=32)).replace(day=1)


def month_key(now: datetime) -> str:
    """``YYYY-MM`` of ``now`` in UTC: the period of a postpaid budget's alerts."""
    return now.astimezone(UTC).strftime("%Y-%m")


def alert_threshold_micro(budget_micro: int, alert_percent: int) -> int:
    """The spend (micro-USD) at which a budget's alert fires: ``alert_percent`` of it,
    rounded up so the alert never fires before the percentage is reached."""
    return -(-budget_micro * alert_percent // 100)


def seconds_to_spend(amount_micro: int, rate_micro: int) -> int | None:
    """Whole seconds until ``amount_micro`` more is spent at ``rate_micro`` per hour:
    rounded up (the ledger bills whole seconds); 0 when nothing is left to spend;
    None when nothing is being spent."""
    if amount_micro <= 0:
        return 0
    if rate_micro <= 0:
        return None
    return -(-amount_micro * SECONDS_PER_HOUR // rate_micro)


def deadline(now: datetime, amount_micro: int, rate_micro: int) -> datetime | None:
    """When ``amount_micro`` more is spent at ``rate_micro`` per hour from ``now``."""
    secs = seconds_to_spend(amount_micro, rate_micro)
    return None if secs is None else now + timedelta(seconds=secs)


@dataclass(frozen=True)
class Standing:
    """An account's money at one instant.

    ``limit_micro``: the monthly budget (postpaid) or the sum of the credits (prepaid);
    None for a postpaid account without a budget. ``spent_micro``: the month's spend
    (postpaid) or the spend since the account became prepaid. ``rate_micro``: what its
    open usage intervals bill per hour now."""

    mode: str
    limit_micro: int | None
    spent_micro: int
    rate_micro: int
    alert_percent: int = 80
    low_balance_hours: float = 24.0

    @property
    def limited(self) -> bool:
        return self.limit_micro is not None

    @property
    def remaining_micro(self) -> int | None:
        """What is left (the balance, prepaid); None without a limit. May be negative:
        storage of stopped clusters keeps billing after a stop."""
        if self.limit_micro is None:
            return None
        return self.limit_micro - self.spent_micro

    @property
    def exhausted(self) -> bool:
        remaining = self.remaining_micro
        return remaining is not None and remaining <= 0

    def hours_left(self) -> float | None:
        """How long the remaining lasts at the current rate (None: no limit or no
        spending)."""
        remaining = self.remaining_micro
        if remaining is None or self.rate_micro <= 0:
            return None
        return max(0, remaining) / self.rate_micro

    def alerting(self) -> bool:
        """Whether the alert condition holds now."""
        remaining = self.remaining_micro
        if remaining is None or self.limit_micro is None:
            return False
        if self.mode == PREPAID:
            return remaining * 1.0 < self.low_balance_hours * self.rate_micro
        return self.spent_micro >= alert_threshold_micro(self.limit_micro, self.alert_percent)

    def exhausts_at(self, now: datetime) -> datetime | None:
        """When the remaining reaches zero at the current rate (``now`` when it has);
        None without a limit or while nothing is spent."""
        remaining = self.remaining_micro
        if remaining is None:
            return None
        return deadline(now, remaining, self.rate_micro)

    def alert_at(self, now: datetime) -> datetime | None:
        """When the alert condition starts to hold at the current rate (``now`` when it
        holds); None when it never will at this rate."""
        remaining = self.remaining_micro
        if remaining is None or self.limit_micro is None:
            return None
        if self.alerting():
            return now
        if self.mode == PREPAID:
            if self.rate_micro <= 0:
                return None
            # remaining - r*t < hours*r  <=>  t > remaining/r - hours (hours).
            low_micro = self.low_balance_hours * self.rate_micro
            secs = math.floor((remaining - low_micro) * SECONDS_PER_HOUR / self.rate_micro) + 1
            return now + timedelta(seconds=max(0, secs))
        threshold = alert_threshold_micro(self.limit_micro, self.alert_percent)
        return deadline(now, threshold - self.spent_micro, self.rate_micro)


def first_due(*times: datetime | None) -> datetime | None:
    """The earliest of ``times`` that is set."""
    present = [t for t in times if t is not None]
    return min(present) if present else None
