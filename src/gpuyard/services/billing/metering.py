"""Reads of the usage ledger: what a cluster has cost, and bills.

The ledger is written only by the status funnel (services/clusters/lifecycle.py,
``meter_status``); everything here reads it. Amounts are exact integers (see
core/billing/ledger.py) and are converted to micro-USD once per figure shown.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, bindparam, func, or_, select
from sqlalchemy.orm import Session

from gpuyard.core.billing.ledger import (
    METERS,
    Accrual,
    Interval,
    accrue,
    amount,
    boundary,
    seconds,
    to_micro_usd,
)
from gpuyard.core.errors import NotFound
from gpuyard.store.schema import (
    Cluster,
    NetworkVolume,
    Project,
    ServerlessEndpoint,
    Snapshot,
    UsageInterval,
)

_COLUMNS = (
    UsageInterval.cluster_id,
    UsageInterval.project_id,
    UsageInterval.meter,
    UsageInterval.gpu_type,
    UsageInterval.rate_micro,
    UsageInterval.started_at,
    UsageInterval.ended_at,
)
# Built once (the cluster read path is hot): one indexed query for a page of clusters.
_OF_CLUSTERS = select(*_COLUMNS).where(
    UsageInterval.cluster_id.in_(bindparam("ids", expanding=True))
)


def _interval(row: Any) -> Interval:
    return Interval(
        meter=row.meter,
        rate_micro=row.rate_micro,
        started_at=row.started_at,
        ended_at=row.ended_at,
        gpu_type=row.gpu_type,
        cluster_id=row.cluster_id,
        project_id=row.project_id,
    )


def load_intervals(
    db: Session | Connection, cluster_ids: Iterable[str]
) -> dict[str, list[Interval]]:
    """Every usage interval of each cluster (one query), by cluster id."""
    ids = list(cluster_ids)
    out: dict[str, list[Interval]] = {cid: [] for cid in ids}
    if ids:
        for row in db.execute(_OF_CLUSTERS, {"ids": ids}):
            out[row.cluster_id].append(_interval(row))
    return out


def run_start(cluster: Cluster) -> datetime | None:
    """When the current run began: the latest move into ``starting`` (create, start or
    restart all record it as ``start_initiated_at``)."""
    return cluster.start_initiated_at


def accrual_of(
    cluster: Cluster, intervals: list[Interval], now: datetime, since: datetime | None = None
) -> Accrual:
    return accrue(intervals, now, run_start(cluster), since, cluster.created_at)


def accrued(
    session: Session, cluster_id: str, now: datetime, since: datetime | None = None
) -> Accrual:
    """The cluster's cost so far (micro-USD): current run, lifetime and, with
    ``since``, from then on. Raises NotFound for an unknown cluster id."""
    cluster = session.get(Cluster, cluster_id)
    if cluster is None:
        raise NotFound(f"cluster {cluster_id!r} not found", {"cluster_id": cluster_id})
    return accrual_of(cluster, load_intervals(session, [cluster_id])[cluster_id], now, since)


def run_accrued_micro(session: Session, cluster_id: str, now: datetime) -> int:
    """Micro-USD billed since the current run's start (0 for a cluster never started)."""
    return accrued(session, cluster_id, now).current_run_micro


def current_rate_micro(session: Session, cluster_id: str) -> int:
    """The sum of the cluster's open intervals' rates: micro-USD per hour billed now."""
    total = session.scalar(
        select(func.coalesce(func.sum(UsageInterval.rate_micro), 0)).where(
            UsageInterval.cluster_id == cluster_id, UsageInterval.ended_at.is_(None)
        )
    )
    return int(total or 0)


class GroupBy(StrEnum):
    CLUSTER = "cluster"
    GPU_TYPE = "gpu_type"
    DAY = "day"


@dataclass
class BillLine:
    key: str
    label: str | None = None
    amounts: dict[str, int] = field(default_factory=dict)  # by meter, micro-USD·s/h
    gpu_seconds: int = 0

    @property
    def micro(self) -> int:
        return to_micro_usd(sum(self.amounts.values()))

    def meters_micro(self) -> dict[str, int]:
        return {m: to_micro_usd(self.amounts.get(m, 0)) for m in METERS}


@dataclass(frozen=True)
class Bill:
    from_: datetime
    to: datetime
    group_by: GroupBy
    lines: list[BillLine]

    @property
    def total_micro(self) -> int:
        return to_micro_usd(sum(sum(line.amounts.values()) for line in self.lines))


def _days(start: datetime, end: datetime) -> Iterable[tuple[datetime, datetime]]:
    day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    while day < end:
        nxt = day + timedelta(days=1)
        yield max(day, start), min(nxt, end)
        day = nxt


def bill(
    session: Session,
    account_id: int,
    project_id: int | None,
    from_: datetime,
    to: datetime,
    group_by: GroupBy,
    now: datetime,
    *,
    projects: frozenset[int] | None = None,
) -> Bill:
    """What the account (or one of its projects) was billed in ``[from_, to)``, each
    interval clipped to that window (and open ones to ``now``), grouped by cluster,
    GPU type or UTC day; lines sorted by key. By cluster, a serverless endpoint's
    workers are one line: the endpoint's id and name. ``projects``: only these projects'
    (a caller restricted to some, ``Principal.project_ids``; None: all). Raises
    NotFound for a project of another account or outside ``projects``."""
    if project_id is not None:
        owner = session.scalar(select(Project.account_id).where(Project.id == project_id))
        if owner != account_id or (projects is not None and project_id not in projects):
            raise NotFound(f"project {project_id} not found", {"project_id": project_id})
    lo, hi = boundary(from_), boundary(to)
    q = (
        # A holder is a cluster, a network volume or a snapshot (each named in a bill).
        select(
            *_COLUMNS,
            func.coalesce(
                ServerlessEndpoint.name, Cluster.name, NetworkVolume.name, Snapshot.name
            ).label("name"),
            ServerlessEndpoint.id.label("endpoint_id"),
        )
        .join(Project, Project.id == UsageInterval.project_id)
        .outerjoin(Cluster, Cluster.id == UsageInterval.cluster_id)
        .outerjoin(ServerlessEndpoint, ServerlessEndpoint.id == Cluster.serverless_endpoint_id)
        .outerjoin(NetworkVolume, NetworkVolume.id == UsageInterval.cluster_id)
        .outerjoin(Snapshot, Snapshot.id == UsageInterval.cluster_id)
        .where(
            Project.account_id == account_id,
            UsageInterval.started_at < hi,
            or_(UsageInterval.ended_at.is_(None), UsageInterval.ended_at > lo),
        )
    )
    if project_id is not None:
        q = q.where(UsageInterval.project_id == project_id)
    if projects is not None:
        q = q.where(UsageInterval.project_id.in_(sorted(projects)))
    lines: dict[str, BillLine] = {}

    def add(key: str, label: str | None, iv: Interval, a: datetime, b: datetime) -> None:
        billed = amount(iv, now, a, b)
        if not billed:
            return
        line = lines.setdefault(key, BillLine(key, label))
        line.amounts[iv.meter] = line.amounts.get(iv.meter, 0) + billed
        if iv.meter == "gpu":
            line.gpu_seconds += seconds(iv, now, a, b)

    for row in session.execute(q):
        iv = _interval(row)
        if group_by == GroupBy.CLUSTER:
            add(row.endpoint_id or iv.cluster_id, row.name, iv, lo, hi)
        elif group_by == GroupBy.GPU_TYPE:
            add(iv.gpu_type or "none", None, iv, lo, hi)
        else:
            end = iv.ended_at or boundary(now)
            for a, b in _days(max(lo, iv.started_at), min(hi, end)):
                add(a.date().isoformat(), None, iv, a, b)
    return Bill(lo, hi, group_by, [lines[k] for k in sorted(lines)])


def meter_totals(lines: Iterable[BillLine]) -> dict[str, int]:
    """Micro-USD per meter over ``lines``."""
    out: dict[str, int] = defaultdict(int)
    for line in lines:
        for meter, billed in line.amounts.items():
            out[meter] += billed
    return {m: to_micro_usd(out.get(m, 0)) for m in METERS}
