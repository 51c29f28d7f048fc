"""The snapshot worker's bookkeeping: what the reconciler's storage work
(reconciler/clusters/snapshots.py, reconciler/clusters/restore.py) reads and records in the
database around restic's runs — claiming a snapshot to take, its progress, its outcome
and billing, restores' progress and outcomes, and data still to forget.

The API side (recording intent, reading, deleting) is services/volumes/snapshots.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.snapshots import (
    MOUNTED_STATUSES,
    RestoreStatus,
    SnapshotFormat,
    SnapshotRepository,
    SnapshotStatus,
)
from gpuyard.services.billing.storage import GB, bill_storage
from gpuyard.services.capacity.placement import lock_placement
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.context import Context
from gpuyard.services.volumes.snapshots import SNAPSHOT_METER
from gpuyard.store.schema import Cluster, NetworkVolume, Snapshot, VolumeRestore


@dataclass(frozen=True)
class Claim:
    """What claim_snapshot found: the snapshot to take (None: nothing to do), and
    whether it was found interrupted (and failed, so its partial data must go)."""

    snapshot: Snapshot | None
    interrupted: bool = False
    # For an interrupted one: where its volume is (a helper may still read it), and
    # whose repository may hold what it committed.
    host_id: int | None = None
    volume_name: str | None = None
    account_id: int | None = None


def claim_snapshot(ctx: Context, snapshot_id: str, worker: str) -> Claim:
    """Make ``worker`` the taker of a ``creating`` snapshot. A snapshot some worker
    began and left (a server that stopped or died mid-way; one job runs per snapshot
    at a time) is failed here: a half-read volume is never continued."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        snap = session.get(Snapshot, snapshot_id)
        if snap is None or snap.status != SnapshotStatus.CREATING.value:
            return Claim(None)
        if snap.worker is not None:
            fail_snapshot_in(
                session,
                snap,
                "interrupted: the server taking it stopped before it was done",
                now,
            )
            return Claim(None, True, snap.host_id, snap.volume_name, snap.account_id)
        snap.worker = worker
        snap.heartbeat_at = now
        session.flush()
        session.expunge(snap)
        return Claim(snap)


def heartbeat(ctx: Context, snapshot_id: str, bytes_done: int) -> None:
    with ctx.transaction() as session:
        snap = session.get(Snapshot, snapshot_id)
        if snap is not None and snap.status == SnapshotStatus.CREATING.value:
            snap.bytes_done = bytes_done
            snap.heartbeat_at = ctx.clock.now()


def fail_snapshot_in(session: Session, snap: Snapshot, reason: str, now: datetime) -> None:
    snap.status = SnapshotStatus.FAILED.value
    snap.error = reason
    snap.heartbeat_at = now
    if snap.source_cluster_id is not None:
        record_event(
            session, snap.source_cluster_id, now, "snapshot", f"snapshot {snap.id} failed: {reason}"
        )


def fail_snapshot(ctx: Context, snapshot_id: str, reason: str) -> None:
    with ctx.transaction() as session:
        snap = session.get(Snapshot, snapshot_id)
        if snap is not None and snap.status == SnapshotStatus.CREATING.value:
            fail_snapshot_in(session, snap, reason, ctx.clock.now())


@dataclass(frozen=True)
class Taken:
    restic_id: str
    size_bytes: int
    stored_bytes: int
    file_count: int
    # The tar stream's length: what a restore of it reads back.
    stream_bytes: int
    seconds: float
    format: SnapshotFormat = SnapshotFormat.TAR
    # Files restic found unchanged since the parent snapshot (None: not told).
    files_unmodified: int | None = None


def finish_snapshot(ctx: Context, snapshot_id: str, taken: Taken) -> bool:
    """Mark the snapshot ready and start billing its stored bytes. False when it is no
    longer ``creating`` (failed meanwhile): the caller forgets the data."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        snap = session.get(Snapshot, snapshot_id)
        if snap is None or snap.status != SnapshotStatus.CREATING.value:
            return False
        snap.status = SnapshotStatus.READY.value
        snap.restic_id = taken.restic_id
        snap.repository = SnapshotRepository.ACCOUNT.value
        snap.format = taken.format.value
        snap.size_bytes = taken.size_bytes
        snap.stored_bytes = taken.stored_bytes
        snap.file_count = taken.file_count
        snap.bytes_done = taken.stream_bytes
        snap.ready_at = now
        snap.heartbeat_at = now
        if snap.deleted_at is None:
            bill_storage(
                session,
                holder_id=snap.id,
                project_id=snap.project_id,
                meter=SNAPSHOT_METER,
                gb=taken.stored_bytes / GB,
                price_gb_month=ctx.settings.price_snapshot_gb_month,
                now=now,
            )
        if snap.source_cluster_id is not None:
            record_event(
                session,
                snap.source_cluster_id,
                now,
                "snapshot",
                f"snapshot {snap.id} ready: {taken.size_bytes} bytes in {taken.file_count} "
                f"files, {taken.stored_bytes} bytes stored, {taken.seconds:.1f} s"
                + (
                    f", {taken.files_unmodified} files unchanged"
                    if taken.files_unmodified is not None
                    else ""
                ),
            )
    return True


def parent_snapshot(ctx: Context, snap: Snapshot) -> str | None:
    """The restic id of the latest ready ``tree`` snapshot of ``snap``'s engine volume
    in its account's repository (the parent restic compares the volume against), None
    when there is none."""
    with ctx.read() as session:
        return session.scalars(
            select(Snapshot.restic_id)
            .where(
                Snapshot.account_id == snap.account_id,
                Snapshot.host_id == snap.host_id,
                Snapshot.volume_name == snap.volume_name,
                Snapshot.status == SnapshotStatus.READY.value,
                Snapshot.format == SnapshotFormat.TREE.value,
                Snapshot.repository == SnapshotRepository.ACCOUNT.value,
                Snapshot.restic_id.is_not(None),
                Snapshot.deleted_at.is_(None),  # its data may be forgotten already
                Snapshot.id != snap.id,
            )
            .order_by(Snapshot.ready_at.desc(), Snapshot.created_at.desc())
            .limit(1)
        ).first()


def restore_progress(ctx: Context, restore_id: int, done: int, total: int) -> None:
    with ctx.transaction() as session:
        row = session.get(VolumeRestore, restore_id)
        if row is not None and row.status == RestoreStatus.RESTORING.value:
            row.bytes_done = done
            row.total_bytes = total


def finish_restore(
    ctx: Context, restore_id: int, *, error: str | None = None, session: Session | None = None
) -> None:
    """Mark a restore done, or failed with ``error``."""
    if session is None:
        with ctx.transaction() as own:
            finish_restore(ctx, restore_id, error=error, session=own)
        return
    row = session.get(VolumeRestore, restore_id)
    if row is None:
        return
    row.status = RestoreStatus.FAILED.value if error else RestoreStatus.DONE.value
    row.error = error
    row.finished_at = ctx.clock.now()


def swap_network_volume(ctx: Context, restore_id: int, volume_id: str, target: str) -> bool:
    """The restored copy becomes the network volume's engine volume, unless the volume
    was deleted or a cluster came to mount it meanwhile (then the restore fails and the
    caller removes the copy). Returns whether it was swapped in."""
    with ctx.transaction() as session:
        lock_placement(session)
        volume = session.get(NetworkVolume, volume_id)
        users = session.scalar(
            select(Cluster.id).where(
                Cluster.network_volume_id == volume_id,
                Cluster.status.in_([s.value for s in MOUNTED_STATUSES]),
            )
        )
        if volume is None or volume.deleted_at is not None or users is not None:
            finish_restore(
                ctx,
                restore_id,
                error="the network volume was deleted or mounted meanwhile",
                session=session,
            )
            return False
        volume.volume_name = target
        volume.updated_at = ctx.clock.now()
        volume.version += 1
        finish_restore(ctx, restore_id, session=session)
    return True


def snapshot_reading(ctx: Context, cluster: Cluster) -> bool:
    """Whether a snapshot of the cluster's volume (its own, or the network volume it
    mounts) is still being read. Its start waits: a move or a restore would remove the
    volume under the reader, and a ``stopped`` snapshot must not see a running
    container."""
    with ctx.read() as session:
        return snapshot_reading_in(session, cluster)


def snapshot_reading_in(session: Session, cluster: Cluster) -> bool:
    """:func:`snapshot_reading`, asked in ``session`` (a start's one read of its
    pre-checks, reconciler/clusters/start_checks.py)."""
    mine = Snapshot.source_cluster_id == cluster.id
    if cluster.network_volume_id is not None:
        mine = mine | (Snapshot.source_network_volume_id == cluster.network_volume_id)
    return (
        session.scalar(
            select(Snapshot.id)
            .where(mine, Snapshot.status == SnapshotStatus.CREATING.value)
            .limit(1)
        )
        is not None
    )


def before_snapshot_outcome(ctx: Context, restore: VolumeRestore) -> str | None:
    """For a restore that waits on a snapshot taken first: ``"pending"`` while it is
    being taken, the failure reason if it failed, None when it is ready (or none)."""
    if restore.after_snapshot_id is None:
        return None
    with ctx.read() as session:
        snap = session.get(Snapshot, restore.after_snapshot_id)
    if snap is None or snap.status == SnapshotStatus.READY.value:
        return None
    if snap.status == SnapshotStatus.CREATING.value:
        return "pending"
    return snap.error or "failed"


def restore_holders(session: Session) -> list[tuple[str, int]]:
    """(holder id, host id) of every restore in flight into a network volume
    (clusters' restores are carried out by their start)."""
    return [
        (holder, host_id)
        for holder, host_id in session.execute(
            select(VolumeRestore.holder_id, VolumeRestore.host_id)
            .join(NetworkVolume, NetworkVolume.id == VolumeRestore.holder_id)
            .where(VolumeRestore.status == RestoreStatus.RESTORING.value)
        )
    ]


def snapshots_to_take(session: Session) -> list[tuple[str, int]]:
    """(snapshot id, host id) of every snapshot being taken."""
    return [
        (sid, host_id)
        for sid, host_id in session.execute(
            select(Snapshot.id, Snapshot.host_id).where(
                Snapshot.status == SnapshotStatus.CREATING.value
            )
        )
    ]


@dataclass(frozen=True)
class Unwanted:
    """Data of a deleted or failed snapshot still in a repository: its account's
    (``shared`` false) or the installation-wide one of earlier versions."""

    snapshot_id: str
    restic_id: str
    account_id: int
    shared: bool


def data_to_forget(ctx: Context) -> list[Unwanted]:
    """The data of deleted or failed snapshots that may still be in a repository."""
    with ctx.read() as session:
        return [
            Unwanted(sid, rid or "", account_id, repository is None)
            for sid, rid, account_id, repository in session.execute(
                select(
                    Snapshot.id, Snapshot.restic_id, Snapshot.account_id, Snapshot.repository
                ).where(
                    Snapshot.restic_id.is_not(None),
                    (Snapshot.deleted_at.is_not(None))
                    | (Snapshot.status == SnapshotStatus.FAILED.value),
                )
            )
        ]


def keep_for_forgetting(ctx: Context, snapshot_id: str, restic_id: str) -> None:
    """Record data of a failed snapshot that could not be forgotten yet (in its
    account's repository: the maintenance pass forgets what failed and deleted rows
    still name)."""
    with ctx.transaction() as session:
        snap = session.get(Snapshot, snapshot_id)
        if snap is not None and snap.restic_id is None:
            snap.restic_id = restic_id
            snap.repository = SnapshotRepository.ACCOUNT.value


def forgotten(ctx: Context, snapshot_ids: list[str]) -> None:
    with ctx.transaction() as session:
        for sid in snapshot_ids:
            snap = session.get(Snapshot, sid)
            if snap is not None:
                snap.restic_id = None


# -- the installation-wide repository of earlier versions ---------------------------


@dataclass(frozen=True)
class Legacy:
    """A kept snapshot whose data is still in the installation-wide repository."""

    snapshot_id: str
    restic_id: str
    account_id: int


def legacy_snapshots(ctx: Context) -> list[Legacy]:
    """Ready, kept snapshots whose data is in the installation-wide repository, by
    account."""
    with ctx.read() as session:
        return [
            Legacy(sid, rid or "", account_id)
            for sid, rid, account_id in session.execute(
                select(Snapshot.id, Snapshot.restic_id, Snapshot.account_id)
                .where(
                    Snapshot.repository.is_(None),
                    Snapshot.restic_id.is_not(None),
                    Snapshot.status == SnapshotStatus.READY.value,
                    Snapshot.deleted_at.is_(None),
                )
                .order_by(Snapshot.account_id, Snapshot.created_at)
            )
        ]


def moved_to_account(
    ctx: Context, snapshot_id: str, old_restic_id: str, new_restic_id: str
) -> bool:
    """Record that the snapshot's data is now ``new_restic_id`` in its account's
    repository; only while the row still names ``old_restic_id`` in the
    installation-wide one (a guarded update). Returns whether it was recorded."""
    with ctx.transaction() as session:
        snap = session.get(Snapshot, snapshot_id)
        if snap is None or snap.repository is not None or snap.restic_id != old_restic_id:
            return False
        snap.restic_id = new_restic_id
        snap.repository = SnapshotRepository.ACCOUNT.value
    return True


def in_account_repositories(ctx: Context, snapshot_ids: list[str]) -> set[str]:
    """Which of ``snapshot_ids`` keep their data in their accounts' repositories (a
    copy left in the installation-wide one is not needed)."""
    with ctx.read() as session:
        return set(
            session.scalars(
                select(Snapshot.id).where(
                    Snapshot.id.in_(snapshot_ids),
                    Snapshot.repository == SnapshotRepository.ACCOUNT.value,
                )
            )
        )


def restic_ids_of(ctx: Context, snapshot_ids: list[str]) -> dict[str, str | None]:
    """The restic id each of ``snapshot_ids`` names now."""
    with ctx.read() as session:
        return {
            sid: rid
            for sid, rid in session.execute(
                select(Snapshot.id, Snapshot.restic_id).where(Snapshot.id.in_(snapshot_ids))
            )
        }


def accounts_with_snapshots(ctx: Context) -> list[int]:
    """Accounts whose repository may hold data (any snapshot ever asked for)."""
    with ctx.read() as session:
        return list(session.scalars(select(Snapshot.account_id).distinct()))
