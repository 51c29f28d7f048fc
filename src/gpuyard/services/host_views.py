"""What the admin sees about hosts (``GET /v1/hosts``, ``gpuyard hosts``): each host's
identity, capacity and what is free, and the installation they serve."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from gpuyard.core.models import HostCapacity
from gpuyard.services.context import Context
from gpuyard.services.hosts import capacities
from gpuyard.store.schema import Host


@dataclass(frozen=True)
class HostView:
    id: int
    name: str
    # The machine's stable id (services/host_identity.py); None for a host row no
    # server has claimed since host ids were introduced.
    machine_id: str | None
    location: str
    cloud_type: str
    address: str
    engine_url: str | None
    healthy: bool
    vcpus: int
    memory_gb: int
    disk_gb: int
    gpu_source: str
    # Which of vcpus/memory_gb/disk_gb (and "gpus") were declared, not discovered.
    declared: tuple[str, ...]
    # False when the host's engine cannot apply CPU/memory limits; the note says why.
    enforces_limits: bool
    limits_note: str | None
    capacity: HostCapacity


@dataclass(frozen=True)
class HostsOverview:
    installation_id: str
    hosts: tuple[HostView, ...]


def list_hosts(ctx: Context) -> HostsOverview:
    """Every healthy host (placement's view, oldest first) and this installation's id.
    One read transaction; no engine or network call."""
    with ctx.read() as session:
        rows = {h.id: h for h in session.scalars(select(Host).order_by(Host.id))}
        caps = capacities(session)
    views = []
    for cap in caps:
        h = rows[cap.host_id]
        declared = tuple(h.declared) + (("gpus",) if h.gpu_source == "declared" else ())
        views.append(
            HostView(
                id=h.id,
                name=h.name,
                machine_id=h.machine_id,
                location=h.location,
                cloud_type=h.cloud_type,
                address=h.address,
                engine_url=h.engine_url,
                healthy=h.healthy,
                vcpus=h.vcpus,
                memory_gb=h.memory_gb,
                disk_gb=h.disk_gb,
                gpu_source=h.gpu_source,
                declared=declared,
                enforces_limits=h.enforces_limits,
                limits_note=h.limits_note,
                capacity=cap,
            )
        )
    return HostsOverview(installation_id=ctx.ownership.installation_id, hosts=tuple(views))
