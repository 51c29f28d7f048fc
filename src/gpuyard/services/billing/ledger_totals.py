"""The usage ledger's running totals on the cluster row, kept with the intervals.

A cluster's cost is read on every GET and list; re-reading its whole interval history
each time would make the present pay for the past. So every change to a cluster's
intervals also moves its totals (the ``billed_*``/``open_*`` columns, core/billing/ledger.py
``LedgerTotals``) in the same transaction: closed amounts are added once, when their
interval closes, and a view adds only the open interval (``accrue_totals``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from gpuyard.core.billing.ledger import Interval, LedgerTotals, amount, totals_of
from gpuyard.store.schema import Cluster, UsageInterval

_OPEN = select(UsageInterval.rate_micro, UsageInterval.started_at).where(
    UsageInterval.cluster_id == bindparam("cid"), UsageInterval.ended_at.is_(None)
)


def open_intervals(session: Session, cluster_id: str) -> list[tuple[int, datetime]]:
    """``(rate, started_at)`` of the cluster's open intervals: read before they close."""
    return [(r.rate_micro, r.started_at) for r in session.execute(_OPEN, {"cid": cluster_id})]


def _seconds(start: datetime, end: datetime) -> int:
    return max(0, int((end - start).total_seconds()))


def record_close_and_open(
    session: Session,
    cluster_id: str,
    closed: Sequence[tuple[int, datetime]],
    at: datetime,
    run_from: datetime | None,
    open_rate: int,
) -> None:
    """Move the totals for intervals ``closed`` (as read by ``open_intervals``) ending
    at ``at`` and new ones opened at ``at`` with ``open_rate`` in all (0: none), for a
    run that began at ``run_from`` (whole second). A holder without a cluster row (a
    training node) has no totals: nothing happens."""
    session.flush()  # a cluster created in this transaction must be a row to update
    row = session.execute(select(Cluster.billed_run_from).where(Cluster.id == cluster_id)).first()
    if row is None:
        return
    added = sum(rate * _seconds(started, at) for rate, started in closed)
    values: dict[str, Any] = {
        "billed_closed": Cluster.billed_closed + added,
        "open_rate_micro": open_rate,
        "open_since": at if open_rate else None,
    }
    if run_from is None:
        values.update(billed_run_closed=0, billed_run_from=None)
    elif row.billed_run_from == run_from:
        in_run = sum(rate * _seconds(max(started, run_from), at) for rate, started in closed)
        values["billed_run_closed"] = Cluster.billed_run_closed + in_run
    else:
        # A new run: what closed since its start (usually nothing; it starts now).
        values.update(
            billed_run_closed=_closed_since(session, cluster_id, run_from),
            billed_run_from=run_from,
        )
    session.execute(
        update(Cluster)
        .where(Cluster.id == cluster_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )


def _closed_since(session: Session, cluster_id: str, since: datetime) -> int:
    rows = session.execute(
        select(UsageInterval.rate_micro, UsageInterval.started_at, UsageInterval.ended_at).where(
            UsageInterval.cluster_id == cluster_id, UsageInterval.ended_at > since
        )
    )
    return sum(
        amount(Interval("", r.rate_micro, r.started_at, r.ended_at), r.ended_at, since=since)
        for r in rows
    )


def rebuild(session: Session, cluster_ids: Sequence[str]) -> None:
    """Recompute the totals of ``cluster_ids`` from their intervals: after a change
    that rewrites history (billing paused back to a host's last heartbeat)."""
    if not cluster_ids:
        return
    session.flush()
    starts: dict[str, datetime | None] = {
        r.id: r.start_initiated_at
        for r in session.execute(
            select(Cluster.id, Cluster.start_initiated_at).where(Cluster.id.in_(cluster_ids))
        )
    }
    intervals: dict[str, list[Interval]] = {cid: [] for cid in starts}
    for r in session.execute(
        select(
            UsageInterval.cluster_id,
            UsageInterval.rate_micro,
            UsageInterval.started_at,
            UsageInterval.ended_at,
        ).where(UsageInterval.cluster_id.in_(list(starts)))
    ):
        intervals[r.cluster_id].append(Interval("", r.rate_micro, r.started_at, r.ended_at))
    for cid, run_start in starts.items():
        t = totals_of(intervals[cid], run_start)
        session.execute(
            update(Cluster)
            .where(Cluster.id == cid)
            .values(
                billed_closed=t.closed,
                billed_run_closed=t.run_closed,
                billed_run_from=t.run_from,
                open_rate_micro=t.open_rate,
                open_since=t.open_since,
            )
            .execution_options(synchronize_session=False)
        )


def totals(cluster: Any) -> LedgerTotals:
    """The totals a cluster row (ORM instance, Row or reader record) carries."""
    return LedgerTotals(
        closed=cluster.billed_closed or 0,
        run_closed=cluster.billed_run_closed or 0,
        run_from=cluster.billed_run_from,
        open_rate=cluster.open_rate_micro or 0,
        open_since=cluster.open_since,
    )
