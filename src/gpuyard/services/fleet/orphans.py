"""Quarantined volumes (``orphan_volumes``): what the store knows, listing for admins,
and deletion (by an admin, or by the reconciler once the retention has passed).
See reconciler/duties/orphans.py for how volumes get here."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from gpuyard.core.errors import Conflict, GpuyardError, NotFound
from gpuyard.core.snapshots import RestoreStatus
from gpuyard.core.states import ClusterStatus
from gpuyard.core.training.clusters import NodeName
from gpuyard.runtimes.base import Runtime
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal, Scope
from gpuyard.services.volumes.network_volumes import known_engine_names
from gpuyard.store.schema import Cluster, Host, OrphanVolume, TrainingCluster, VolumeRestore

log = logging.getLogger(__name__)

# Every status but terminated, spelled out: an IN list reads the status index, where
# ``!= terminated`` would walk every terminated cluster ever made (each volume scan).
_LIVE = [s.value for s in ClusterStatus if s is not ClusterStatus.TERMINATED]


def known_volume_names(ctx: Context) -> set[str]:
    """Every engine volume name the database knows to be in use: live clusters'
    volumes, network volumes (live, or deleted with their removal pending) and live
    training clusters' Slurm state volumes."""
    with ctx.read() as session:
        networked = known_engine_names(session)
        clusters = session.execute(
            select(Cluster.id, Cluster.volume_name).where(Cluster.status.in_(_LIVE))
        ).all()
        trainings = session.execute(
            select(TrainingCluster.id, TrainingCluster.name_prefix).where(
                TrainingCluster.deleted_at.is_(None)
            )
        ).all()
        # A snapshot being restored goes into a new volume that replaces the old one.
        restoring = session.scalars(
            select(VolumeRestore.target_volume).where(
                VolumeRestore.status == RestoreStatus.RESTORING.value
            )
        ).all()
    names = {name or ctx.ownership.volume(cid) for cid, name in clusters}
    names.update(restoring)
    names.update(NodeName(tid, prefix).state_volume for tid, prefix in trainings)
    names.update(networked)
    return names


def list_orphans(
    ctx: Context, principal: Principal, *, include_done: bool = False
) -> list[dict[str, Any]]:
    """Quarantined volumes, oldest first (with ``include_done`` also those deleted or
    released), as plain dicts for every surface. The operator's (admin scope, else
    Forbidden)."""
    principal.require(Scope.ADMIN)
    with ctx.read() as session:
        q = select(OrphanVolume, Host.name).join(
            Host, Host.id == OrphanVolume.host_id, isouter=True
        )
        if not include_done:
            q = q.where(OrphanVolume.deleted_at.is_(None))
        rows = session.execute(q.order_by(OrphanVolume.found_at, OrphanVolume.id)).all()
    return [_view(o, host) for o, host in rows]


def _view(o: OrphanVolume, host: str | None) -> dict[str, Any]:
    return {
        "id": o.id,
        "kind": "volume",
        "name": o.name,
        "host_id": o.host_id,
        "host": host,
        "cluster_id": o.cluster_id,
        "size_bytes": o.size_bytes,
        "found_at": o.found_at.isoformat(),
        # None: kept until an admin deletes it (found after a restore).
        "delete_after": o.delete_after.isoformat() if o.delete_after else None,
        "status": o.outcome or "quarantined",
        "deleted_at": o.deleted_at.isoformat() if o.deleted_at else None,
    }


def delete_orphan(
    ctx: Context,
    principal: Principal,
    runtime_of: Callable[[int | None], Runtime],
    orphan_id: int,
) -> dict[str, Any]:
    """Delete a quarantined volume now (the operator's: admin scope, else Forbidden).
    Raises NotFound for an unknown or already finished id, Conflict when the engine
    refuses (e.g. in use) or the store knows the volume again (it is released
    instead)."""
    principal.require(Scope.ADMIN)
    with ctx.read() as session:
        row = session.get(OrphanVolume, orphan_id)
        if row is None or row.deleted_at is not None:
            raise NotFound(f"no quarantined volume {orphan_id}")
        session.expunge(row)
    try:
        runtime = runtime_of(row.host_id)
    except GpuyardError as exc:
        raise Conflict(f"the volume's host cannot be reached: {exc.message}") from exc
    if not delete_quarantined(ctx, runtime, row, "deleted by an admin"):
        with ctx.read() as session:
            now_row = session.get(OrphanVolume, orphan_id)
            outcome = now_row.outcome if now_row is not None else None
        if outcome == "released":
            raise Conflict(
                f"volume {row.name} belongs to a cluster again; it was released, not deleted"
            )
        raise Conflict(
            f"the engine did not delete volume {row.name} (in use, or the engine does not "
            "answer); see the server log"
        )
    with ctx.read() as session:
        done = session.get(OrphanVolume, orphan_id)
        host = session.get(Host, row.host_id)
        assert done is not None
        return _view(done, host.name if host else None)


def _never_known(ctx: Context, cluster_id: str) -> bool:
    """Whether no cluster row has ever had this id (rows are never deleted)."""
    with ctx.read() as session:
        return session.get(Cluster, cluster_id) is None


def delete_quarantined(ctx: Context, runtime: Runtime, row: OrphanVolume, why: str) -> bool:
    """Delete a quarantined volume on the engine, then mark its row. Returns False
    (and leaves the row) when the engine refuses, e.g. the volume is in use. A volume
    the database has come to know meanwhile is released, not deleted. The stopped
    container of a cluster the database has never known (reconciler/clusters/driver.py
    collect_container keeps it) goes first: it holds the volume."""
    if row.name in known_volume_names(ctx):
        with ctx.transaction() as session:
            live = session.get(OrphanVolume, row.id)
            if live is not None and live.deleted_at is None:
                live.deleted_at, live.outcome = ctx.clock.now(), "released"
        return False
    try:
        if row.cluster_id and _never_known(ctx, row.cluster_id):
            runtime.stop(row.cluster_id, timeout_s=ctx.settings.stop_timeout_s)
        runtime.remove_volume(row.name)
    except GpuyardError as exc:
        log.warning("cannot delete quarantined volume %s: %s", row.name, exc.message)
        return False
    now = ctx.clock.now()
    with ctx.transaction() as session:
        live = session.get(OrphanVolume, row.id)
        if live is not None:
            live.deleted_at, live.outcome = now, "deleted"
        if row.cluster_id:
            record_event(
                session,
                row.cluster_id[:14],
                now,
                "collected",
                f"quarantined volume {row.name} deleted ({why})",
            )
    log.info("deleted quarantined volume %s (%s)", row.name, why)
    return True
