"""The volume duty of each engine: how full its volumes are, and what network volume
deletions left on it.

Every ``GPUYARD_VOLUME_USAGE_INTERVAL_S`` (60 s) the owner of a host's lease (the
reconciler observes only the engines it owns) asks the engine's disk-usage report for
our volumes' sizes (``Runtime.volume_usage``) and records them: a cluster's in
``clusters.volume_used_bytes`` (its own volume's, or its network volume's), a network
volume's in ``network_volumes.used_bytes``, each with the time of the measurement.
These writes are observations: they change no status, version or ``updated_at``, so
they never collide with the lifecycle's guarded updates.

The same pass removes the engine volumes of deleted network volumes whose removal the
API could not finish (their host did not answer then) and releases their disk.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from sqlalchemy import select, update

from gpuyard.core.errors import GpuyardError
from gpuyard.core.states import ClusterStatus
from gpuyard.runtimes.base import Runtime
from gpuyard.services.context import Context
from gpuyard.services.volumes.network_volumes import finish_deletions
from gpuyard.store.schema import Cluster, NetworkVolume

log = logging.getLogger(__name__)

# Every status but terminated, spelled out: an IN list reads the status index, where
# ``!= terminated`` would walk every terminated cluster ever made.
_LIVE = [s.value for s in ClusterStatus if s is not ClusterStatus.TERMINATED]


class VolumeUsage:
    """Measures one engine's volumes when due (:meth:`due`, then :meth:`run`)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._last: dict[str, float] = {}

    def due(self, key: str) -> bool:
        """Whether engine ``key`` is due a pass (and, if so, count it as begun)."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.ctx.settings.volume_usage_interval_s:
            return False
        self._last[key] = now
        return True

    def run(self, runtime: Runtime, host_ids: tuple[int, ...]) -> None:
        """One pass over the engine of ``host_ids`` (empty: one engine serving every
        host). Never raises for engine trouble: the next pass tries again."""
        scope = host_ids or None
        try:
            finish_deletions(self.ctx, runtime, scope)
            usage = runtime.volume_usage()
        except GpuyardError as exc:
            log.warning("cannot measure volumes on hosts %s: %s", host_ids or "all", exc.message)
            return
        record_usage(self.ctx, usage, scope, self.ctx.clock.now())


def record_usage(
    ctx: Context, usage: dict[str, int], host_ids: tuple[int, ...] | None, now: datetime
) -> None:
    """Record the measured bytes of the volumes of the clusters (not terminated) and
    network volumes (not deleted) on ``host_ids`` (None: every host). A volume the
    measurement does not name keeps its last figure."""
    with ctx.read() as session:
        nq = select(NetworkVolume.id, NetworkVolume.volume_name).where(
            NetworkVolume.deleted_at.is_(None)
        )
        cq = select(
            Cluster.id, Cluster.volume_name, Cluster.volume_gb, Cluster.network_volume_id
        ).where(Cluster.status.in_(_LIVE))
        if host_ids is not None:
            nq = nq.where(NetworkVolume.host_id.in_(host_ids))
            cq = cq.where(Cluster.host_id.in_(host_ids))
        networked = {row.id: row.volume_name for row in session.execute(nq)}
        clusters = list(session.execute(cq))
    volumes = [
        {"id": vid, "used_bytes": usage[name], "measured_at": now}
        for vid, name in networked.items()
        if name in usage
    ]
    measured = []
    for row in clusters:
        if row.network_volume_id is not None:
            name = networked.get(row.network_volume_id)
        elif row.volume_gb > 0:
            name = row.volume_name or ctx.ownership.volume(row.id)
        else:
            name = None
        if name is not None and name in usage:
            measured.append(
                {"id": row.id, "volume_used_bytes": usage[name], "volume_measured_at": now}
            )
    if not volumes and not measured:
        return
    with ctx.transaction() as session:
        # Bulk updates by primary key: no version or updated_at change (see above).
        if volumes:
            session.execute(update(NetworkVolume), volumes)
        if measured:
            session.execute(update(Cluster), measured)
