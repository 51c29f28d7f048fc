"""Moves away from draining hosts, after each observation of their engine: clusters a
drain stopped are started on other hosts, training nodes are moved, and the old copies
of moved volumes are deleted. Level based: what cannot move yet is tried again on the
next scan."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import select

from gpuyard.core.fleet import HostStatus
from gpuyard.core.states import ClusterStatus
from gpuyard.services.clusters.moves import DRAIN_STOP
from gpuyard.services.clusters.use_cases import start_drained
from gpuyard.services.context import Context
from gpuyard.services.training.drain import retry_training_drains
from gpuyard.store.schema import Cluster, Host

log = logging.getLogger(__name__)


def restart_drained(ctx: Context, host_ids: tuple[int, ...]) -> None:
    """Clusters a drain of these hosts (none: of any host) stopped are started on
    other hosts."""
    with ctx.read() as session:
        q = (
            select(Cluster.id)
            .join(Host, Host.id == Cluster.host_id)
            .where(
                Host.status == HostStatus.DRAINING.value,
                Cluster.status == ClusterStatus.STOPPED.value,
                Cluster.status_reason.startswith(f"stopped ({DRAIN_STOP}"),
            )
        )
        if host_ids:
            q = q.where(Cluster.host_id.in_(host_ids))
        drained = list(session.scalars(q))
    for cluster_id in drained:
        problem = start_drained(ctx, cluster_id)
        if problem is not None:
            log.warning("drained cluster %s cannot move yet: %s", cluster_id, problem)


class DrainMoves:
    """Everything that moves off the hosts of one engine; ``delete_old_copies`` is the
    cluster driver's."""

    def __init__(self, ctx: Context, delete_old_copies: Callable[[list[int] | None], None]) -> None:
        self.ctx = ctx
        self.delete_old_copies = delete_old_copies

    def run(self, host_ids: tuple[int, ...]) -> None:
        restart_drained(self.ctx, host_ids)
        try:
            retry_training_drains(self.ctx, host_ids)
        except Exception:  # the next scan tries again; the engine's work goes on
            log.exception("moving training nodes off draining hosts failed")
        self.delete_old_copies(list(host_ids) or None)
