"""Hosts in the store: registration of the local machine and capacity snapshots."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import ColumnElement, and_, bindparam, func, select, true
from sqlalchemy.orm import InstrumentedAttribute, Session

from gpuyard.core.fleet import HostStatus, takes_placements
from gpuyard.core.models import CloudType, HostCapacity
from gpuyard.core.models import HostGpu as HostGpuInfo
from gpuyard.services.fleet.discovery import LocalInventory
from gpuyard.store.schema import (
    GpuAllocation,
    Host,
    HostGpu,
    Reservation,
    VolumeMove,
    utcnow,
)


def _host_of_machine(session: Session, machine_id: str, name: str) -> Host | None:
    """The row of the machine ``machine_id``: the one carrying that id, else a row from
    before host ids (no id, same name), which is adopted so an upgrade keeps it."""
    host = session.scalar(select(Host).where(Host.machine_id == machine_id))
    if host is None:
        host = session.scalar(select(Host).where(Host.name == name, Host.machine_id.is_(None)))
        if host is not None:
            host.machine_id = machine_id
    return host


def _free_name(session: Session, name: str, machine_id: str, host_id: int | None) -> str:
    """``name``, or ``name-<first 8 of the id>`` when another row already holds it
    (names are unique; the id is what identifies the machine)."""
    holder = session.scalar(select(Host.id).where(Host.name == name))
    if holder is None or holder == host_id:
        return name
    return f"{name[:190]}-{machine_id[:8]}"


def register_host(
    session: Session,
    *,
    machine_id: str,
    name: str,
    location: str,
    cloud_type: CloudType,
    address: str,
    engine_url: str | None,
    inventory: LocalInventory,
) -> Host:
    """Create or refresh the host row of the machine ``machine_id`` and its GPUs.

    The row is found by ``machine_id``, never by name: a renamed machine keeps its row
    (the name follows; when another row holds the new name, the id's first eight
    digits are appended) and its GPUs are never offered twice. A row from before host
    ids with the same name is adopted once. GPUs that disappeared are removed only
    when nothing holds them (a held GPU stays until its cluster releases it).
    Idempotent.
    """
    host = _host_of_machine(session, machine_id, name)
    if host is None:
        host = Host(name=_free_name(session, name, machine_id, None), machine_id=machine_id)
        session.add(host)
    else:
        host.name = _free_name(session, name, machine_id, host.id)
    host.location = location
    host.cloud_type = cloud_type.value
    host.address = address
    host.engine_url = engine_url
    host.vcpus = inventory.vcpus
    host.memory_gb = inventory.memory_gb
    host.disk_gb = inventory.disk_gb
    host.gpu_source = inventory.gpu_source.value
    host.declared = list(inventory.declared)
    if inventory.cuda_version is not None:
        # Unknown at this start: what the operator set last (PATCH /v1/hosts) stays.
        host.cuda_version = inventory.cuda_version
    host.healthy = True
    host.is_local = True
    host.updated_at = utcnow()
    session.flush()
    sync_host_gpus(session, host, inventory.gpus)
    return host


def sync_host_gpus(session: Session, host: Host, gpus: Sequence[HostGpuInfo]) -> None:
    """Make ``host``'s ``host_gpus`` rows say ``gpus`` (by index: new ones added, type
    and uuid refreshed). A GPU no longer listed is removed only when nothing holds it
    (a held GPU stays until its cluster releases it, so it is never offered twice).
    ``host`` must have its id (flushed). Idempotent; flushes."""
    existing = {
        g.gpu_index: g for g in session.scalars(select(HostGpu).where(HostGpu.host_id == host.id))
    }
    held = set(
        session.scalars(select(GpuAllocation.gpu_index).where(GpuAllocation.host_id == host.id))
    )
    wanted = {g.index: g for g in gpus}
    for index, old in existing.items():
        if index not in wanted and index not in held:
            session.delete(old)
    for index, gpu in wanted.items():
        row = existing.get(index)
        if row is None:
            session.add(
                HostGpu(host_id=host.id, gpu_index=index, gpu_type=gpu.gpu_type, uuid=gpu.uuid)
            )
        else:
            row.gpu_type, row.uuid = gpu.gpu_type, gpu.uuid
    session.flush()


# volume_moves whose source copy still exists (store/schema/volumes.py VolumeMove): their
# volume stays counted on the source host's disk; done and failed moves are final.
MOVES_IN_FLIGHT = ("copying", "copied")


# What placement reads of a host's own figures (the few hosts' read adds the rest).
_HOST_FIGURES = (
    Host.id,
    Host.cloud_type,
    Host.vcpus,
    Host.memory_gb,
    Host.disk_gb,
    Host.location,
    Host.status,
    Host.healthy,
    Host.cuda_version,
)


def capacities(session: Session, host_ids: Sequence[int] | None = None) -> list[HostCapacity]:
    """Hosts with what their allocations, reservations and in-flight volume moves (the
    source's copy) already use: the hosts ``host_ids`` in that order, whatever their
    status (``takes_placements`` says whether each may take new clusters), or, when
    None, every host that takes placements (active and healthy), by id.

    Loads every host it returns: placement asks only for a few candidates
    (services/capacity/candidates.py); the whole fleet is for catalog sums."""
    if host_ids is not None:
        return _few_capacities(session, list(host_ids))
    # Columns, not ORM objects: a claim reads a few hosts, the catalog thousands.
    q = (
        select(*_HOST_FIGURES)
        .where(Host.healthy.is_(True), Host.status == HostStatus.ACTIVE.value)
        .order_by(Host.id)
    )
    hosts = list(session.execute(q))
    if host_ids is not None:
        order = {host_id: i for i, host_id in enumerate(host_ids)}
        hosts.sort(key=lambda h: order[h.id])
    ids = [h.id for h in hosts]

    def where_host(column: InstrumentedAttribute[int]) -> ColumnElement[bool]:
        # All of the fleet: no IN list of thousands of ids.
        return column.in_(ids) if host_ids is not None else true()

    gpus: dict[int, list[HostGpuInfo]] = defaultdict(list)
    for host_id, index, gpu_type, uuid in session.execute(
        select(HostGpu.host_id, HostGpu.gpu_index, HostGpu.gpu_type, HostGpu.uuid)
        .where(where_host(HostGpu.host_id))
        .order_by(HostGpu.gpu_index)
    ):
        gpus[host_id].append(HostGpuInfo(index=index, gpu_type=gpu_type, uuid=uuid))
    used_gpus: dict[int, set[int]] = defaultdict(set)
    for host_id, index in session.execute(
        select(GpuAllocation.host_id, GpuAllocation.gpu_index).where(
            where_host(GpuAllocation.host_id)
        )
    ):
        used_gpus[host_id].add(index)
    used = {
        row.host_id: row
        for row in session.execute(
            select(
                Reservation.host_id,
                func.sum(Reservation.vcpus).label("vcpus"),
                func.sum(Reservation.memory_gb).label("memory_gb"),
                func.sum(Reservation.container_disk_gb + Reservation.volume_gb).label("disk_gb"),
            )
            .where(where_host(Reservation.host_id))
            .group_by(Reservation.host_id)
        )
    }
    moving: dict[int, float] = {
        host_id: float(gb or 0)
        for host_id, gb in session.execute(
            select(VolumeMove.from_host_id, func.sum(VolumeMove.volume_gb))
            .where(where_host(VolumeMove.from_host_id), VolumeMove.status.in_(MOVES_IN_FLIGHT))
            .group_by(VolumeMove.from_host_id)
        )
    }
    out = []
    for h in hosts:
        u = used.get(h.id)
        out.append(
            _capacity(
                h,
                gpus[h.id],
                float(u.vcpus or 0) if u else 0.0,
                float(u.memory_gb or 0) if u else 0.0,
                (float(u.disk_gb or 0) if u else 0.0) + moving.get(h.id, 0.0),
                used_gpus[h.id],
            )
        )
    return out


def _capacity(
    h: Any,
    gpus: list[HostGpuInfo],
    used_vcpus: float,
    used_memory_gb: float,
    used_disk_gb: float,
    held: Iterable[int],
) -> HostCapacity:
    """A host row's capacity with what is used of it."""
    return HostCapacity(
        host_id=h.id,
        cloud_type=CloudType(h.cloud_type),
        vcpus=h.vcpus,
        memory_gb=h.memory_gb,
        disk_gb=h.disk_gb,
        gpus=tuple(gpus),
        used_vcpus=used_vcpus,
        used_memory_gb=used_memory_gb,
        used_disk_gb=used_disk_gb,
        used_gpu_indices=frozenset(held),
        location=h.location,
        takes_placements=takes_placements(h.status, h.healthy),
        cuda_version=h.cuda_version,
    )


def _used(column: Any, host: Any) -> Any:
    return (
        select(func.coalesce(func.sum(column), 0))
        .where(Reservation.host_id == host)
        .scalar_subquery()
    )


# Prebuilt (a claim runs it every time): a few hosts with their use summed per host,
# joined to their GPUs with whether each is held (a row a GPU; one for a host without).
_FEW_HOSTS = (
    select(
        *_HOST_FIGURES,
        # What a new cluster's own checks read of its host (HostFacts).
        Host.name,
        Host.enforces_limits,
        Host.limits_note,
        Host.enforces_disk,
        Host.disk_note,
        Host.is_local,
        Host.engine_url,
        Host.unreachable_since,
        _used(Reservation.vcpus, Host.id).label("used_vcpus"),
        _used(Reservation.memory_gb, Host.id).label("used_memory_gb"),
        _used(Reservation.container_disk_gb + Reservation.volume_gb, Host.id).label("used_disk_gb"),
        select(func.coalesce(func.sum(VolumeMove.volume_gb), 0))
        .where(VolumeMove.from_host_id == Host.id, VolumeMove.status.in_(MOVES_IN_FLIGHT))
        .scalar_subquery()
        .label("moving_gb"),
    )
    .where(Host.id.in_(bindparam("ids", expanding=True)))
    .subquery("h")
)
_FEW = (
    select(
        _FEW_HOSTS,
        HostGpu.gpu_index.label("gpu_index"),
        HostGpu.gpu_type.label("gpu_type"),
        HostGpu.uuid.label("gpu_uuid"),
        GpuAllocation.gpu_index.is_not(None).label("gpu_held"),
    )
    .select_from(_FEW_HOSTS)
    .outerjoin(HostGpu, HostGpu.host_id == _FEW_HOSTS.c.id)
    .outerjoin(
        GpuAllocation,
        and_(
            GpuAllocation.host_id == HostGpu.host_id,
            GpuAllocation.gpu_index == HostGpu.gpu_index,
        ),
    )
    .order_by(_FEW_HOSTS.c.id, HostGpu.gpu_index)
)


class HostRow(Protocol):
    """A row of exact_hosts: the host's columns (HostFacts' among them)."""

    id: int
    name: str
    enforces_limits: bool
    limits_note: str | None
    enforces_disk: bool
    disk_note: str | None
    is_local: bool
    engine_url: str | None
    unreachable_since: datetime | None


def exact_hosts(session: Session, host_ids: list[int]) -> list[tuple[HostCapacity, HostRow]]:
    """capacities() of the hosts ``host_ids``, in that order, each with its row (the
    columns a new cluster's host checks read), in one statement."""
    if not host_ids:
        return []
    rows: dict[int, Any] = {}
    gpus: dict[int, list[HostGpuInfo]] = defaultdict(list)
    held: dict[int, set[int]] = defaultdict(set)
    for r in session.execute(_FEW, {"ids": host_ids}):
        rows.setdefault(r.id, r)
        if r.gpu_index is None:
            continue
        gpus[r.id].append(HostGpuInfo(index=r.gpu_index, gpu_type=r.gpu_type, uuid=r.gpu_uuid))
        if r.gpu_held:
            held[r.id].add(r.gpu_index)
    return [
        (
            _capacity(
                h,
                gpus[h.id],
                float(h.used_vcpus),
                float(h.used_memory_gb),
                float(h.used_disk_gb) + float(h.moving_gb),
                held[h.id],
            ),
            h,
        )
        for h in (rows[i] for i in host_ids if i in rows)
    ]


def _few_capacities(session: Session, host_ids: list[int]) -> list[HostCapacity]:
    """capacities() of the hosts ``host_ids``, in that order, in one statement."""
    return [cap for cap, _ in exact_hosts(session, host_ids)]


def gpu_uuids(session: Session, host_id: int, indices: list[int]) -> tuple[str, ...]:
    rows = session.scalars(
        select(HostGpu.uuid).where(HostGpu.host_id == host_id, HostGpu.gpu_index.in_(indices))
    )
    return tuple(u for u in rows if u)
