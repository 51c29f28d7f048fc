"""How a cluster step reads its cluster and records what it did: a load, an event in
its own transaction, a guarded update, and a transition through the status funnel
(DESIGN.md rules 2 and 5). Each write that finds the row moved on raises Abandon."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from gpuyard.core.errors import Conflict
from gpuyard.core.states import ClusterStatus
from gpuyard.services.clusters.lifecycle import guarded_update, record_event, transition_cluster
from gpuyard.services.context import Context
from gpuyard.store.schema import Cluster


class Abandon(Exception):
    """The cluster moved on under us; stop this step quietly."""


def volume_of(ctx: Context, c: Cluster) -> str:
    """The cluster's engine volume: its stored name (clusters older than installation
    ids) or this installation's name for it."""
    return c.volume_name or ctx.ownership.volume(c.id)


class ClusterRecords:
    """The reads and writes of a cluster's steps, on ``ctx``'s store."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def load(self, cluster_id: str) -> Cluster | None:
        """The cluster's row, detached (None: no such cluster)."""
        with self.ctx.read() as session:
            return session.get(Cluster, cluster_id)

    def event(self, cluster_id: str, type_: str, message: str) -> None:
        """One event on the cluster (a system line of its logs), in its own transaction."""
        with self.ctx.transaction() as session:
            record_event(session, cluster_id, self.ctx.clock.now(), type_, message)

    def record(self, cluster: Cluster, *, restart_event: str | None = None, **values: Any) -> None:
        """Apply ``values`` with a guarded update (Abandon if the row moved on), with a
        ``restart`` event in the same transaction when given."""
        now = self.ctx.clock.now()
        try:
            with self.ctx.transaction() as session:
                cluster.version = guarded_update(
                    session, cluster.id, cluster.version, now, **values
                )
                if restart_event is not None:
                    record_event(session, cluster.id, now, "restart", restart_event)
        except Conflict as exc:
            raise Abandon() from exc
        for k, v in values.items():
            setattr(cluster, k, v)
        if restart_event is not None:
            self.ctx.notifier.notify()

    def transition(
        self,
        cluster: Cluster,
        target: ClusterStatus,
        reason: str,
        also: Callable[[Session, str], None] | None = None,
        **values: Any,
    ) -> None:
        """Transition through the funnel (Abandon if the row moved on); ``also`` runs in
        the same transaction."""
        try:
            with self.ctx.transaction() as session:
                if also is not None:
                    also(session, cluster.id)
                cluster.version = transition_cluster(
                    session, cluster, target, reason, self.ctx.clock.now(), **values
                )
                cluster.status = target.value
        except Conflict as exc:
            raise Abandon() from exc
        finally:
            self.ctx.notifier.notify()
