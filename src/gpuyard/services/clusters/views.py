"""Everything shown about a cluster, gathered in few queries (batched for lists)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.orm import Session

from gpuyard.core.autoterm import Deadline, deadlines, read_policy, run_started_at
from gpuyard.core.billing.ledger import Accrual, accrue_totals
from gpuyard.core.billing.pricing import Prices, RateParts, hourly_rate
from gpuyard.core.errors import ClusterNotFound
from gpuyard.core.models import CloudType, GpuTypeInfo
from gpuyard.core.network.proxy import ProxyBase
from gpuyard.core.snapshots import RestoreStatus
from gpuyard.core.states import ClusterStatus
from gpuyard.services.access.proxy_routes import proxy_base
from gpuyard.services.billing.ledger_totals import totals
from gpuyard.services.billing.metering import run_start
from gpuyard.services.context import Context
from gpuyard.store.schema import (
    Cluster,
    NetworkVolume,
    Project,
    StartupSample,
    VolumeMove,
    VolumeRestore,
)

STARTUP_SAMPLE_WINDOW = 20
# What each status bills (docs/decisions.md, "Metering"): compute, GPUs and container
# disk from the start request until the stop request; the volume until terminate.
_BILLS_COMPUTE = (ClusterStatus.PENDING, ClusterStatus.STARTING, ClusterStatus.RUNNING)
_BILLS_NOTHING = (ClusterStatus.TERMINATING, ClusterStatus.TERMINATED)
_STARTING = (ClusterStatus.STARTING, ClusterStatus.PENDING)


@dataclass(frozen=True)
class AssignedPort:
    internal_port: int
    external_port: int
    protocol: str
    description: str
    visibility: str = "private"


@dataclass(frozen=True)
class ClusterDetails:
    cluster: Cluster
    host_name: str | None
    host_location: str | None
    host_address: str | None
    # What clients reach the host's published ports at: the host's ``client_address``
    # when the operator set one, else ``host_address``.
    client_address: str | None
    gpu_source: str | None
    gpu_display_name: str | None
    ports: tuple[AssignedPort, ...]
    rate: RateParts
    estimated_ready_at: datetime | None
    accrual: Accrual | None = None
    # What auto-termination fires next for this run (running clusters with a policy).
    next_auto_terminate: Deadline | None = None
    # Why the stored policy is not enforced (it does not validate); None when valid.
    auto_terminate_error: str | None = None
    # What the host's heartbeats say (reachable, unreachable) and its operator status.
    host_reachability: str | None = None
    host_status: str | None = None
    # The network volume mounted instead of a volume of its own; None: none.
    network_volume: MountedNetworkVolume | None = None
    # The volume on its way to this host (a start elsewhere, a drain); None: none.
    move: VolumeMoveView | None = None
    # A snapshot being restored into the volume before the start; None: none.
    restore: RestoreView | None = None
    # Where users reach the SSH gateway, ``(host, port)``; None: it is off.
    ssh_gateway: tuple[str, int] | None = None
    # How proxy URLs are spelled while the HTTP proxy serves; None: it does not.
    proxy: ProxyBase | None = None


@dataclass(frozen=True)
class RestoreView:
    snapshot_id: str
    after_snapshot_id: str | None
    bytes_done: int
    total_bytes: int
    started_at: datetime


@dataclass(frozen=True)
class VolumeMoveView:
    from_host_id: int
    to_host_id: int
    status: str
    bytes_copied: int
    started_at: datetime


def cluster_rate(
    c: Cluster,
    gpu: GpuTypeInfo | None,
    prices: Prices,
    running: bool | None = None,
    status: ClusterStatus | None = None,
) -> RateParts:
    """The cluster's hourly rate in its current status (or in ``status``, or as if
    ``running``): what the usage ledger bills for that status."""
    if status is None:
        status = ClusterStatus(c.status)
    if running is None:
        running = status in _BILLS_COMPUTE
    return hourly_rate(
        gpu=gpu,
        gpu_count=c.gpu_count,
        cpu_cores=c.cpu_cores,
        memory_gb=c.memory_gb,
        container_disk_gb=c.container_disk_gb,
        volume_gb=0 if status in _BILLS_NOTHING else c.volume_gb,
        cloud_type=CloudType(c.cloud_type),
        running=running,
        prices=prices,
        bid_per_gpu=c.bid_per_gpu if c.interruptible else None,
    )


def next_auto_terminate(ctx: Context, c: Cluster, gpu: GpuTypeInfo | None) -> Deadline | None:
    """The earliest auto-termination deadline of a running cluster's current run."""
    if c.status != ClusterStatus.RUNNING:
        return None
    policy = read_policy(c.auto_terminate).policy
    if policy is None:
        return None
    plan = deadlines(
        policy,
        run_started_at=run_started_at(c.start_initiated_at, c.started_at, c.created_at),
        hourly_rate=cluster_rate(c, gpu, ctx.settings.prices, running=True).total,
        idle_since=ctx.idle_since.get(c.id),
    )
    return plan[0] if plan else None


def estimated_startup_seconds(db: Session | Connection) -> float | None:
    """Median of the latest measured starts; None until one was measured."""
    samples = list(
        db.scalars(
            select(StartupSample.seconds)
            .order_by(StartupSample.id.desc())
            .limit(STARTUP_SAMPLE_WINDOW)
        )
    )
    return statistics.median(samples) if samples else None


# Built once: constructing a statement costs more than executing a cached one.
_VISIBLE = (
    select(*Cluster.__table__.columns)
    .join(Project, Project.id == Cluster.project_id)
    .where(Cluster.id == bindparam("cluster_id"), Project.account_id == bindparam("account_id"))
)


def _in_projects(cluster: Cluster, project_ids: frozenset[int] | None) -> bool:
    return project_ids is None or cluster.project_id in project_ids


_STATUS = select(Cluster.status, Cluster.pending_start).where(Cluster.id == bindparam("cluster_id"))


def status_of(ctx: Context, cluster_id: str) -> tuple[ClusterStatus, bool] | None:
    """The cluster's recorded status and whether a start is pending on it (None: no
    such row). One indexed read with no visibility check: for a caller that has
    already read the cluster as its owner (a waiter polling for a change)."""
    with ctx.connect() as conn:
        row = conn.execute(_STATUS, {"cluster_id": cluster_id}).first()
    if row is None:
        return None
    return ClusterStatus(row.status), row.pending_start is not None


def load_visible(
    ctx: Context, account_id: int, cluster_id: str, project_ids: frozenset[int] | None = None
) -> ClusterDetails:
    """The read path of ``GET /v1/clusters/{id}``: the context's accelerated reader
    when it has one, else one prepared Core query on a plain connection; hosts and
    GPU types come from the reference cache. Raises ClusterNotFound for an unknown id,
    another account's cluster, or (``project_ids`` given: the caller's
    ``Principal.project_ids``) a cluster of a project the caller may not use."""
    if ctx.cluster_reader is not None:
        cluster = ctx.cluster_reader(cluster_id, account_id)
        if cluster is None or not _in_projects(cluster, project_ids):
            raise ClusterNotFound(f"cluster {cluster_id!r} not found", {"cluster_id": cluster_id})
        return details(ctx, [cluster])[0]
    with ctx.connect() as conn:
        row = conn.execute(_VISIBLE, {"cluster_id": cluster_id, "account_id": account_id})
        # A Row has the Cluster's column attributes; building an ORM instance would
        # cost more than the query.
        cluster = cast(Cluster | None, row.first())
        if cluster is None or not _in_projects(cluster, project_ids):
            raise ClusterNotFound(f"cluster {cluster_id!r} not found", {"cluster_id": cluster_id})
        return details(ctx, [cluster], conn)[0]


def details(
    ctx: Context, clusters: list[Cluster], db: Session | Connection | None = None
) -> list[ClusterDetails]:
    """What each cluster shows. ``db`` is used when given; otherwise a connection is
    opened only if something must be read (a stale reference cache, a cluster
    starting, a network volume). Costs come from the ledger totals on each row: no
    usage interval is read."""
    starting = any(c.status in _STARTING for c in clusters)
    networked = [c.network_volume_id for c in clusters if c.network_volume_id is not None]
    if db is None and (starting or networked or ctx.references.stale()):
        with ctx.connect() as conn:
            return details(ctx, clusters, conn)
    now = ctx.clock.now()
    hosts, gpus = ctx.references.get(db)
    mounted = mounted_network_volumes(db, networked) if networked else {}
    startup = estimated_startup_seconds(db) if starting and db is not None else None
    in_start = [c.id for c in clusters if c.status in _STARTING] if starting else []
    moves = volume_moves(db, in_start) if in_start else {}
    restores = volume_restores(db, in_start) if in_start else {}
    proxy = proxy_base(ctx.settings) if ctx.proxy.problem() is None else None
    out = []
    for c in clusters:
        host = hosts.get(c.host_id) if c.host_id is not None else None
        gpu = gpus.get(c.gpu_type) if c.gpu_type else None
        host_address = (
            host.address
            if host and not host.is_local
            else ctx.settings.public_address or (host.address if host else None)
        )
        eta = None
        if startup is not None and c.start_initiated_at and c.status in _STARTING:
            eta = c.start_initiated_at + timedelta(seconds=startup)
        out.append(
            ClusterDetails(
                cluster=c,
                host_name=host.name if host else None,
                host_location=host.location if host else None,
                # A remote host is reached at its own address; this machine at the
                # operator's public address when set.
                host_address=host_address,
                client_address=(host.client_address if host else None) or host_address,
                gpu_source=host.gpu_source if host else None,
                gpu_display_name=gpu.display_name if gpu else None,
                ports=tuple(
                    AssignedPort(
                        p["internal_port"],
                        p.get("host_port", 0),
                        p["protocol"],
                        p.get("description", ""),
                        p.get("visibility", "private"),
                    )
                    for p in c.ports
                ),
                rate=cluster_rate(c, gpu, ctx.settings.prices),
                estimated_ready_at=eta,
                accrual=accrue_totals(totals(c), now, run_start(c), c.created_at),
                next_auto_terminate=next_auto_terminate(ctx, c, gpu),
                auto_terminate_error=read_policy(c.auto_terminate).error,
                host_reachability=(
                    None if host is None else "reachable" if host.reachable else "unreachable"
                ),
                host_status=host.status if host else None,
                network_volume=(
                    mounted.get(c.network_volume_id) if c.network_volume_id is not None else None
                ),
                move=moves.get(c.id),
                restore=restores.get(c.id),
                ssh_gateway=ctx.settings.ssh_gateway_endpoint,
                proxy=proxy,
            )
        )
    return out


def volume_restores(
    db: Session | Connection | None, cluster_ids: list[str]
) -> dict[str, RestoreView]:
    """The restores in flight into ``cluster_ids``' volumes (one indexed query)."""
    if db is None or not cluster_ids:
        return {}
    rows = db.execute(
        select(
            VolumeRestore.holder_id,
            VolumeRestore.snapshot_id,
            VolumeRestore.after_snapshot_id,
            VolumeRestore.bytes_done,
            VolumeRestore.total_bytes,
            VolumeRestore.started_at,
        ).where(
            VolumeRestore.holder_id.in_(cluster_ids),
            VolumeRestore.status == RestoreStatus.RESTORING.value,
        )
    )
    return {
        r.holder_id: RestoreView(
            r.snapshot_id, r.after_snapshot_id, r.bytes_done, r.total_bytes, r.started_at
        )
        for r in rows
    }


def volume_moves(
    db: Session | Connection | None, cluster_ids: list[str]
) -> dict[str, VolumeMoveView]:
    """The volume moves in flight of ``cluster_ids`` (one indexed query)."""
    if db is None or not cluster_ids:
        return {}
    rows = db.execute(
        select(
            VolumeMove.cluster_id,
            VolumeMove.from_host_id,
            VolumeMove.to_host_id,
            VolumeMove.status,
            VolumeMove.bytes_copied,
            VolumeMove.started_at,
        ).where(VolumeMove.cluster_id.in_(cluster_ids), VolumeMove.status == "copying")
    )
    return {
        r.cluster_id: VolumeMoveView(
            r.from_host_id, r.to_host_id, r.status, r.bytes_copied, r.started_at
        )
        for r in rows
    }


@dataclass(frozen=True)
class MountedNetworkVolume:
    """The network volume a cluster mounts, as its view shows it."""

    id: str
    name: str
    size_gb: int
    location: str
    used_bytes: int | None
    measured_at: datetime | None


def mounted_network_volumes(
    db: Session | Connection | None, volume_ids: list[str]
) -> dict[str, MountedNetworkVolume]:
    """The network volumes ``volume_ids`` (one query by primary key)."""
    if db is None or not volume_ids:
        return {}
    rows = db.execute(
        select(
            NetworkVolume.id,
            NetworkVolume.name,
            NetworkVolume.size_gb,
            NetworkVolume.location,
            NetworkVolume.used_bytes,
            NetworkVolume.measured_at,
        ).where(NetworkVolume.id.in_(set(volume_ids)))
    )
    return {r.id: MountedNetworkVolume(*r) for r in rows}
