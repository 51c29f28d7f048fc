"""Stopping an account's running work for the control plane (its suspension, its spent
budget or balance): every cluster that runs or is on its way to run (volumes kept) and
every training cluster whose nodes hold capacity (services/training/stops.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.states import ClusterStatus
from gpuyard.core.training import clusters as training_domain
from gpuyard.observability.crash_points import crash_point
from gpuyard.services.capacity.placement import lock_placement
from gpuyard.services.clusters.actions import control_plane_stop
from gpuyard.services.context import Context
from gpuyard.services.training.stops import holding_clusters
from gpuyard.services.training.stops import stop_cluster as stop_training_cluster
from gpuyard.store.schema import Cluster, Project

log = logging.getLogger(__name__)

# Clusters a control-plane stop applies to.
STOPPABLE = (
    ClusterStatus.PENDING.value,
    ClusterStatus.STARTING.value,
    ClusterStatus.RUNNING.value,
)


@dataclass
class RunningWork:
    """What of an account a stop applies to: cluster ids and training cluster ids."""

    clusters: list[str] = field(default_factory=list)
    training: list[int] = field(default_factory=list)


def running_work(session: Session, account_id: int) -> RunningWork:
    """The account's clusters and training clusters a stop applies to, oldest first.
    Call it in the transaction that marks the account closed: it takes the placement
    lock first, so a create or start of the account either committed before (and is
    listed) or checks the account after this commits (and is refused)."""
    lock_placement(session)
    clusters = session.scalars(
        select(Cluster.id)
        .join(Project, Project.id == Cluster.project_id)
        .where(Project.account_id == account_id, Cluster.status.in_(STOPPABLE))
        .order_by(Cluster.id)
    )
    return RunningWork(list(clusters), holding_clusters(session, account_id))


def stop_work(ctx: Context, account_id: int, work: RunningWork, reason: str) -> list[str]:
    """Stop each of ``work`` for ``reason`` (named in its events); one's trouble is
    logged and never spares the others. Returns what was stopped: cluster ids, and
    training clusters by their holder id (``tc-N``)."""
    stopped: list[str] = []
    for cluster_id in work.clusters:
        try:
            control_plane_stop(ctx, cluster_id, reason)
            stopped.append(cluster_id)
            crash_point("budget.stop.after_first_stop")
        except Exception:
            log.exception("account %s: cannot stop cluster %s", account_id, cluster_id)
    for training_id in work.training:
        try:
            if stop_training_cluster(ctx, training_id, reason):
                stopped.append(training_domain.cluster_owner(training_id))
        except Exception:
            log.exception("account %s: cannot stop training cluster %s", account_id, training_id)
    return stopped
