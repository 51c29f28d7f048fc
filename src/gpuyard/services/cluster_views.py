"""Everything shown about a cluster, gathered in a few queries (batched for lists)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.models import CloudType
from gpuyard.core.pricing import RateParts, hourly_rate
from gpuyard.core.states import ClusterStatus
from gpuyard.services.catalog import to_info
from gpuyard.services.context import Context
from gpuyard.store.schema import Cluster, GpuType, Host, PortAllocation, StartupSample

STARTUP_SAMPLE_WINDOW = 20


@dataclass(frozen=True)
class AssignedPort:
    internal_port: int
    external_port: int
    protocol: str
    description: str


@dataclass(frozen=True)
class ClusterDetails:
    cluster: Cluster
    host_name: str | None
    host_location: str | None
    host_address: str | None
    gpu_source: str | None
    gpu_display_name: str | None
    ports: tuple[AssignedPort, ...]
    rate: RateParts
    estimated_ready_at: datetime | None


def estimated_startup_seconds(session: Session) -> float | None:
    """Median of the latest measured starts; None until one was measured."""
    samples = list(
        session.scalars(
            select(StartupSample.seconds)
            .order_by(StartupSample.id.desc())
            .limit(STARTUP_SAMPLE_WINDOW)
        )
    )
    return statistics.median(samples) if samples else None


def details(ctx: Context, session: Session, clusters: list[Cluster]) -> list[ClusterDetails]:
    ids = [c.id for c in clusters]
    host_ids = {c.host_id for c in clusters if c.host_id is not None}
    gpu_ids = {c.gpu_type for c in clusters if c.gpu_type}
    hosts = (
        {h.id: h for h in session.scalars(select(Host).where(Host.id.in_(host_ids)))}
        if host_ids
        else {}
    )
    gpus = (
        {g.id: to_info(g) for g in session.scalars(select(GpuType).where(GpuType.id.in_(gpu_ids)))}
        if gpu_ids
        else {}
    )
    assigned: dict[str, dict[tuple[int, str], int]] = defaultdict(dict)
    for a in session.scalars(select(PortAllocation).where(PortAllocation.cluster_id.in_(ids))):
        assigned[a.cluster_id][(a.internal_port, a.protocol)] = a.port
    startup = (
        estimated_startup_seconds(session)
        if any(c.status in (ClusterStatus.STARTING, ClusterStatus.PENDING) for c in clusters)
        else None
    )
    out = []
    for c in clusters:
        host = hosts.get(c.host_id) if c.host_id is not None else None
        gpu = gpus.get(c.gpu_type) if c.gpu_type else None
        address = ctx.settings.public_address or (host.address if host else None)
        ports = []
        for p in c.ports:
            transport = "udp" if p["protocol"] == "udp" else "tcp"
            ext = assigned[c.id].get((p["internal_port"], transport), 0)
            ports.append(
                AssignedPort(p["internal_port"], ext, p["protocol"], p.get("description", ""))
            )
        status = ClusterStatus(c.status)
        running = status not in (
            ClusterStatus.STOPPED,
            ClusterStatus.ERROR,
            ClusterStatus.TERMINATED,
        )
        rate = hourly_rate(
            gpu=gpu,
            gpu_count=c.gpu_count,
            cpu_cores=c.cpu_cores,
            memory_gb=c.memory_gb,
            container_disk_gb=c.container_disk_gb,
            volume_gb=c.volume_gb if status != ClusterStatus.TERMINATED else 0,
            cloud_type=CloudType(c.cloud_type),
            running=running,
            prices=ctx.settings.prices,
        )
        eta = None
        if (
            startup is not None
            and c.start_initiated_at is not None
            and status
            in (
                ClusterStatus.STARTING,
                ClusterStatus.PENDING,
            )
        ):
            eta = c.start_initiated_at + timedelta(seconds=startup)
        out.append(
            ClusterDetails(
                cluster=c,
                host_name=host.name if host else None,
                host_location=host.location if host else None,
                host_address=address,
                gpu_source=host.gpu_source if host else None,
                gpu_display_name=gpu.display_name if gpu else None,
                ports=tuple(ports),
                rate=rate,
                estimated_ready_at=eta,
            )
        )
    return out


def one(ctx: Context, session: Session, cluster: Cluster) -> ClusterDetails:
    return details(ctx, session, [cluster])[0]
