"""Snapshots: a saved copy of a cluster's volume or a network volume, and restores of
one into a volume.

The API records intent (a ``creating`` row, a ``restoring`` row) and returns; the
reconciler's storage work (reconciler/clusters/snapshots.py) reads the volume through the
engine and keeps the data in the restic repository, recording its progress and
outcome through services/volumes/snapshot_work.py. Snapshots belong to their source's project:
another account's snapshot id, and one of a project the caller may not use (a key or
member restricted to some projects), is indistinguishable from none.
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
    SNAPSHOTTABLE_STATUSES,
    Consistency,
    RestoreStatus,
    SnapshotStatus,
    consistency_for,
)
from gpuyard.core.states import ClusterStatus
from gpuyard.observability.crash_points import crash_point
from gpuyard.services.billing.admission import refuse_closed_account
from gpuyard.services.billing.quotas import check_storage
from gpuyard.services.billing.storage import stop_storage_billing
from gpuyard.services.capacity.placement import lock_placement
from gpuyard.services.clusters.cluster_rows import load_cluster
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.clusters.moves import COPYING
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import in_usable_projects
from gpuyard.services.volumes.network_volumes import load_network_volume
from gpuyard.store.schema import (
    Cluster,
    NetworkVolume,
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


def _visible(principal: Principal) -> Select[Snapshot]:
    """The caller's snapshots (not deleted): of the acting account, in the projects
    the caller may use."""
    return select(Snapshot).where(
        Snapshot.account_id == principal.account_id,
        Snapshot.deleted_at.is_(None),
        in_usable_projects(principal, Snapshot.project_id),
    )


def load_snapshot(session: Session, principal: Principal, snapshot_id: str) -> Snapshot:
    """The caller's snapshot (not deleted), inside the caller's session;
    SnapshotNotFound otherwise, the same for another account's or an unusable
    project's id as for none."""
    snap = session.scalar(_visible(principal).where(Snapshot.id == snapshot_id))
    if snap is None:
        raise SnapshotNotFound(f"snapshot {snapshot_id!r} not found", {"snapshot_id": snapshot_id})
    return snap


def get_snapshot(ctx: Context, principal: Principal, snapshot_id: str) -> Snapshot:
    with ctx.read() as session:
        return load_snapshot(session, principal, snapshot_id)


def _filtered(
    principal: Principal,
    cluster_id: str | None,
    project_id: int | None,
    network_volume_id: str | None,
    status: SnapshotStatus | None,
) -> Select[Snapshot]:
    q = _visible(principal)
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
    """The caller's snapshots (its projects'), newest first (``created_at``, then ``id``, both
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
    q = _filtered(principal, cluster_id, project_id, network_volume_id, status)
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
    """The caller's snapshots (its projects'), newest first, filtered; with the total count (rows
    ``offset .. offset+limit``; ``snapshot_page`` pages by cursor)."""
    q = _filtered(principal, cluster_id, project_id, network_volume_id, status)
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
    principal.require_write()
    now = ctx.clock.now()
    with ctx.transaction() as session:
        refuse_closed_account(session, principal.account_id)
        cluster = load_cluster(session, principal, cluster_id)
        source = cluster_source(ctx, session, cluster)
        snap = add_snapshot(session, principal.account_id, source, name, description, now)
    crash_point("snapshot.after_request")
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
        volume = load_network_volume(session, principal, volume_id)
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
        snap = load_snapshot(session, principal, snapshot_id)
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


def restorable(session: Session, principal: Principal, snapshot_id: str) -> Snapshot:
    """The caller's ``ready`` snapshot. Raises SnapshotNotFound (none, another
    account's, a project's the caller may not use, deleted) or SnapshotNotReady
    (creating, failed)."""
    snap = load_snapshot(session, principal, snapshot_id)
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
        return pending_restore_in(session, holder_id)


def pending_restore_in(session: Session, holder_id: str) -> VolumeRestore | None:
    """The restore into ``holder_id``'s volume not done yet, if any, read in
    ``session`` (a start's one read of its pre-checks)."""
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
        volume = load_network_volume(session, principal, volume_id)
        snap = restorable(session, principal, snapshot_id)
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
