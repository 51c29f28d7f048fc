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
from gpuyard.runtimes.base import ManagedVolume, Runtime
from gpuyard.services.context import Context
from gpuyard.services.lifecycle import record_event
from gpuyard.services.orphans import delete_quarantined, known_volume_names
from gpuyard.store.schema import OrphanVolume

log = logging.getLogger(__name__)


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
