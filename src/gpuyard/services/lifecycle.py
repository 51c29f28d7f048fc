"""The one write funnel for cluster status (DESIGN.md rule 5).

Every change is a guarded update: ``UPDATE clusters ... WHERE id = :id AND version =
:v``. Zero rows means someone else moved the cluster first; the caller re-reads.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from gpuyard.core.errors import Conflict, GpuyardError
from gpuyard.core.states import ClusterStatus, can_transition
from gpuyard.store.schema import Cluster, Event


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
    return version
