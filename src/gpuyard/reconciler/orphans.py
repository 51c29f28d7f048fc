"""Careful collection of volumes (DESIGN.md rule 8): a volume of ours that the database
does not know is never deleted on sight. It is quarantined (a row in
``orphan_volumes``, listed by ``GET /v1/orphans``), deleted only after the retention
(``GPUYARD_ORPHAN_VOLUME_RETENTION_HOURS``) or by an admin, and released from
quarantine if the database comes to know it again (e.g. a newer backup restored).
A database restored from an older backup therefore loses no tenant data.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import select

from gpuyard.core.errors import GpuyardError
from gpuyard.core.states import ClusterStatus
from gpuyard.core.training import NodeName
from gpuyard.runtimes.base import ManagedVolume, Runtime
from gpuyard.services.context import Context
from gpuyard.services.lifecycle import record_event
from gpuyard.store.schema import Cluster, OrphanVolume, TrainingCluster

log = logging.getLogger(__name__)


def known_volume_names(ctx: Context) -> set[str]:
    """Every engine volume name the database knows to be in use: live clusters'
    volumes and live training clusters' Slurm state volumes."""
    with ctx.read() as session:
        clusters = session.execute(
            select(Cluster.id, Cluster.volume_name).where(
                Cluster.status != ClusterStatus.TERMINATED.value
            )
        ).all()
        trainings = session.execute(
            select(TrainingCluster.id, TrainingCluster.name_prefix).where(
                TrainingCluster.deleted_at.is_(None)
            )
        ).all()
    names = {name or ctx.ownership.volume(cid) for cid, name in clusters}
    names.update(NodeName(tid, prefix).state_volume for tid, prefix in trainings)
    return names


class VolumeCollector:
    """Quarantines unknown volumes of ours on one host's engine and deletes them when
    their retention has passed. Each :meth:`scan` is level-based and idempotent."""

    def __init__(self, ctx: Context, runtime: Runtime, host_id: int) -> None:
        self.ctx = ctx
        self.runtime = runtime
        self.host_id = host_id

    def scan(self) -> None:
        """One pass: list our volumes (first, so any volume seen already has its row
        committed), compare with the store, quarantine, release, expire."""
        try:
            volumes = self.runtime.list_volumes()
        except GpuyardError as exc:
            log.warning("cannot list volumes: %s", exc.message)
            return
        known = known_volume_names(self.ctx)
        unknown = {v.name: v for v in volumes if v.name not in known}
        present = {v.name for v in volumes}
        self._record(unknown, known, present)
        self._expire()

    def _record(
        self, unknown: dict[str, ManagedVolume], known: set[str], present: set[str]
    ) -> None:
        now = self.ctx.clock.now()
        retention = timedelta(hours=self.ctx.settings.orphan_volume_retention_hours)
        with self.ctx.transaction() as session:
            held = {
                o.name: o
                for o in session.scalars(
                    select(OrphanVolume).where(
                        OrphanVolume.host_id == self.host_id, OrphanVolume.deleted_at.is_(None)
                    )
                )
            }
            for name, volume in unknown.items():
                row = held.get(name)
                if row is not None:
                    row.size_bytes = volume.size_bytes
                    continue
                stale = session.scalar(
                    select(OrphanVolume).where(
                        OrphanVolume.host_id == self.host_id, OrphanVolume.name == name
                    )
                )
                if stale is not None:  # quarantined before, released, now unknown again
                    session.delete(stale)
                    session.flush()
                session.add(
                    OrphanVolume(
                        host_id=self.host_id,
                        name=name,
                        cluster_id=volume.cluster_id,
                        size_bytes=volume.size_bytes,
                        found_at=now,
                        delete_after=now + retention,
                    )
                )
                log.warning("quarantined volume %s: the database does not know it", name)
                if volume.cluster_id:
                    record_event(
                        session,
                        volume.cluster_id[:14],
                        now,
                        "quarantined",
                        f"volume {name} quarantined: the database does not know it; kept "
                        f"until {(now + retention).isoformat()} unless an admin deletes it",
                    )
            for name, row in held.items():
                if name in known:
                    row.deleted_at, row.outcome = now, "released"
                elif name not in present:
                    row.deleted_at, row.outcome = now, "vanished"

    def _expire(self) -> None:
        now = self.ctx.clock.now()
        with self.ctx.read() as session:
            due = list(
                session.scalars(
                    select(OrphanVolume).where(
                        OrphanVolume.host_id == self.host_id,
                        OrphanVolume.deleted_at.is_(None),
                        OrphanVolume.delete_after <= now,
                    )
                )
            )
            session.expunge_all()
        for row in due:
            delete_quarantined(self.ctx, self.runtime, row, "retention passed")


def delete_quarantined(ctx: Context, runtime: Runtime, row: OrphanVolume, why: str) -> bool:
    """Delete a quarantined volume on the engine, then mark its row. Returns False
    (and leaves the row) when the engine refuses, e.g. the volume is in use. A volume
    the database has come to know meanwhile is released, not deleted."""
    if row.name in known_volume_names(ctx):
        with ctx.transaction() as session:
            live = session.get(OrphanVolume, row.id)
            if live is not None and live.deleted_at is None:
                live.deleted_at, live.outcome = ctx.clock.now(), "released"
        return False
    try:
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
