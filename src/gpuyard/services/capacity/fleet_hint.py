"""A per-process hint of what each host has free, so a placement on a large fleet can
go straight to a few candidates instead of asking the database to aggregate every
host's claims (about 50-100 ms for 10,000 hosts on SQLite).

It is only ever a hint: the claim loads the hosts it names exactly, inside its locked
transaction (services/fleet/hosts.py ``capacities``), corrects the hint from what it read and
asks again until the hint's best hosts are exact; when the hint offers nothing, the
claim falls back to the database's own candidate query (services/capacity/candidates.py), so a
stale hint can never over-commit a host nor refuse a request that fits.

What keeps it close to the truth:

- every claim in this process updates it with the claimed host's new figures, and a
  rolled-back claim marks it for a rebuild;
- releases in this process mark their hosts for an exact reload (``dirty``);
- a cheap fingerprint of the hosts that take placements (count, ids, the latest
  ``updated_at``: one pass over ``hosts``, about 2 ms for 10,000, no aggregates over
  claims) catches hosts added, removed, cordoned, uncordoned, unreachable or reachable
  again, and hosts edited with their ``updated_at``;
- a rebuild at least every ``MAX_AGE`` catches what other replicas freed and volume
  moves that ended (until then placement may prefer another host that fits); the
  placer reads it before its locked transaction (``rebuild_if_aged``), keeping what
  claims told the hint meanwhile (their hosts are read again exactly).
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_left, insort
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from gpuyard.core.fleet import HostStatus, PlacementPolicy
from gpuyard.core.models import CloudType, HostCapacity, ResourceRequest
from gpuyard.core.placement import AllocationRatios, free_resources
from gpuyard.services.fleet.hosts import MOVES_IN_FLIGHT, capacities
from gpuyard.store.schema import GpuAllocation, Host, HostGpu, Reservation, VolumeMove

# A rebuild reads every host and GPU claim (100-500 ms for 10,000 hosts, under the
# placement lock); what only a rebuild catches changes a preference, never a decision
# (exact reads and the database's fallback query decide), so it is rare.
MAX_AGE = timedelta(seconds=60)
_SLACK = 0.01


@dataclass
class _Free:
    host_id: int
    location: str
    cloud_type: str
    vcpus: float
    memory_gb: float
    disk_gb: float
    gpus: dict[str, int] = field(default_factory=dict)


def _fits_rest(h: _Free, req: ResourceRequest, exclude: Collection[int]) -> bool:
    return (
        h.host_id not in exclude
        and (req.cloud_type == CloudType.ALL or h.cloud_type == req.cloud_type.value)
        and (req.location is None or h.location == req.location)
        and h.vcpus >= req.vcpus - _SLACK
        and h.memory_gb >= req.memory_gb - _SLACK
        and h.disk_gb >= req.disk_gb - _SLACK
    )


class FleetHint:
    """See the module docstring. Thread-safe; one per process and database."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._hosts: dict[int, _Free] = {}
        # (GPU type, cloud type) -> free count -> host ids sorted by id, and by (free
        # vCPUs, id). Each host is in its cloud type's buckets and in those of ""
        # (any cloud type): a request for one cloud type never walks the others' hosts.
        self._by_id: dict[tuple[str, str], dict[int, list[int]]] = {}
        self._by_vcpu: dict[tuple[str, str], dict[int, list[tuple[float, int]]]] = {}
        # Cloud type ("" any) -> every host by (free vCPUs, id) and (-free vCPUs, id):
        # CPU-only requests.
        self._vcpu_up: dict[str, list[tuple[float, int]]] = {}
        self._vcpu_down: dict[str, list[tuple[float, int]]] = {}
        self._built_at: datetime | None = None
        self._ratios: AllocationRatios | None = None
        self._fingerprint: tuple[Any, ...] | None = None
        self.dirty: set[int] = set()
        # While a rebuild reads: the hosts update() was told of meanwhile.
        self._changed: set[int] | None = None
        # One rebuild at a time (one may run outside the placement lock).
        self._rebuilding = threading.Lock()

    # ------------------------------------------------------------ keeping it fresh

    def invalidate(self) -> None:
        with self.lock:
            self._built_at = None

    def refresh(self, session: Session, ratios: AllocationRatios, now: datetime) -> None:
        """Rebuild when stale (see the module docstring); then reload dirty hosts."""
        fingerprint = tuple(session.execute(_FINGERPRINT).one())
        with self.lock:
            stale = self._aged(ratios, now) or fingerprint != self._fingerprint
        if stale:
            self._rebuild(session, ratios, now, fingerprint)
            return
        with self.lock:
            dirty, self.dirty = list(self.dirty), set()
        if dirty:
            self.update(capacities(session, dirty), ratios)

    def aged(self, ratios: AllocationRatios, now: datetime) -> bool:
        """Whether age (or other ratios) alone calls for a rebuild."""
        with self.lock:
            return self._aged(ratios, now)

    def rebuild_if_aged(self, session: Session, ratios: AllocationRatios, now: datetime) -> None:
        """The rebuild that only age (or other ratios) calls for, read in ``session``
        outside the placement lock, before a locked transaction (the placer's): the
        locked :meth:`refresh` then finds it fresh unless the fingerprint moved since.
        Claims and releases this process tells the hint while it reads are kept (they
        are newer than what it read, or marked dirty: read again exactly)."""
        with self.lock:
            if not self._aged(ratios, now):
                return
        self._rebuild(session, ratios, now, tuple(session.execute(_FINGERPRINT).one()))

    def _aged(self, ratios: AllocationRatios, now: datetime) -> bool:
        return (
            self._built_at is None
            or now - self._built_at > MAX_AGE
            or now < self._built_at
            or ratios != self._ratios
        )

    def _rebuild(
        self,
        session: Session,
        ratios: AllocationRatios,
        now: datetime,
        fingerprint: tuple[Any, ...],
    ) -> None:
        with self._rebuilding:
            with self.lock:
                if not self._aged(ratios, now) and fingerprint == self._fingerprint:
                    return  # another thread's rebuild, just made
                # What is marked dirty from here on was released after this read
                # began: it stays marked.
                dirty_before, self._changed = set(self.dirty), set()
            try:
                rows = _load_all(session, ratios)
            finally:
                with self.lock:
                    changed, self._changed = self._changed or set(), None
            with self.lock:
                self._build([r for r in rows if r.host_id not in changed])
                self._built_at, self._ratios, self._fingerprint = now, ratios, fingerprint
                self.dirty -= dirty_before
                # Hosts claimed on while it read: the claims' own figures are newer
                # than the read; they are read again exactly.
                self.dirty |= changed

    def update(self, hosts: Iterable[HostCapacity], ratios: AllocationRatios) -> bool:
        """Put the exact figures of ``hosts`` in; True when any differed."""
        changed = False
        with self.lock:
            for cap in hosts:
                if self._changed is not None:
                    self._changed.add(cap.host_id)
                new = _from_capacity(cap, ratios) if cap.takes_placements else None
                old = self._hosts.get(cap.host_id)
                if old == new:
                    continue
                changed = True
                if old is not None:
                    self._remove(old)
                if new is not None:
                    self._add(new)
        return changed

    # ------------------------------------------------------------ choosing

    def pick(
        self,
        req: ResourceRequest,
        policy: PlacementPolicy,
        exclude: Collection[int],
        limit: int,
    ) -> list[int]:
        """Up to ``limit`` host ids, best first under ``policy`` as far as the hint
        knows (core/placement.py ``policy_key``)."""
        with self.lock:
            out: list[int] = []
            for host_id in self._ordered(req, policy):
                if _fits_rest(self._hosts[host_id], req, exclude):
                    out.append(host_id)
                    if len(out) == limit:
                        break
            return out

    def _ordered(self, req: ResourceRequest, policy: PlacementPolicy) -> Iterator[int]:
        spread = policy is PlacementPolicy.SPREAD
        cloud = "" if req.cloud_type == CloudType.ALL else req.cloud_type.value
        if req.gpu_count:
            ids, vcpus = (
                self._by_id.get((req.gpu_type or "", cloud), {}),
                self._by_vcpu.get((req.gpu_type or "", cloud), {}),
            )
            counts = sorted((c for c in ids if c >= req.gpu_count), reverse=spread)
            for count in counts:
                if spread:
                    yield from ids[count]
                else:
                    for _, host_id in vcpus[count]:
                        yield host_id
        elif spread:
            for _, host_id in self._vcpu_down.get(cloud, []):
                yield host_id
        else:
            up = self._vcpu_up.get(cloud, [])
            start = bisect_left(up, (req.vcpus - _SLACK, -1))
            for _, host_id in up[start:]:
                yield host_id

    # ------------------------------------------------------------ the indexes

    def _build(self, rows: list[_Free]) -> None:
        """The indexes of ``rows`` alone (sorted once, not host by host)."""
        self._clear()
        for h in rows:
            self._hosts[h.host_id] = h
            for entries, entry in self._entries(h):
                entries.append(entry)
        for entries in self._lists():
            entries.sort()

    def _add(self, h: _Free) -> None:
        self._hosts[h.host_id] = h
        for entries, entry in self._entries(h):
            insort(entries, entry)

    def _entries(self, h: _Free) -> Iterator[tuple[list[Any], Any]]:
        """Each sorted list of the indexes ``h`` belongs in (made when missing), with
        its entry there."""
        for cloud in ("", h.cloud_type):
            for gpu_type, count in h.gpus.items():
                key = (gpu_type, cloud)
                yield self._by_id.setdefault(key, {}).setdefault(count, []), h.host_id
                by_vcpu = self._by_vcpu.setdefault(key, {}).setdefault(count, [])
                yield by_vcpu, (h.vcpus, h.host_id)
            yield self._vcpu_up.setdefault(cloud, []), (h.vcpus, h.host_id)
            yield self._vcpu_down.setdefault(cloud, []), (-h.vcpus, h.host_id)

    def _lists(self) -> Iterator[list[Any]]:
        """Every sorted list of the indexes."""
        for by_id in self._by_id.values():
            yield from by_id.values()
        for by_vcpu in self._by_vcpu.values():
            yield from by_vcpu.values()
        yield from self._vcpu_up.values()
        yield from self._vcpu_down.values()

    def _clear(self) -> None:
        self._hosts.clear()
        self._by_id.clear()
        self._by_vcpu.clear()
        self._vcpu_up.clear()
        self._vcpu_down.clear()

    def _remove(self, h: _Free) -> None:
        del self._hosts[h.host_id]
        for cloud in ("", h.cloud_type):
            for gpu_type, count in h.gpus.items():
                _discard(self._by_id[(gpu_type, cloud)], count, h.host_id)
                _discard(self._by_vcpu[(gpu_type, cloud)], count, (h.vcpus, h.host_id))
            _drop(self._vcpu_up[cloud], (h.vcpus, h.host_id))
            _drop(self._vcpu_down[cloud], (-h.vcpus, h.host_id))


def _discard(buckets: dict[int, list[Any]], count: int, item: Any) -> None:
    bucket = buckets[count]
    _drop(bucket, item)
    if not bucket:
        del buckets[count]


def _drop(items: list[Any], item: Any) -> None:
    i = bisect_left(items, item)
    if i < len(items) and items[i] == item:
        del items[i]


def _from_capacity(cap: HostCapacity, ratios: AllocationRatios) -> _Free:
    free = free_resources(cap, ratios)
    return _Free(
        host_id=cap.host_id,
        location=cap.location,
        cloud_type=cap.cloud_type.value,
        vcpus=float(free["vcpus"]),
        memory_gb=float(free["memory_gb"]),
        disk_gb=float(free["disk_gb"]),
        gpus={t: n for t, n in free["gpus"].items() if n > 0},
    )


_PLACEABLE = and_(Host.healthy.is_(True), Host.status == HostStatus.ACTIVE.value)
# Hosts added, removed, closed or opened change the count or the ids; an edited host
# (its sizes, location) its updated_at.
_FINGERPRINT = select(
    func.count(), func.coalesce(func.sum(Host.id), 0), func.max(Host.updated_at)
).where(_PLACEABLE)


def _load_all(session: Session, ratios: AllocationRatios) -> list[_Free]:
    """Every host that takes placements with its free figures, in four aggregates."""
    used = {
        r.host_id: r
        for r in session.execute(
            select(
                Reservation.host_id,
                func.sum(Reservation.vcpus).label("vcpus"),
                func.sum(Reservation.memory_gb).label("memory_gb"),
                func.sum(Reservation.container_disk_gb + Reservation.volume_gb).label("disk"),
            ).group_by(Reservation.host_id)
        )
    }
    moving = {
        host_id: gb
        for host_id, gb in session.execute(
            select(VolumeMove.from_host_id, func.sum(VolumeMove.volume_gb))
            .where(VolumeMove.status.in_(MOVES_IN_FLIGHT))
            .group_by(VolumeMove.from_host_id)
        )
    }
    gpus: dict[int, dict[str, int]] = {}
    free_gpus = (
        select(HostGpu.host_id, HostGpu.gpu_type, func.count())
        .outerjoin(
            GpuAllocation,
            and_(
                GpuAllocation.host_id == HostGpu.host_id,
                GpuAllocation.gpu_index == HostGpu.gpu_index,
            ),
        )
        .where(GpuAllocation.host_id.is_(None))
        .group_by(HostGpu.host_id, HostGpu.gpu_type)
    )
    for host_id, gpu_type, n in session.execute(free_gpus):
        gpus.setdefault(host_id, {})[gpu_type] = int(n)
    out = []
    hosts = select(
        Host.id, Host.location, Host.cloud_type, Host.vcpus, Host.memory_gb, Host.disk_gb
    ).where(_PLACEABLE)
    for h in session.execute(hosts):
        u = used.get(h.id)
        out.append(
            _Free(
                host_id=h.id,
                location=h.location,
                cloud_type=h.cloud_type,
                vcpus=round(h.vcpus * ratios.vcpu - float(u.vcpus or 0 if u else 0), 2),
                memory_gb=round(
                    h.memory_gb * ratios.memory - float(u.memory_gb or 0 if u else 0), 2
                ),
                disk_gb=round(
                    h.disk_gb * ratios.disk
                    - float(u.disk or 0 if u else 0)
                    - float(moving.get(h.id) or 0),
                    2,
                ),
                gpus=gpus.get(h.id, {}),
            )
        )
    return out


_HINTS: weakref.WeakKeyDictionary[Engine, FleetHint] = weakref.WeakKeyDictionary()
_HINTS_LOCK = threading.Lock()


def hint_for(session: Session) -> FleetHint:
    """This process's hint for the database ``session`` is on."""
    return hint_of(session.get_bind().engine)


def hint_of(engine: Engine) -> FleetHint:
    """This process's hint for the database of ``engine``."""
    with _HINTS_LOCK:
        hint = _HINTS.get(engine)
        if hint is None:
            hint = _HINTS[engine] = FleetHint()
        return hint
