"""What the admin sees about hosts (``GET /v1/hosts``, ``GET /v1/hosts/{id}``,
``gpuyard hosts``): each host's identity, engine, reachability, status, capacity (what
it has, what is allocated, what is free), where each inventory figure came from, and
what runs on it. Every host is shown, whatever its status or health (placement's own
view, services/fleet/hosts.py ``capacities``, takes only the hosts it may use)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gpuyard.core.errors import HostNotFound
from gpuyard.core.fleet import Reachability
from gpuyard.core.models import HostCapacity
from gpuyard.core.states import ClusterStatus
from gpuyard.core.training.clusters import node_owner
from gpuyard.services.context import Context
from gpuyard.services.fleet.hosts import capacities
from gpuyard.services.tenancy.auth import Principal, Scope
from gpuyard.store.schema import (
    Cluster,
    GpuAllocation,
    Host,
    Reservation,
    TrainingCluster,
    TrainingNode,
)

# Inventory figures a host may declare instead of having them discovered.
INVENTORY_FIELDS = ("vcpus", "memory_gb", "disk_gb", "gpus")
# Moves whose source copy still exists: its volume stays counted on the old host's
# disk until the move ends (services/clusters/moves.py IN_FLIGHT).
MOVES_IN_FLIGHT = ("copying", "copied")
# Holder ids of training nodes' claims start so (core/training/clusters.py node_owner).
_TRAINING_HOLDER = node_owner(0).removesuffix("0")


@dataclass(frozen=True)
class Workload:
    """Something holding capacity on a host: a cluster or a training cluster's node."""

    kind: Literal["cluster", "training_node"]
    # A cluster id, or ``tn-<node id>`` (the holder id of a node's claims).
    id: str
    name: str
    status: str
    # GPUs it asks for, and those it holds on this host now (none while stopped).
    gpu_count: int
    gpus_held: int
    training_cluster_id: int | None = None


@dataclass(frozen=True)
class HostView:
    id: int
    name: str
    # The machine's stable id (services/fleet/identity.py); None for a host added
    # through the API or a row no server has claimed since host ids were introduced.
    machine_id: str | None
    location: str
    cloud_type: str
    address: str
    # Where clients reach its published ports when not at ``address``; None: there.
    client_address: str | None
    engine_url: str | None
    engine_tls_dir: str | None
    engine_name: str | None
    engine_version: str | None
    is_local: bool
    # The operator's word (core/fleet.py HostStatus) and what the heartbeats say.
    status: str
    healthy: bool
    reachability: Reachability
    last_heartbeat_at: datetime | None
    unreachable_since: datetime | None
    missed_heartbeats: int
    heartbeat_error: str | None
    vcpus: int
    memory_gb: int
    disk_gb: int
    gpu_source: str
    # Which of vcpus/memory_gb/disk_gb/gpus were declared, not discovered.
    declared: tuple[str, ...]
    # False when the host's engine cannot apply CPU/memory limits; the note says why.
    enforces_limits: bool
    limits_note: str | None
    # False when the host cannot enforce volume or container disk sizes; the note says why.
    enforces_disk: bool
    disk_note: str | None
    # The CUDA driver version (NVML's or nvidia-smi's, else the operator's); None: unknown.
    cuda_version: str | None
    capacity: HostCapacity
    workloads: tuple[Workload, ...]
    created_at: datetime

    @property
    def inventory_sources(self) -> dict[str, str]:
        """``declared`` or ``discovered`` for each of :data:`INVENTORY_FIELDS`."""
        return {f: "declared" if f in self.declared else "discovered" for f in INVENTORY_FIELDS}


@dataclass(frozen=True)
class HostsOverview:
    installation_id: str
    hosts: tuple[HostView, ...]


def reachability(host: Host) -> Reachability:
    """What the heartbeats say: ``unknown`` until the first heartbeat, ``unreachable``
    after the setting's worth of misses (or when a new host's first ones fail),
    ``reachable`` once it has answered and is healthy."""
    if host.unreachable_since is not None:
        return Reachability.UNREACHABLE
    if host.last_heartbeat_at is None:
        return Reachability.UNREACHABLE if host.missed_heartbeats else Reachability.UNKNOWN
    return Reachability.REACHABLE if host.healthy else Reachability.UNREACHABLE


def list_hosts(ctx: Context, principal: Principal) -> HostsOverview:
    """(Admin.) Every host, oldest first, and this installation's id. One read transaction; no
    engine or network call."""
    principal.require(Scope.ADMIN)
    with ctx.read() as session:
        hosts = list(session.scalars(select(Host).order_by(Host.id)))
        views = _views(session, hosts)
    return HostsOverview(installation_id=ctx.ownership.installation_id, hosts=tuple(views))


def get_host(ctx: Context, principal: Principal, host_id: int) -> HostView:
    """(Admin.) One host. Raises HostNotFound."""
    principal.require(Scope.ADMIN)
    with ctx.read() as session:
        return view_of(session, host_id)


def view_of(session: Session, host_id: int) -> HostView:
    """One host as of ``session``. Raises HostNotFound."""
    host = session.get(Host, host_id)
    if host is None:
        raise HostNotFound(f"host {host_id} not found", {"host_id": host_id})
    return _views(session, [host])[0]


def _views(session: Session, hosts: Sequence[Host]) -> list[HostView]:
    ids = [h.id for h in hosts]
    caps = _capacities(session, hosts)
    loads = _workloads(session, ids)
    views = []
    for h in hosts:
        declared = list(h.declared)
        if h.gpu_source == "declared" and "gpus" not in declared:
            declared.append("gpus")
        views.append(
            HostView(
                id=h.id,
                name=h.name,
                machine_id=h.machine_id,
                location=h.location,
                cloud_type=h.cloud_type,
                address=h.address,
                client_address=h.client_address,
                engine_url=h.engine_url,
                engine_tls_dir=h.engine_tls_dir,
                engine_name=h.engine_name,
                engine_version=h.engine_version,
                is_local=h.is_local,
                status=h.status,
                healthy=h.healthy,
                reachability=reachability(h),
                last_heartbeat_at=h.last_heartbeat_at,
                unreachable_since=h.unreachable_since,
                missed_heartbeats=h.missed_heartbeats,
                heartbeat_error=h.heartbeat_error,
                vcpus=h.vcpus,
                memory_gb=h.memory_gb,
                disk_gb=h.disk_gb,
                gpu_source=h.gpu_source,
                declared=tuple(declared),
                enforces_limits=h.enforces_limits,
                limits_note=h.limits_note,
                enforces_disk=h.enforces_disk,
                disk_note=h.disk_note,
                cuda_version=h.cuda_version,
                capacity=caps[h.id],
                workloads=tuple(loads.get(h.id, ())),
                created_at=h.created_at,
            )
        )
    return views


def _capacities(session: Session, hosts: Sequence[Host]) -> dict[int, HostCapacity]:
    """Every one of ``hosts`` with what is held there, whatever its status or health
    (placement's own reader, asked for exactly these hosts)."""
    return {c.host_id: c for c in capacities(session, [h.id for h in hosts])}


def _workloads(session: Session, ids: Sequence[int]) -> dict[int, list[Workload]]:
    """Per host: the clusters placed there (holding a reservation, or not terminated
    with their ``host_id`` there) and the nodes of live training clusters."""
    held: dict[tuple[int, str], int] = defaultdict(int)
    for host_id, holder in session.execute(
        select(GpuAllocation.host_id, GpuAllocation.cluster_id).where(
            GpuAllocation.host_id.in_(ids)
        )
    ):
        held[(host_id, holder)] += 1
    holders = list(
        session.execute(
            select(Reservation.host_id, Reservation.cluster_id).where(Reservation.host_id.in_(ids))
        )
    )
    cluster_ids = {holder for _, holder in holders if not holder.startswith(_TRAINING_HOLDER)}
    clusters = session.scalars(
        select(Cluster)
        .where(
            or_(
                Cluster.id.in_(cluster_ids),
                (Cluster.host_id.in_(ids)) & (Cluster.status != ClusterStatus.TERMINATED.value),
            )
        )
        .order_by(Cluster.created_at, Cluster.id)
    )
    reserved_on = {holder: host_id for host_id, holder in holders}
    out: dict[int, list[Workload]] = defaultdict(list)
    for c in clusters:
        on = reserved_on.get(c.id, c.host_id)
        if on is None:
            continue
        out[on].append(
            Workload(
                kind="cluster",
                id=c.id,
                name=c.name,
                status=c.status,
                gpu_count=c.gpu_count,
                gpus_held=held.get((on, c.id), 0),
            )
        )
    nodes = session.execute(
        select(TrainingNode, TrainingCluster.name)
        .join(TrainingCluster, TrainingCluster.id == TrainingNode.cluster_id)
        .where(TrainingNode.host_id.in_(ids), TrainingCluster.deleted_at.is_(None))
        .order_by(TrainingNode.id)
    )
    for node, cluster_name in nodes:
        if node.host_id is None:
            continue
        holder = node_owner(node.id)
        out[node.host_id].append(
            Workload(
                kind="training_node",
                id=holder,
                name=f"{cluster_name}/{node.name}",
                status=node.status,
                gpu_count=len(node.gpu_indices),
                gpus_held=held.get((node.host_id, holder), 0),
                training_cluster_id=node.cluster_id,
            )
        )
    return out
