"""A start requested while a cluster is still stopping: desired state, not a race.

The request is recorded, not refused: ``desired_status`` becomes running and the
start's body is kept, sealed (it may carry env values), in ``clusters.pending_start``.
Placement is *not* done at request time: a stopping cluster still holds its compute,
so the normal start's checks (capacity, spend policy, admission) run when the stop is
done and the reconciler starts the cluster with the kept body
(services/clusters/use_cases.py ``start_pending``). A stop meanwhile calls the start off, a
terminate wins over it.
"""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.states import ClusterStatus
from gpuyard.services.clusters.lifecycle import guarded_update, record_event
from gpuyard.services.clusters.requests import StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.secrets import SecretBox, secret_box
from gpuyard.store.schema import Cluster

REQUESTED = "start requested while stopping"
CALLED_OFF = "pending start called off by a stop"


def seal_start(box: SecretBox, body: StartCluster, bid_per_gpu: float | None) -> str:
    """``body`` (and a spot bid) as stored: JSON that validates back to the same body,
    secret-marked env values marked again, all sealed."""
    data = body.model_dump(mode="json", exclude={"wait_for_ready", "timeout_minutes"})
    env = data.get("environment_updates")
    if env:
        data["environment_updates"] = {
            k: {"value": v, "secret": True} if k in body.secret_env and v is not None else v
            for k, v in env.items()
        }
    return box.seal(json.dumps({"body": data, "bid_per_gpu": bid_per_gpu}))


def open_start(box: SecretBox, stored: str) -> tuple[StartCluster, float | None]:
    """The body and bid :func:`seal_start` kept."""
    data = json.loads(box.open(stored))
    bid = data.get("bid_per_gpu")
    return StartCluster.model_validate(data["body"]), float(bid) if bid is not None else None


def defer_start(
    ctx: Context,
    session: Session,
    cluster: Cluster,
    body: StartCluster,
    bid_per_gpu: float | None,
    now: datetime,
) -> None:
    """Record a start of the stopping ``cluster`` (read at its version; detached
    afterwards with the new values). A second one replaces the first."""
    sealed = seal_start(secret_box(ctx.settings), body, bid_per_gpu)
    _set_desired(session, cluster, now, ClusterStatus.RUNNING, sealed, REQUESTED)


def has_pending_start(cluster: Cluster) -> bool:
    return cluster.pending_start is not None


def call_off(session: Session, cluster: Cluster, now: datetime, reason: str = CALLED_OFF) -> None:
    """Back to desired stopped (a stop while the start was pending, a start that
    could not be made); ``cluster`` is read at its version and detached."""
    _set_desired(session, cluster, now, ClusterStatus.STOPPED, None, reason)


def _set_desired(
    session: Session,
    cluster: Cluster,
    now: datetime,
    desired: ClusterStatus,
    pending_start: str | None,
    event: str,
) -> None:
    """One guarded write of the desired status and the kept start, with its event;
    ``cluster`` is detached and given the new values."""
    session.expunge(cluster)
    cluster.version = guarded_update(
        session,
        cluster.id,
        cluster.version,
        now,
        desired_status=desired.value,
        pending_start=pending_start,
    )
    cluster.desired_status = desired.value
    cluster.pending_start = pending_start
    record_event(session, cluster.id, now, "status", event)


def due_pending_starts(session: Session) -> list[tuple[str, int | None]]:
    """Stopped clusters with a pending start (id, host): level based, so one a crash
    left between its stop and its start is found on the next pass."""
    return [
        (row[0], row[1])
        for row in session.execute(
            select(Cluster.id, Cluster.host_id).where(
                Cluster.status == ClusterStatus.STOPPED.value,
                Cluster.pending_start.is_not(None),
            )
        )
    ]
