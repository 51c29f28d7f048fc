"""The storage steps of a cluster's start: wait for a snapshot of the resting volume,
then restore a snapshot into it (``restore_from_snapshot``, or a clone's first start).

The restore writes into a new engine volume; only once it is whole does the cluster's
row name it as its volume (one guarded update) and the old volume go. A restore that
fails leaves the old volume exactly as it was and the cluster in ``error`` saying so.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from gpuyard.core.errors import Conflict, GpuyardError
from gpuyard.core.progress import STEP_RESTORING
from gpuyard.core.snapshots import RestoreStatus
from gpuyard.core.states import ClusterStatus
from gpuyard.observability.crash_points import crash_point
from gpuyard.services import snapshot_work as work
from gpuyard.services import snapshots as svc
from gpuyard.services.lifecycle import guarded_update, record_event
from gpuyard.services.placement import release_compute
from gpuyard.store.schema import Cluster, VolumeRestore

if TYPE_CHECKING:
    from gpuyard.reconciler.clusters.driver import ClusterDriver

log = logging.getLogger(__name__)

# How often the swap is tried again when the row changed without ending the start.
SWAP_ATTEMPTS = 5


def volume_unread(driver: ClusterDriver, c: Cluster) -> bool:
    """Whether no snapshot is reading the cluster's volume now. The start waits until
    then (the snapshot's end wakes the reconciler): a move or a restore would remove
    the volume under the reader, and a ``stopped`` snapshot must not see a running
    container."""
    return not work.snapshot_reading(driver.ctx, c)


def storage_ready(driver: ClusterDriver, c: Cluster) -> bool:
    """Whether the start may go on after its storage steps: a pending restore is done.
    False: wait, or the start failed (the cluster is in ``error``)."""
    restore = svc.pending_restore(driver.ctx, c.id)
    return restore is None or _restore(driver, c, restore)


def _restore(driver: ClusterDriver, c: Cluster, restore: VolumeRestore) -> bool:
    from gpuyard.reconciler.clusters.driver import Abandon

    before = work.before_snapshot_outcome(driver.ctx, restore)
    if before == "pending":
        return False
    if before is not None:
        _give_up(
            driver,
            c,
            restore,
            f"the snapshot taken before the changes failed ({before}); snapshot "
            f"{restore.snapshot_id} was not restored and the volume is as it was",
        )
        return False
    if driver.storage is None:
        _give_up(driver, c, restore, "snapshots are not available on this server")
        return False
    if c.startup_step < STEP_RESTORING:
        driver._record(c, startup_step=STEP_RESTORING)
        crash_point("start.restore.after_restoring_step")
    old = driver.volume_of(c)
    try:
        driver.storage.restore_into(
            restore.id,
            c.id,
            restore.snapshot_id,
            c.host_id if c.host_id is not None else restore.host_id,
            restore.target_volume,
            old,
            c.id,
        )
    except GpuyardError as exc:
        _give_up(
            driver,
            c,
            restore,
            f"restoring snapshot {restore.snapshot_id} failed: {exc.message}; "
            "the volume is as it was before the restore",
        )
        return False
    crash_point("start.restore.after_unpack")
    if not _swap(driver, c, restore):
        # Stopped, terminated or moved meanwhile: the restored copy is not used.
        with contextlib.suppress(GpuyardError):
            driver.runtime_of(c.host_id).remove_volume(restore.target_volume)
        raise Abandon()
    legacy = c.volume_name is not None
    c.volume_name = restore.target_volume
    crash_point("start.restore.after_swap")
    with contextlib.suppress(GpuyardError):
        # Not there for a clone's first start; one that cannot go now is collected
        # later as an orphan (quarantined, never deleted on sight).
        driver.runtime_of(c.host_id).remove_volume(old, legacy=legacy)
    return True


def _swap(driver: ClusterDriver, c: Cluster, restore: VolumeRestore) -> bool:
    """Make the restored copy the cluster's volume (one guarded update with the end of
    the restore and an event). A change of the row meanwhile that leaves the start as
    it was (a policy update, progress) is read again and the swap tried again; False
    when the start is gone (stopped, terminated, on another host) or the restore was
    called off."""
    for _ in range(SWAP_ATTEMPTS):
        now = driver.ctx.clock.now()
        try:
            with driver.ctx.transaction() as session:
                row = session.get(VolumeRestore, restore.id)
                if row is None or row.status != RestoreStatus.RESTORING.value:
                    return False
                c.version = guarded_update(
                    session, c.id, c.version, now, volume_name=restore.target_volume
                )
                work.finish_restore(driver.ctx, restore.id, session=session)
                record_event(
                    session, c.id, now, "snapshot", f"restored snapshot {restore.snapshot_id}"
                )
            return True
        except Conflict:
            fresh = driver._load(c.id)
            if (
                fresh is None
                or fresh.status != ClusterStatus.STARTING.value
                or fresh.host_id != c.host_id
            ):
                return False
            c.version = fresh.version
    return False


def _give_up(driver: ClusterDriver, c: Cluster, restore: VolumeRestore, message: str) -> None:
    log.warning("cluster %s: restore of %s failed", c.id, restore.snapshot_id)

    def record(session: Session, cluster_id: str) -> None:
        work.finish_restore(driver.ctx, restore.id, error=message, session=session)
        release_compute(session, cluster_id)

    driver._transition(
        c, ClusterStatus.ERROR, f"error: {message}", also=record, error_message=message
    )
