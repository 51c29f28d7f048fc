"""The one write funnel for cluster status (DESIGN.md rule 5).

Every change is a guarded update: ``UPDATE clusters ... WHERE id = :id AND version =
:v``. Zero rows means someone else moved the cluster first; the caller re-reads.
"""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import delete, insert, update
from sqlalchemy.orm import Session

from gpuyard.core.billing.ledger import boundary, micro_rates
from gpuyard.core.billing.pricing import Prices
from gpuyard.core.errors import Conflict, GpuyardError
from gpuyard.core.snapshots import RestoreStatus
from gpuyard.core.states import ClusterStatus, can_transition
from gpuyard.services.billing.ledger_totals import open_intervals, record_close_and_open
from gpuyard.services.catalog.gpu_types import find_gpu_type
from gpuyard.services.clusters.views import cluster_rate
from gpuyard.store.schema import Cluster, Event, Host, UsageInterval, VolumeRestore

# Context.transaction puts the price list here, so the funnel can meter without every
# caller passing it.
PRICES_KEY = "gpuyard.prices"


class IllegalTransition(GpuyardError):
    code = "ILLEGAL_TRANSITION"
    http_status = 500


def guarded_update(
    session: Session, cluster_id: str, expected_version: int, now: datetime, **values: Any
) -> int:
    """Apply ``values`` if the cluster is still at ``expected_version``; returns the new
    version. Raises Conflict when another writer got there first."""
    new_version = expected_version + 1
    result = session.execute(
        update(Cluster)
        .where(Cluster.id == cluster_id, Cluster.version == expected_version)
        .values(version=new_version, updated_at=now, **values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict(f"cluster {cluster_id} changed concurrently; retry")
    return new_version


def record_event(
    session: Session,
    cluster_id: str,
    now: datetime,
    type_: str,
    message: str,
    from_status: str | None = None,
    to_status: str | None = None,
) -> None:
    session.add(
        Event(
            cluster_id=cluster_id,
            created_at=now,
            type=type_,
            from_status=from_status,
            to_status=to_status,
            message=message,
        )
    )


def transition_cluster(
    session: Session,
    cluster: Cluster,
    target: ClusterStatus,
    reason: str,
    now: datetime,
    **values: Any,
) -> int:
    """Move ``cluster`` (as read at its current version) to ``target``.

    Checks the allowed-transition table, records the reason in ``status_reason`` and
    an event, and returns the new version. Raises IllegalTransition for a move the
    table forbids and Conflict when the row changed since it was read.
    """
    current = ClusterStatus(cluster.status)
    if not can_transition(current, target):
        raise IllegalTransition(f"cluster {cluster.id}: {current} -> {target} is not allowed")
    version = guarded_update(
        session,
        cluster.id,
        cluster.version,
        now,
        status=target.value,
        status_reason=reason,
        **values,
    )
    record_event(session, cluster.id, now, "status", reason, current.value, target.value)
    meter_status(session, SimpleNamespace(**{**_columns(cluster), **values}), target, now)
    if target not in _KEEPS_RESTORE:
        call_off_restores(session, cluster.id, f"called off: the cluster went {target.value}", now)
    return version


# A restore into a cluster's volume is a step of its start: any other status ends it.
_KEEPS_RESTORE = frozenset({ClusterStatus.PENDING, ClusterStatus.STARTING, ClusterStatus.RUNNING})


def call_off_restores(session: Session, holder_id: str, reason: str, now: datetime) -> None:
    """Mark ``holder_id``'s restores in flight failed with ``reason``: its volume stays
    as it was; a partial copy is no longer known and goes the orphans' way."""
    session.execute(
        update(VolumeRestore)
        .where(
            VolumeRestore.holder_id == holder_id,
            VolumeRestore.status == RestoreStatus.RESTORING.value,
        )
        .values(status=RestoreStatus.FAILED.value, error=reason, finished_at=now)
        .execution_options(synchronize_session=False)
    )


def _columns(cluster: Cluster) -> dict[str, Any]:
    return {c.name: getattr(cluster, c.name) for c in Cluster.__table__.columns}


def meter_status(session: Session, cluster: Any, status: ClusterStatus, now: datetime) -> None:
    """Close the cluster's open usage intervals at ``now`` (truncated to the second)
    and open one per billed meter at ``status``'s rate for the cluster as given (its
    columns after the change). Called by the funnel and once at creation; nothing else
    writes the ledger. An interval that would end where it began is dropped."""
    at = boundary(now)
    start = getattr(cluster, "start_initiated_at", None)
    closing = open_intervals(session, cluster.id)
    open_ = UsageInterval.ended_at.is_(None)
    session.execute(
        delete(UsageInterval)
        .where(UsageInterval.cluster_id == cluster.id, open_, UsageInterval.started_at >= at)
        .execution_options(synchronize_session=False)
    )
    session.execute(
        update(UsageInterval)
        .where(UsageInterval.cluster_id == cluster.id, open_)
        .values(ended_at=at)
        .execution_options(synchronize_session=False)
    )
    rates: dict[str, int] = {}
    if not billing_paused(session, getattr(cluster, "host_id", None)):
        # (A host that does not answer: nothing is billed until it does.)
        prices = session.info.get(PRICES_KEY)
        if not isinstance(prices, Prices):
            raise RuntimeError("metering needs the session from Context.transaction()")
        gpu = find_gpu_type(session, cluster.gpu_type) if cluster.gpu_type else None
        rates = micro_rates(cluster_rate(cluster, gpu, prices, status=status))
    record_close_and_open(
        session,
        cluster.id,
        closing,
        at,
        boundary(start) if start else None,
        sum(rates.values()),
    )
    if rates:
        # One statement for every meter (the session flushes what it holds first).
        session.execute(
            insert(UsageInterval),
            [
                {
                    "cluster_id": cluster.id,
                    "project_id": cluster.project_id,
                    "meter": meter,
                    "gpu_type": cluster.gpu_type,
                    "rate_micro": rate,
                    "started_at": at,
                    "ended_at": None,
                }
                for meter, rate in rates.items()
            ],
        )


def billing_paused(session: Session, host_id: int | None) -> bool:
    """Whether clusters on ``host_id`` bill nothing now: the host has been found
    unreachable and has not answered since (services/fleet/health.py)."""
    if host_id is None:
        return False
    host = session.get(Host, host_id)
    return host is not None and host.unreachable_since is not None
