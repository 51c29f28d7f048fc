"""The storage steps of a cluster's start: wait for a snapshot of the resting volume,
then restore a snapshot into it (``restore_from_snapshot``, or a clone's first start).

The restore writes into a new engine volume; only once it is whole does the cluster's
row name it as its volume (one guarded update) and the old volume go. A restore that
fails leaves the old volume exactly as it was and the cluster in ``error`` saying so.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from sqlalchemy.orm import Session

from gpuyard.core.errors import Conflict, GpuyardError
from gpuyard.core.progress import STEP_RESTORING
from gpuyard.core.snapshots import RestoreStatus
from gpuyard.core.states import ClusterStatus
from gpuyard.observability.crash_points import crash_point
from gpuyard.reconciler.clusters.records import Abandon, ClusterRecords, volume_of
from gpuyard.runtimes.base import Runtime
from gpuyard.services.capacity.placement import release_compute
from gpuyard.services.clusters.lifecycle import guarded_update, record_event
from gpuyard.services.context import Context
from gpuyard.services.volumes import snapshot_work as work
from gpuyard.services.volumes import snapshots as svc
from gpuyard.store.schema import Cluster, VolumeRestore

log = logging.getLogger(__name__)

# How often the swap is tried again when the row changed without ending the start.
SWAP_ATTEMPTS = 5


class RestoreStorage(Protocol):
    """Where snapshots are restored from (clusters/snapshots.py SnapshotWorker)."""

    def restore_into(
        self,
        restore_id: int,
        holder_id: str,
        snapshot_id: str,
        host_id: int,
        target_volume: str,
        like_volume: str | None,
        cluster_id: str | None,
    ) -> None: ...


class VolumeRestores:
    """The storage steps of a start, on the engine of the cluster's host
    (``runtime_of``) with the snapshots of ``storage`` (None: no repository)."""

    def __init__(
        self,
        ctx: Context,
        records: ClusterRecords,
        runtime_of: Callable[[int | None], Runtime],
        storage: RestoreStorage | None,
    ) -> None:
        self.ctx = ctx
        self.records = records
        self.runtime_of = runtime_of
        self.storage = storage

    def finish_pending_restore(self, c: Cluster) -> bool:
        """Whether the start may go on after its storage steps: a pending restore is
        done. False: wait, or the start failed (the cluster is in ``error``). Raises
        Abandon when the cluster moved on during the restore."""
        return self.finish_restore(c, svc.pending_restore(self.ctx, c.id))

    def finish_restore(self, c: Cluster, restore: VolumeRestore | None) -> bool:
        """:meth:`finish_pending_restore` with the pending restore already read
        (reconciler/clusters/start_checks.py; None: there is none)."""
        return restore is None or self._restore(c, restore)

    def _restore(self, c: Cluster, restore: VolumeRestore) -> bool:
        before = work.before_snapshot_outcome(self.ctx, restore)
        if before == "pending":
            return False
        if before is not None:
            self._give_up(
                c,
                restore,
                f"the snapshot taken before the changes failed ({before}); snapshot "
                f"{restore.snapshot_id} was not restored and the volume is as it was",
            )
            return False
        if self.storage is None:
            self._give_up(c, restore, "snapshots are not available on this server")
            return False
        if c.startup_step < STEP_RESTORING:
            self.records.record(c, startup_step=STEP_RESTORING)
            crash_point("start.restore.after_restoring_step")
        old = volume_of(self.ctx, c)
        try:
            self.storage.restore_into(
                restore.id,
                c.id,
                restore.snapshot_id,
                c.host_id if c.host_id is not None else restore.host_id,
                restore.target_volume,
                old,
                c.id,
            )
        except GpuyardError as exc:
            self._give_up(
                c,
                restore,
                f"restoring snapshot {restore.snapshot_id} failed: {exc.message}; "
                "the volume is as it was before the restore",
            )
            return False
        crash_point("start.restore.after_unpack")
        if not self._swap(c, restore):
            # Stopped, terminated or moved meanwhile: the restored copy is not used.
            with contextlib.suppress(GpuyardError):
                self.runtime_of(c.host_id).remove_volume(restore.target_volume)
            raise Abandon()
        legacy = c.volume_name is not None
        c.volume_name = restore.target_volume
        crash_point("start.restore.after_swap")
        with contextlib.suppress(GpuyardError):
            # Not there for a clone's first start; one that cannot go now is collected
            # later as an orphan (quarantined, never deleted on sight).
            self.runtime_of(c.host_id).remove_volume(old, legacy=legacy)
        return True

    def _swap(self, c: Cluster, restore: VolumeRestore) -> bool:
        """Make the restored copy the cluster's volume (one guarded update with the end of
        the restore and an event). A change of the row meanwhile that leaves the start as
        it was (a policy update, progress) is read again and the swap tried again; False
        when the start is gone (stopped, terminated, on another host) or the restore was
        called off."""
        for _ in range(SWAP_ATTEMPTS):
            now = self.ctx.clock.now()
            try:
                with self.ctx.transaction() as session:
                    row = session.get(VolumeRestore, restore.id)
                    if row is None or row.status != RestoreStatus.RESTORING.value:
                        return False
                    c.version = guarded_update(
                        session, c.id, c.version, now, volume_name=restore.target_volume
                    )
                    work.finish_restore(self.ctx, restore.id, session=session)
                    record_event(
                        session, c.id, now, "snapshot", f"restored snapshot {restore.snapshot_id}"
                    )
                return True
            except Conflict:
                fresh = self.records.load(c.id)
                if (
                    fresh is None
                    or fresh.status != ClusterStatus.STARTING.value
                    or fresh.host_id != c.host_id
                ):
                    return False
                c.version = fresh.version
        return False

    def _give_up(self, c: Cluster, restore: VolumeRestore, message: str) -> None:
        log.warning("cluster %s: restore of %s failed", c.id, restore.snapshot_id)

        def record(session: Session, cluster_id: str) -> None:
            work.finish_restore(self.ctx, restore.id, error=message, session=session)
            release_compute(session, cluster_id)

        self.records.transition(
            c, ClusterStatus.ERROR, f"error: {message}", also=record, error_message=message
        )
