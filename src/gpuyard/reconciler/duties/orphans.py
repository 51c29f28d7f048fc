"""Careful collection of volumes (DESIGN.md rule 8): a volume of ours that the database
does not know is never deleted on sight. It is quarantined (a row in
``orphan_volumes``, listed by ``GET /v1/orphans``), deleted only after the retention
(``GPUYARD_ORPHAN_VOLUME_RETENTION_HOURS``) or by an admin, and released from
quarantine if the database comes to know it again (e.g. a newer backup restored).
A database restored from an older backup therefore loses no tenant data.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from gpuyard.core.errors import GpuyardError
from gpuyard.runtimes.base import ManagedVolume, Runtime
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.context import Context
from gpuyard.services.fleet.orphans import delete_quarantined, known_volume_names
from gpuyard.store.schema import Installation, OrphanVolume

log = logging.getLogger(__name__)


def made_before(volume: ManagedVolume, restored_at: datetime | None) -> bool:
    """Whether ``volume`` existed when the installation was restored from a backup (so
    the backup did not know it: it is kept until an admin deletes it). A volume whose
    creation time the engine does not tell counts as older: nothing is deleted on a
    guess."""
    if restored_at is None:
        return False
    made = engine_time(volume.created_at)
    if made is None:
        return True
    if restored_at.tzinfo is None:  # SQLite hands back naive UTC
        restored_at = restored_at.replace(tzinfo=UTC)
    return made <= restored_at


def engine_time(text: str | None) -> datetime | None:
    """An engine's ISO 8601 time (nanoseconds, ``Z``, or an offset) as an aware
    datetime; None when absent or unreadable."""
    if not text:
        return None
    found = _ENGINE_TIME.match(text.strip())
    if found is None:
        return None
    base, fraction, zone = found.group(1), (found.group(2) or "")[:7], found.group(3)
    zone = "+00:00" if zone in (None, "", "Z") else zone
    try:
        parsed = datetime.fromisoformat(f"{base}{fraction}{zone}")
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


_ENGINE_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})?")


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
            restored_at = session.scalar(
                select(Installation.restored_at).order_by(Installation.id).limit(1)
            )
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
                kept = made_before(volume, restored_at)
                delete_after = None if kept else now + retention
                session.add(
                    OrphanVolume(
                        host_id=self.host_id,
                        name=name,
                        cluster_id=volume.cluster_id,
                        size_bytes=volume.size_bytes,
                        found_at=now,
                        delete_after=delete_after,
                    )
                )
                log.warning("quarantined volume %s: the database does not know it", name)
                if volume.cluster_id:
                    until = (
                        "until an admin deletes it (it is older than the restore of this "
                        "installation from a backup that did not know it)"
                        if delete_after is None
                        else f"until {delete_after.isoformat()} unless an admin deletes it"
                    )
                    record_event(
                        session,
                        volume.cluster_id[:14],
                        now,
                        "quarantined",
                        f"volume {name} quarantined: the database does not know it; kept {until}",
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
