"""The ledger for storage that outlives clusters: snapshots and network volumes.

Each is billed per second like a cluster's meters (core/billing/ledger.py), with its own id as
the holder of its usage intervals and a meter of its own (``snapshot``,
``network_volume``), at a rate per GB-month from the settings.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from gpuyard.core.billing.ledger import boundary, micro
from gpuyard.core.billing.pricing import HOURS_PER_MONTH
from gpuyard.store.schema import UsageInterval

GB = 1_000_000_000


def storage_rate_micro(gb: float, price_gb_month: float) -> int:
    """Micro-USD per hour for ``gb`` gigabytes at ``price_gb_month`` USD per GB-month."""
    return micro(gb * price_gb_month / HOURS_PER_MONTH)


def stop_storage_billing(session: Session, holder_id: str, now: datetime) -> None:
    """Close ``holder_id``'s open intervals at ``now`` (whole seconds); one that would
    end where it began is dropped."""
    at = boundary(now)
    open_ = UsageInterval.ended_at.is_(None)
    session.execute(
        delete(UsageInterval)
        .where(UsageInterval.cluster_id == holder_id, open_, UsageInterval.started_at >= at)
        .execution_options(synchronize_session=False)
    )
    session.execute(
        update(UsageInterval)
        .where(UsageInterval.cluster_id == holder_id, open_)
        .values(ended_at=at)
        .execution_options(synchronize_session=False)
    )


def bill_storage(
    session: Session,
    *,
    holder_id: str,
    project_id: int,
    meter: str,
    gb: float,
    price_gb_month: float,
    now: datetime,
) -> None:
    """From ``now`` on, bill ``holder_id`` for ``gb`` gigabytes on ``meter``: its open
    interval is closed and one at the new rate opened (none when the rate is zero).
    Idempotent for an unchanged size only in what it bills, not in rows."""
    stop_storage_billing(session, holder_id, now)
    rate = storage_rate_micro(gb, price_gb_month)
    if rate <= 0:
        return
    session.add(
        UsageInterval(
            cluster_id=holder_id,
            project_id=project_id,
            meter=meter,
            gpu_type=None,
            rate_micro=rate,
            started_at=boundary(now),
            ended_at=None,
        )
    )
