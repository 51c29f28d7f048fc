"""Snapshots: a saved copy of a cluster's volume or a network volume, and restores of
one into a volume.

The API records intent (a ``creating`` row, a ``restoring`` row) and returns; the
reconciler's storage work (reconciler/snapshots.py) reads the volume through the
engine and keeps the data in the restic repository. Snapshots belong to their
source's project: another account's snapshot id is indistinguishable from none.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select, tuple_
from sqlalchemy.orm import Session

from gpuyard.core import cursors
from gpuyard.core.errors import (
    InvalidState,
    SnapshotNotFound,
    SnapshotNotReady,
)
from gpuyard.core.ids import new_snapshot_id
from gpuyard.core.snapshots import (
    MOUNTED_STATUSES,
    SNAPSHOTTABLE_STATUSES,
    Consistency,
    RestoreStatus,
    SnapshotFormat,
    SnapshotStatus,
    consistency_for,
)
from gpuyard.core.states import ClusterStatus
from gpuyard.services.admission import refuse_closed_account
from gpuyard.services.auth import Principal
from gpuyard.services.context import Context
from gpuyard.services.lifecycle import record_event
from gpuyard.services.moves import COPYING
from gpuyard.services.network_volumes import load_network_volume
from gpuyard.services.placement import lock_placement
from gpuyard.services.quotas import check_storage
from gpuyard.services.storage_billing import GB, bill_storage, stop_storage_billing
from gpuyard.store.schema import (
    Cluster,
    NetworkVolume,
    Project,
    Snapshot,
    VolumeMove,
    VolumeRestore,
)

SNAPSHOT_METER = "snapshot"
DEFAULT_PER_PAGE = 50
MAX_PER_PAGE = 500


@dataclass(frozen=True)
class SnapshotSource:
    """The volume a snapshot reads: where it is and what it belongs to."""

    project_id: int
    host_id: int
    volume_name: str
    volume_gb: int
    consistency: Consistency
    cluster_id: str | None
    network_volume_id: str | None


# -- reading -------------------------------------------------------------------------


def _visible(account_id: int) -> Select[Snapshot]:
    return select(Snapshot).where(Snapshot.account_id == account_id, Snapshot.deleted_at.is_(None))


def load_snapshot(session: Session, account_id: int, snapshot_id: str) -> Snapshot:
    """The account's snapshot (not deleted); SnapshotNotFound otherwise, the same for
    another account's id as for none."""
    snap = session.scalar(_visible(account_id).where(Snapshot.id == snapshot_id))
    if snap is None:
        raise SnapshotNotFound(f"snapshot {snapshot_id!r} not found", {"snapshot_id": snapshot_id})
    return snap


def get_snapshot(ctx: Context, principal: Principal, snapshot_id: str) -> Snapshot:
    with ctx.read() as session:
        return load_snapshot(session, principal.account_id, snapshot_id)


def _filtered(
    account_id: int,
    cluster_id: str | None,
    project_id: int | None,
    network_volume_id: str | None,
    status: SnapshotStatus | None,
) -> Select[Snapshot]:
    q = _visible(account_id)
    if cluster_id is not None:
        q = q.where(Snapshot.source_cluster_id == cluster_id)
    if project_id is not None:
        q = q.where(Snapshot.project_id == project_id)
    if network_volume_id is not None:
        q = q.where(Snapshot.source_network_volume_id == network_volume_id)
    if status is not None:
        q = q.where(Snapshot.status == status.value)
    return q


SNAPSHOTS_LIST = "snapshots"
SNAPSHOT_KEY: cursors.KeyShape = ("time", "str")


@dataclass(frozen=True)
class SnapshotPage:
    """One page of snapshots, the total matching and the next page's cursor (None on
    the last)."""

    snapshots: list[Snapshot]
    total: int
    next_cursor: str | None


def snapshot_page(
    ctx: Context,
    principal: Principal,
    *,
    cluster_id: str | None = None,
    project_id: int | None = None,
    network_volume_id: str | None = None,
    status: SnapshotStatus | None = None,
    per_page: int = DEFAULT_PER_PAGE,
    page: int = 1,
    cursor: str | None = None,
) -> SnapshotPage:
    """The account's snapshots, newest first (``created_at``, then ``id``, both
    descending: ``ix_snapshots_account_created``'s order), filtered. With ``cursor``
    (an earlier page's ``next_cursor`` with the same filters) the rows after it, else
    ``page`` by offset. Raises ValidationFailed naming ``cursor`` for a bad one."""
    cursor = cursor or None
    cursors.check_page(page, cursor)
    bound: dict[str, cursors.FilterValue] = {
        "account": principal.account_id,
        "cluster_id": cluster_id,
        "project_id": project_id,
        "network_volume_id": network_volume_id,
        "status": status.value if status is not None else None,
    }
    after = cursors.decode(cursor, SNAPSHOTS_LIST, bound, SNAPSHOT_KEY) if cursor else None
    q = _filtered(principal.account_id, cluster_id, project_id, network_volume_id, status)
    with ctx.read() as session:
        total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
        if after is not None:
            q = q.where(tuple_(Snapshot.created_at, Snapshot.id) < tuple_(*after))
        else:
            q = q.offset((page - 1) * per_page)
        # One row more than the page tells whether a next page exists.
        q = q.order_by(Snapshot.created_at.desc(), Snapshot.id.desc()).limit(per_page + 1)
        rows = list(session.scalars(q))
    snaps = rows[:per_page]
    next_cursor = None
    if len(rows) > per_page:
        last = snaps[-1]
        next_cursor = cursors.encode(SNAPSHOTS_LIST, bound, (last.created_at, last.id))
    return SnapshotPage(snaps, int(total), next_cursor)


def list_snapshots(
    ctx: Context,
    principal: Principal,
    *,
    cluster_id: str | None = None,
    project_id: int | None = None,
    network_volume_id: str | None = None,
    status: SnapshotStatus | None = None,
    limit: int = DEFAULT_PER_PAGE,
    offset: int = 0,
) -> tuple[list[Snapshot], int]:
    """The account's snapshots, newest first, filtered; with the total count (rows
    ``offset .. offset+limit``; ``snapshot_page`` pages by cursor)."""
    q = _filtered(principal.account_id, cluster_id, project_id, network_volume_id, status)
    with ctx.read() as session:
        total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
        rows = list(
            session.scalars(
                q.order_by(Snapshot.created_at.desc(), Snapshot.id.desc())
                .limit(limit)
                .offset(offset)
            )
        )
    return rows, int(total)


def snapshot_view(s: Snapshot) -> dict[str, Any]:
    """A snapshot as every surface shows it."""

    def iso(t: datetime | None) -> str | None:
        return t.isoformat().replace("+00:00", "Z") if t is not None else None

    progress = None
    if s.status == SnapshotStatus.CREATING.value:
        progress = {"bytes_done": s.bytes_done}
    return {
        "id": s.id,
        "name": s.name,
        "description": s.description,
        "status": s.status,
        "error": s.error,
        "source_cluster_id": s.source_cluster_id,
        "source_network_volume_id": s.source_network_volume_id,
        "project_id": s.project_id,
        "consistency": s.consistency,
        "size_bytes": s.size_bytes,
        "stored_bytes": s.stored_bytes,
        "file_count": s.file_count,
        "volume_gb": s.volume_gb,
        "progress": progress,
        "created_at": iso(s.created_at),
        "ready_at": iso(s.ready_at),
    }


# -- taking ----------------------------------------------------------------------------


def _moving(session: Session, cluster_id: str) -> bool:
    return (
        session.scalar(
            select(VolumeMove.cluster_id).where(
                VolumeMove.cluster_id == cluster_id, VolumeMove.status == COPYING
            )
        )
        is not None
    )


def _restoring(session: Session, holder_id: str) -> bool:
    return (
        session.scalar(
            select(VolumeRestore.id).where(
                VolumeRestore.holder_id == holder_id,
                VolumeRestore.status == RestoreStatus.RESTORING.value,
            )
        )
        is not None
    )


def refuse_while_restoring(session: Session, volume_id: str) -> None:
    """A network volume being restored cannot be mounted until the restored copy is in
    place (a container started meanwhile would keep the old data). InvalidState."""
    if _restoring(session, volume_id):
        raise InvalidState(
            f"network volume {volume_id} is being restored; start once the restore is done",
            {"network_volume_id": volume_id},
        )


def network_volume_source(session: Session, volume: NetworkVolume) -> SnapshotSource:
    """A network volume as a snapshot's source: crash-consistent while any cluster
    that mounts it may run."""
    statuses = {
        ClusterStatus(s)
        for s in session.scalars(
            select(Cluster.status).where(
                Cluster.network_volume_id == volume.id,
                Cluster.status != ClusterStatus.TERMINATED.value,
            )
        )
    }
    return SnapshotSource(
        project_id=volume.project_id,
        host_id=volume.host_id,
        volume_name=volume.volume_name,
        volume_gb=volume.size_gb,
        consistency=consistency_for(statuses),
        cluster_id=None,
        network_volume_id=volume.id,
    )


def cluster_source(ctx: Context, session: Session, cluster: Cluster) -> SnapshotSource:
    """The volume a snapshot of ``cluster`` reads: its own, or the network volume it
    mounts. Raises InvalidState when there is none to read now."""
    status = ClusterStatus(cluster.status)
    if status not in SNAPSHOTTABLE_STATUSES:
        raise InvalidState(
            f"cannot snapshot a cluster that is {status.value}",
            {
                "current_status": status.value,
                "required_status": sorted(s.value for s in SNAPSHOTTABLE_STATUSES),
                "suggestion": "wait until the cluster is running or stopped",
            },
        )
    if cluster.network_volume_id is not None:
        volume = session.get(NetworkVolume, cluster.network_volume_id)
        if volume is None or volume.deleted_at is not None:
            raise InvalidState(
                "the cluster's network volume is gone",
                {"network_volume_id": cluster.network_volume_id},
            )
        refuse_while_restoring(session, volume.id)
        source = network_volume_source(session, volume)
        return SnapshotSource(**{**source.__dict__, "cluster_id": cluster.id})
    if cluster.volume_gb <= 0 or cluster.host_id is None:
        raise InvalidState(
            "this cluster has no volume to snapshot",
            {"volume_gb": cluster.volume_gb, "suggestion": "create clusters with volume_gb > 0"},
        )
    if _moving(session, cluster.id) or _restoring(session, cluster.id):
        raise InvalidState(
            "the cluster's volume is being moved or restored; try again when it is done",
            {"current_status": status.value},
        )
    return SnapshotSource(
        project_id=cluster.project_id,
        host_id=cluster.host_id,
        volume_name=cluster.volume_name or ctx.ownership.volume(cluster.id),
        volume_gb=cluster.volume_gb,
        consistency=consistency_for({status}),
        cluster_id=cluster.id,
        network_volume_id=None,
    )


def add_snapshot(
    session: Session,
    account_id: int,
    source: SnapshotSource,
    name: str,
    description: str,
    now: datetime,
) -> Snapshot:
    """Record a ``creating`` snapshot of ``source`` (the reconciler takes it). One
    snapshot of a volume is taken at a time: InvalidState while another is."""
    busy = session.scalar(
        select(Snapshot.id).where(
            Snapshot.host_id == source.host_id,
            Snapshot.volume_name == source.volume_name,
            Snapshot.status == SnapshotStatus.CREATING.value,
        )
    )
    if busy is not None:
        raise InvalidState(
            f"snapshot {busy} of this volume is still being taken; try again when it is done",
            {"snapshot_id": busy},
        )
    snapshot_id = new_snapshot_id()
    snap = Snapshot(
        id=snapshot_id,
        account_id=account_id,
        project_id=source.project_id,
        name=name or f"snapshot-{now.strftime('%Y%m%d-%H%M%S')}",
        description=description,
        source_cluster_id=source.cluster_id,
        source_network_volume_id=source.network_volume_id,
        host_id=source.host_id,
        volume_name=source.volume_name,
        volume_gb=source.volume_gb,
        status=SnapshotStatus.CREATING.value,
        consistency=source.consistency.value,
        bytes_done=0,
        created_at=now,
    )
    session.add(snap)
    # Within the account's and project's snapshot quotas (counting this one).
    check_storage(session, account_id, source.project_id, snapshot_id=snapshot_id)
    if source.cluster_id is not None:
        record_event(
            session,
            source.cluster_id,
            now,
            "snapshot",
            f"snapshot {snapshot_id} requested ({source.consistency.value})",
        )
    return snap


def create_snapshot(
    ctx: Context, principal: Principal, cluster_id: str, name: str, description: str
) -> Snapshot:
    """Snapshot ``cluster_id``'s volume. Raises ClusterNotFound, InvalidState."""
    from gpuyard.services.clusters import load_cluster

    principal.require_write()
    now = ctx.clock.now()
    with ctx.transaction() as session:
        refuse_closed_account(session, principal.account_id)
        cluster = load_cluster(session, principal, cluster_id)
        source = cluster_source(ctx, session, cluster)
        snap = add_snapshot(session, principal.account_id, source, name, description, now)
    ctx.wake()
    return snap


def create_volume_snapshot(
    ctx: Context, principal: Principal, volume_id: str, name: str, description: str
) -> Snapshot:
    """Snapshot a network volume. Raises NetworkVolumeNotFound, InvalidState."""
    principal.require_write()
    now = ctx.clock.now()
    with ctx.transaction() as session:
        refuse_closed_account(session, principal.account_id)
        volume = load_network_volume(session, principal.account_id, volume_id)
        if _restoring(session, volume.id):
            raise InvalidState(
                "the network volume is being restored; try again when it is done",
                {"network_volume_id": volume.id},
            )
        source = network_volume_source(session, volume)
        snap = add_snapshot(session, principal.account_id, source, name, description, now)
    ctx.wake()
    return snap


def delete_snapshot(ctx: Context, principal: Principal, snapshot_id: str) -> Snapshot:
    """Delete a ready or failed snapshot: it disappears from every list at once and
    stops being billed; its data leaves the repository in the background. Raises
    SnapshotNotFound, InvalidState (still being taken, or being restored)."""
    principal.require_write()
    now = ctx.clock.now()
    with ctx.transaction() as session:
        snap = load_snapshot(session, principal.account_id, snapshot_id)
        if snap.status == SnapshotStatus.CREATING.value:
            raise InvalidState(
                "the snapshot is still being taken; delete it once it is ready or failed",
                {"current_status": snap.status, "required_status": ["ready", "failed"]},
            )
        restoring = list(
            session.scalars(
                select(VolumeRestore.holder_id).where(
                    VolumeRestore.snapshot_id == snap.id,
                    VolumeRestore.status == RestoreStatus.RESTORING.value,
                )
            )
        )
        if restoring:
            raise InvalidState(
                "the snapshot is being restored; delete it once the restore is done",
                {"restoring_into": restoring},
            )
        snap.deleted_at = now
        stop_storage_billing(session, snap.id, now)
    ctx.wake()
    return snap


# -- restoring -------------------------------------------------------------------------


def restorable(session: Session, account_id: int, snapshot_id: str) -> Snapshot:
    """The account's ``ready`` snapshot. Raises SnapshotNotFound (none, another
    account's, deleted) or SnapshotNotReady (creating, failed)."""
    snap = load_snapshot(session, account_id, snapshot_id)
    if snap.status != SnapshotStatus.READY.value:
        raise SnapshotNotReady(
            f"snapshot {snapshot_id} is {snap.status}; only a ready snapshot can be restored",
            {"snapshot_id": snapshot_id, "status": snap.status, "error": snap.error},
        )
    return snap


def restore_target(prefix: str, holder_id: str) -> str:
    """A new engine volume name for a restore into ``holder_id``'s volume."""
    return f"{prefix}-rs-{holder_id}-{secrets.token_hex(3)}"


def add_restore(
    session: Session,
    holder_id: str,
    snap: Snapshot,
    host_id: int,
    target: str,
    now: datetime,
    *,
    after_snapshot_id: str | None = None,
) -> VolumeRestore:
    """Record a restore of ``snap`` into ``holder_id``'s volume on ``host_id`` (an
    earlier one still recorded as restoring is replaced: the latest wins)."""
    for old in session.scalars(
        select(VolumeRestore).where(
            VolumeRestore.holder_id == holder_id,
            VolumeRestore.status == RestoreStatus.RESTORING.value,
        )
    ):
        old.status = RestoreStatus.FAILED.value
        old.error = "replaced by a later restore"
        old.finished_at = now
    row = VolumeRestore(
        holder_id=holder_id,
        snapshot_id=snap.id,
        after_snapshot_id=after_snapshot_id,
        host_id=host_id,
        target_volume=target,
        status=RestoreStatus.RESTORING.value,
        bytes_done=0,
        total_bytes=0,
        started_at=now,
    )
    session.add(row)
    return row


def pending_restore(ctx: Context, holder_id: str) -> VolumeRestore | None:
    with ctx.read() as session:
        return session.scalar(
            select(VolumeRestore).where(
                VolumeRestore.holder_id == holder_id,
                VolumeRestore.status == RestoreStatus.RESTORING.value,
            )
        )


def restore_volume_of_network_volume(
    ctx: Context, principal: Principal, volume_id: str, snapshot_id: str
) -> VolumeRestore:
    """Restore a snapshot into a network volume that no running cluster mounts.
    Raises NetworkVolumeNotFound, SnapshotNotFound, SnapshotNotReady, InvalidState."""
    principal.require_write()
    now = ctx.clock.now()
    with ctx.transaction() as session:
        # Serialised with starts and creates that would mount it, and with its delete.
        lock_placement(session)
        volume = load_network_volume(session, principal.account_id, volume_id)
        snap = restorable(session, principal.account_id, snapshot_id)
        reading = session.scalar(
            select(Snapshot.id).where(
                Snapshot.source_network_volume_id == volume.id,
                Snapshot.status == SnapshotStatus.CREATING.value,
            )
        )
        if reading is not None:
            raise InvalidState(
                f"snapshot {reading} of this network volume is still being taken",
                {"snapshot_id": reading},
            )
        users = list(
            session.scalars(
                select(Cluster.id).where(
                    Cluster.network_volume_id == volume.id,
                    Cluster.status.in_(
                        [
                            ClusterStatus.PENDING.value,
                            ClusterStatus.STARTING.value,
                            ClusterStatus.RUNNING.value,
                            ClusterStatus.STOPPING.value,
                        ]
                    ),
                )
            )
        )
        if users:
            raise InvalidState(
                "stop the clusters that mount this network volume before restoring it",
                {"cluster_ids": users, "required_status": ["stopped"]},
            )
        if _restoring(session, volume.id):
            raise InvalidState("a restore of this network volume is in progress", {})
        row = add_restore(
            session,
            volume.id,
            snap,
            volume.host_id,
            restore_target(ctx.ownership.prefix, volume.id),
            now,
        )
    ctx.wake()
    return row


# -- the worker's bookkeeping ----------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """What claim_snapshot found: the snapshot to take (None: nothing to do), and
    whether it was found interrupted (and failed, so its partial data must go)."""

    snapshot: Snapshot | None
    interrupted: bool = False
    # For an interrupted one: where its volume is (a helper may still read it).
    host_id: int | None = None
    volume_name: str | None = None


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
            return Claim(None, True, snap.host_id, snap.volume_name)
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
                f"files, {taken.stored_bytes} bytes stored, {taken.seconds:.1f} s",
            )
    return True


def parent_for(ctx: Context, snap: Snapshot) -> str | None:
    """The restic id of the latest ``tree`` snapshot of the same engine volume on the
    same host (still kept): what restic compares files with, so it reads only what
    changed. None: read everything."""
    with ctx.read() as session:
        return session.scalar(
            select(Snapshot.restic_id)
            .where(
                Snapshot.volume_name == snap.volume_name,
                Snapshot.host_id == snap.host_id,
                Snapshot.format == SnapshotFormat.TREE.value,
                Snapshot.status == SnapshotStatus.READY.value,
                Snapshot.deleted_at.is_(None),
                Snapshot.restic_id.is_not(None),
                Snapshot.id != snap.id,
            )
            .order_by(Snapshot.ready_at.desc())
            .limit(1)
        )


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
    mine = Snapshot.source_cluster_id == cluster.id
    if cluster.network_volume_id is not None:
        mine = mine | (Snapshot.source_network_volume_id == cluster.network_volume_id)
    with ctx.read() as session:
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


def restore_holders(ctx: Context) -> list[tuple[str, int]]:
    """(holder id, host id) of every restore in flight into a network volume
    (clusters' restores are carried out by their start)."""
    with ctx.read() as session:
        return [
            (holder, host_id)
            for holder, host_id in session.execute(
                select(VolumeRestore.holder_id, VolumeRestore.host_id)
                .join(NetworkVolume, NetworkVolume.id == VolumeRestore.holder_id)
                .where(VolumeRestore.status == RestoreStatus.RESTORING.value)
            )
        ]


def snapshots_to_take(ctx: Context) -> list[tuple[str, int]]:
    """(snapshot id, host id) of every snapshot being taken."""
    with ctx.read() as session:
        return [
            (sid, host_id)
            for sid, host_id in session.execute(
                select(Snapshot.id, Snapshot.host_id).where(
                    Snapshot.status == SnapshotStatus.CREATING.value
                )
            )
        ]


def data_to_forget(ctx: Context) -> list[tuple[str, str | None]]:
    """(snapshot id, restic id) of deleted or failed snapshots whose data may still be
    in the repository."""
    with ctx.read() as session:
        return [
            (sid, rid)
            for sid, rid in session.execute(
                select(Snapshot.id, Snapshot.restic_id).where(
                    Snapshot.restic_id.is_not(None),
                    (Snapshot.deleted_at.is_not(None))
                    | (Snapshot.status == SnapshotStatus.FAILED.value),
                )
            )
        ]


def keep_for_forgetting(ctx: Context, snapshot_id: str, restic_id: str) -> None:
    """Record data of a failed snapshot that could not be forgotten yet (the
    maintenance pass forgets what failed and deleted rows still name)."""
    with ctx.transaction() as session:
        snap = session.get(Snapshot, snapshot_id)
        if snap is not None and snap.restic_id is None:
            snap.restic_id = restic_id


def forgotten(ctx: Context, snapshot_ids: list[str]) -> None:
    with ctx.transaction() as session:
        for sid in snapshot_ids:
            snap = session.get(Snapshot, sid)
            if snap is not None:
                snap.restic_id = None


def account_of_project(session: Session, project_id: int) -> int | None:
    return session.scalar(select(Project.account_id).where(Project.id == project_id))
