"""The usage ledger's arithmetic: intervals at a fixed rate, priced exactly.

A usage interval bills one meter (gpu, compute, container_disk, volume) of one
cluster at one rate, in integer micro-USD per hour, from ``started_at`` to
``ended_at`` (None while open). Interval boundaries are whole seconds (``boundary``),
so every billed quantity is an integer: an interval's amount is ``rate * seconds``
in micro-USD·seconds per hour, and a sum of amounts is exactly the integral of the
rate over time. Division by 3600 (to micro-USD) happens once, on the sum, when a
figure is shown; it rounds down, so a bill never exceeds the integral.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from gpuyard.core.billing.pricing import RateParts

MICRO = 1_000_000
SECONDS_PER_HOUR = 3600
# Storage that outlives clusters has meters of its own: snapshot data (stored bytes)
# and network volumes, each billed with the snapshot's or the volume's id as holder.
METERS = ("gpu", "compute", "container_disk", "volume", "snapshot", "network_volume")


def micro(usd: float) -> int:
    """USD (rates carry 6 decimals) as integer micro-USD."""
    return round(usd * MICRO)


def micro_rates(parts: RateParts) -> dict[str, int]:
    """Each meter's rate in micro-USD per hour; meters at zero are left out."""
    rates = {
        "gpu": micro(parts.gpu),
        "compute": micro(parts.compute),
        "container_disk": micro(parts.container_disk),
        "volume": micro(parts.volume),
    }
    return {meter: rate for meter, rate in rates.items() if rate}


def boundary(t: datetime) -> datetime:
    """The whole second an interval starts or ends at: metering is per second, and a
    second belongs to the state that held at its start."""
    return t.replace(microsecond=0)


@dataclass(frozen=True)
class Interval:
    meter: str
    rate_micro: int
    started_at: datetime
    ended_at: datetime | None
    gpu_type: str | None = None
    cluster_id: str = ""
    project_id: int = 0


def seconds(
    iv: Interval, now: datetime, since: datetime | None = None, until: datetime | None = None
) -> int:
    """Whole seconds of ``iv`` inside ``[since, until)``, an open interval counting up
    to ``now``. Clip bounds are truncated to whole seconds like the boundaries."""
    start = iv.started_at
    end = iv.ended_at if iv.ended_at is not None else boundary(now)
    if since is not None:
        start = max(start, boundary(since))
    if until is not None:
        end = min(end, boundary(until))
    return max(0, int((end - start).total_seconds()))


def amount(
    iv: Interval, now: datetime, since: datetime | None = None, until: datetime | None = None
) -> int:
    """Billed amount in micro-USD·seconds per hour (divide by 3600 for micro-USD)."""
    return iv.rate_micro * seconds(iv, now, since, until)


def total_amount(
    intervals: Iterable[Interval],
    now: datetime,
    since: datetime | None = None,
    until: datetime | None = None,
) -> int:
    return sum(amount(iv, now, since, until) for iv in intervals)


def to_micro_usd(amount_: int) -> int:
    """An amount (micro-USD·s/h) as micro-USD, rounded down."""
    return amount_ // SECONDS_PER_HOUR


def to_usd(amount_: int) -> float:
    return to_micro_usd(amount_) / MICRO


@dataclass(frozen=True)
class Accrual:
    """What a cluster has cost: the current run (since its latest start) and its
    lifetime, in micro-USD, and the current rate (micro-USD per hour)."""

    current_run_micro: int
    lifetime_micro: int
    since_micro: int | None
    rate_micro: int
    run_started_at: datetime | None
    created_at: datetime | None


def accrue(
    intervals: Iterable[Interval],
    now: datetime,
    run_started_at: datetime | None,
    since: datetime | None = None,
    created_at: datetime | None = None,
) -> Accrual:
    items = list(intervals)
    run = total_amount(items, now, since=run_started_at) if run_started_at else 0
    return Accrual(
        current_run_micro=to_micro_usd(run),
        lifetime_micro=to_micro_usd(total_amount(items, now)),
        since_micro=to_micro_usd(total_amount(items, now, since=since)) if since else None,
        rate_micro=sum(iv.rate_micro for iv in items if iv.ended_at is None),
        run_started_at=run_started_at,
        created_at=created_at,
    )


@dataclass(frozen=True)
class LedgerTotals:
    """A cluster's running totals, kept with its intervals (the cluster row's
    ``billed_*``/``open_*`` columns): amounts (micro-USD·s/h) of its closed intervals
    over its lifetime and since ``run_from`` (a run's start, to the second), and the
    summed rate of its open intervals, all opened at ``open_since``."""

    closed: int = 0
    run_closed: int = 0
    run_from: datetime | None = None
    open_rate: int = 0
    open_since: datetime | None = None


def totals_of(intervals: Iterable[Interval], run_started_at: datetime | None) -> LedgerTotals:
    """The totals that ``intervals`` (one cluster's, open ones all opened together)
    add up to for a run that began at ``run_started_at``."""
    closed = [iv for iv in intervals if iv.ended_at is not None]
    opened = [iv for iv in intervals if iv.ended_at is None]
    run_from = boundary(run_started_at) if run_started_at else None
    return LedgerTotals(
        closed=sum(amount(iv, iv.started_at) for iv in closed),
        run_closed=(
            sum(amount(iv, iv.started_at, since=run_from) for iv in closed) if run_from else 0
        ),
        run_from=run_from,
        open_rate=sum(iv.rate_micro for iv in opened),
        open_since=min((iv.started_at for iv in opened), default=None),
    )


def accrue_totals(
    totals: LedgerTotals,
    now: datetime,
    run_started_at: datetime | None,
    created_at: datetime | None = None,
) -> Accrual:
    """What ``accrue`` answers for the intervals behind ``totals`` (without ``since``):
    closed amounts summed once, plus the open interval up to ``now``."""
    end = boundary(now)
    open_total = open_run = 0
    if totals.open_since is not None:
        open_total = totals.open_rate * max(0, int((end - totals.open_since).total_seconds()))
    run = 0
    if run_started_at is not None:
        run_from = boundary(run_started_at)
        if totals.open_since is not None:
            start = max(totals.open_since, run_from)
            open_run = totals.open_rate * max(0, int((end - start).total_seconds()))
        run = (totals.run_closed if totals.run_from == run_from else 0) + open_run
    return Accrual(
        current_run_micro=to_micro_usd(run),
        lifetime_micro=to_micro_usd(totals.closed + open_total),
        since_micro=None,
        rate_micro=totals.open_rate,
        run_started_at=run_started_at,
        created_at=created_at,
    )
