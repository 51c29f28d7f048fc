"""A safety net: GPU rows held by clusters that no longer hold compute (a crash
between a status change and the release, or a manual DB edit) are freed."""

from __future__ import annotations

import time

from sqlalchemy import delete, select

from gpuyard.core.states import HOLDS_COMPUTE
from gpuyard.services.context import Context
from gpuyard.store.schema import Cluster, GpuAllocation

# Clusters that hold GPU rows but no longer hold compute: read from gpu_allocations (as
# many rows as GPUs in use) and the cluster's primary key, never from the clusters
# table's history.
_RESTING_HOLDERS = (
    select(GpuAllocation.cluster_id)
    .join(Cluster, Cluster.id == GpuAllocation.cluster_id)
    .where(Cluster.status.not_in([s.value for s in HOLDS_COMPUTE]))
    .distinct()
)


class RestingGpus:
    """Frees resting clusters' GPU rows, swept at most every ``every_s``."""

    def __init__(self, ctx: Context, every_s: float = 30.0) -> None:
        self.ctx = ctx
        self.every_s = every_s
        self._last = float("-inf")

    def due(self) -> bool:
        """Whether a sweep is due (if so, it counts as swept now)."""
        if time.monotonic() - self._last < self.every_s:
            return False
        self._last = time.monotonic()
        return True

    def free(self) -> None:
        """Free them now.

        Driven from the allocations (a row per GPU in use, however long the history)
        joined to their clusters by primary key, and read first: the usual pass finds
        nothing and takes no write lock. Holders that are not clusters (training nodes'
        owner ids) match no cluster row and are left alone."""
        with self.ctx.read() as session:
            stale = list(session.scalars(_RESTING_HOLDERS))
        if not stale:
            return
        with self.ctx.transaction() as session:
            # Checked again under the write lock: a start may have claimed them since.
            session.execute(
                delete(GpuAllocation).where(GpuAllocation.cluster_id.in_(_RESTING_HOLDERS))
            )
