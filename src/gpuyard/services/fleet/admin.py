"""Hosts as an operator manages them (admin): add one by its engine URL, cordon and
uncordon it, delete it once nothing is left on it, and the installation's SSH key to
install on hosts reached over ``ssh://``.

A host added here is ``active`` but not ``healthy`` until its first heartbeat answers
(reconciler/duties/heartbeats.py): nothing is placed on it before that. What the operator declares
(vCPUs, memory, disk, GPUs) is kept and marked ``declared``; every other figure is
discovered through the engine after the first answer. Writes that change where
placement may land take the placement lock first, so a create running alongside sees
the host as it was before or as it is after, never half of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuyard.core.errors import (
    HostExists,
    HostNotEmpty,
    HostNotFound,
    LocalHostProtected,
    ValidationFailed,
)
from gpuyard.core.fleet import HostStatus
from gpuyard.core.models import CloudType, GpuSource
from gpuyard.core.models import HostGpu as HostGpuInfo
from gpuyard.core.network.engine_address import EngineAddress, check_host_name, parse_engine_url
from gpuyard.core.states import ClusterStatus
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys
from gpuyard.services.capacity.placement import lock_placement
from gpuyard.services.context import Context
from gpuyard.services.fleet.hosts import sync_host_gpus
from gpuyard.services.fleet.views import MOVES_IN_FLIGHT, HostView, view_of
from gpuyard.services.tenancy.auth import Principal, Scope
from gpuyard.store.schema import (
    Cluster,
    GpuAllocation,
    GpuType,
    Host,
    HostGpu,
    OrphanVolume,
    PortAllocation,
    Reservation,
    TrainingCluster,
    TrainingNode,
    VolumeMove,
    utcnow,
)

# Docker's names for the TLS client material of a tcp:// engine (DOCKER_CERT_PATH).
TLS_FILES = ("ca.pem", "cert.pem", "key.pem")
MAX_HOST_GPUS = 64


@dataclass(frozen=True)
class GpuCount:
    gpu_type: str  # a catalog id or display name
    count: int


@dataclass(frozen=True)
class NewHost:
    """A host to add. ``None`` inventory figures are discovered through the engine;
    ``gpus`` None: discovered too, an empty tuple: declared to have none."""

    name: str
    engine_url: str
    address: str | None = None
    # Where clients reach its published ports when not at ``address``.
    client_address: str | None = None
    location: str | None = None
    cloud_type: CloudType = CloudType.SECURE
    gpus: tuple[GpuCount, ...] | None = None
    vcpus: int | None = None
    memory_gb: int | None = None
    disk_gb: int | None = None
    engine_tls_dir: str | None = None
    # Declared where NVML/nvidia-smi cannot tell it; None: discovered.
    cuda_version: str | None = None


def check_tls_dir(engine: EngineAddress, tls_dir: str | None) -> str | None:
    """The TLS directory to store for ``engine``: required for ``tcp://`` to anything
    but loopback, refused for other schemes, and checked to hold :data:`TLS_FILES` on
    this machine. Raises ValidationFailed(``engine_tls_dir``)."""
    field = "engine_tls_dir"
    if tls_dir is None:
        if engine.scheme == "tcp" and not engine.loopback:
            raise ValidationFailed(
                field,
                "a tcp:// engine that is not on loopback needs TLS client certificates: "
                f"a directory holding {', '.join(TLS_FILES)} (an open engine port is root "
                "on the host); or reach it over ssh://",
            )
        return None
    if engine.scheme != "tcp":
        raise ValidationFailed(field, "is only for tcp:// engines")
    path = Path(tls_dir)
    if not path.is_absolute():
        raise ValidationFailed(field, "must be an absolute path on the server's machine")
    missing = [name for name in TLS_FILES if not (path / name).is_file()]
    if missing:
        raise ValidationFailed(
            field, f"{tls_dir} must hold {', '.join(TLS_FILES)}; missing: {', '.join(missing)}"
        )
    return str(path)


def _resolve_gpus(session: Session, gpus: Sequence[GpuCount]) -> tuple[HostGpuInfo, ...]:
    """Declared GPUs as host GPU rows (indices 0.. in the order given), each type
    named by its catalog id or display name (exact, else ignoring case). Raises
    ValidationFailed(``gpus``) for an unknown type or too many GPUs."""
    catalog = [
        (gid, name) for gid, name in session.execute(select(GpuType.id, GpuType.display_name))
    ]
    exact = {name: gid for gid, display in catalog for name in (display, gid)}
    folded = {name.casefold(): gid for name, gid in exact.items()}
    total = sum(g.count for g in gpus)
    if total > MAX_HOST_GPUS:
        raise ValidationFailed("gpus", f"{total} GPUs; a host has at most {MAX_HOST_GPUS}")
    out: list[HostGpuInfo] = []
    for g in gpus:
        gpu_id = exact.get(g.gpu_type) or folded.get(g.gpu_type.casefold())
        if gpu_id is None:
            raise ValidationFailed(
                "gpus",
                f"unknown GPU type {g.gpu_type[:80]!r}; see GET /v1/gpu-types for the "
                "catalog's ids and display names",
            )
        first = len(out)
        out.extend(HostGpuInfo(index=first + i, gpu_type=gpu_id) for i in range(g.count))
    return tuple(out)


def _engine_holder(session: Session, engine: EngineAddress) -> int | None:
    """The host already reached through ``engine``, if any (URLs compared by what
    engine they name, not by their spelling)."""
    for host_id, url in session.execute(
        select(Host.id, Host.engine_url).where(Host.engine_url.is_not(None))
    ):
        try:
            if url is not None and parse_engine_url(url).key == engine.key:
                return int(host_id)
        except ValidationFailed:
            continue  # a URL from settings, not held to these rules: not a duplicate
    return None


def _default_address(session: Session, engine: EngineAddress) -> str:
    """Where users reach a host's published ports unless told: the engine URL's host,
    or, for a unix:// engine (this machine), the server's own host's address."""
    if engine.host is not None and not engine.loopback:
        return engine.host
    local = session.scalar(select(Host.address).where(Host.is_local.is_(True)).limit(1))
    return local or "127.0.0.1"


def add_host(ctx: Context, principal: Principal, spec: NewHost) -> HostView:
    """(Admin.) Register a host (``active``, not healthy until its first heartbeat) with its
    declared inventory, and wake the reconciler so it is reached at once.

    Raises ValidationFailed (the engine URL, TLS directory, address or a GPU type),
    HostExists (its name or engine is taken)."""
    principal.require(Scope.ADMIN)
    engine = parse_engine_url(spec.engine_url)
    tls_dir = check_tls_dir(engine, spec.engine_tls_dir)
    if spec.address is not None:
        check_host_name(spec.address, "address")
    if spec.client_address is not None:
        check_host_name(spec.client_address, "client_address")
    declared = [
        f
        for f, value in (
            ("vcpus", spec.vcpus),
            ("memory_gb", spec.memory_gb),
            ("disk_gb", spec.disk_gb),
            ("gpus", spec.gpus),
            ("cuda_version", spec.cuda_version),
        )
        if value is not None
    ]
    with ctx.transaction() as session:
        lock_placement(session)
        gpus = _resolve_gpus(session, spec.gpus) if spec.gpus is not None else None
        taken = session.scalar(select(Host.id).where(Host.name == spec.name))
        if taken is not None:
            raise HostExists(
                f"a host named {spec.name!r} exists (id {taken})",
                {"field": "name", "host_id": taken},
            )
        holder = _engine_holder(session, engine)
        if holder is not None:
            raise HostExists(
                f"host {holder} is already reached through engine {engine.key}",
                {"field": "engine_url", "host_id": holder},
            )
        now = utcnow()
        host = Host(
            name=spec.name,
            location=spec.location or ctx.settings.local_location,
            cloud_type=spec.cloud_type.value,
            address=spec.address or _default_address(session, engine),
            client_address=spec.client_address,
            engine_url=spec.engine_url,
            engine_tls_dir=tls_dir,
            vcpus=spec.vcpus or 0,
            memory_gb=spec.memory_gb or 0,
            disk_gb=spec.disk_gb or 0,
            gpu_source=(GpuSource.DECLARED if gpus is not None else GpuSource.NVML).value,
            declared=declared,
            cuda_version=spec.cuda_version,
            healthy=False,
            status=HostStatus.ACTIVE.value,
            is_local=False,
            created_at=now,
            updated_at=now,
        )
        session.add(host)
        try:
            session.flush()
        except IntegrityError:  # a concurrent add of the same name won
            raise HostExists(f"a host named {spec.name!r} exists", {"field": "name"}) from None
        if gpus is not None:
            sync_host_gpus(session, host, gpus)
        view = view_of(session, host.id)
    ctx.wake()
    return view


class Unchanged(Enum):
    """A setting left as it is (None means "unset" for optional settings)."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED


@dataclass(frozen=True)
class HostChanges:
    """Settings of a host to change; :data:`UNCHANGED` leaves one as it is."""

    # Where clients reach its published ports (an IP or DNS name); None: at its address.
    client_address: str | Unchanged | None = UNCHANGED
    # The CUDA driver version the operator declares ("12.4", its form checked by the
    # caller); None: back to what is discovered (NVML, nvidia-smi), unknown until then.
    cuda_version: str | Unchanged | None = UNCHANGED


def update_host(ctx: Context, principal: Principal, host_id: int, changes: HostChanges) -> HostView:
    """(Admin.) Change a host's settings, in one transaction: ``client_address``, the
    address clients reach its published ports at (what pods' public SSH entries show),
    None for the host's own address; ``cuda_version``, which placement compares with
    clusters' ``min_cuda_version``. Raises HostNotFound, ValidationFailed
    (``client_address``) for what is not an IP address or DNS name."""
    principal.require(Scope.ADMIN)
    client_address, cuda_version = changes.client_address, changes.cuda_version
    if isinstance(client_address, str):
        check_host_name(client_address, "client_address")
    with ctx.transaction() as session:
        lock_placement(session)
        host = session.get(Host, host_id)
        if host is None:
            raise HostNotFound(f"host {host_id} not found", {"host_id": host_id})
        changed = False
        if not isinstance(client_address, Unchanged) and host.client_address != client_address:
            host.client_address = client_address
            changed = True
        if not isinstance(cuda_version, Unchanged):
            declared = [f for f in host.declared or () if f != "cuda_version"]
            if cuda_version is not None:
                declared.append("cuda_version")
            host.declared = declared
            host.cuda_version = cuda_version
            changed = True
        if changed:
            host.updated_at = utcnow()
            session.flush()
        view = view_of(session, host_id)
    # Cluster reads show hosts from a brief cache: the new settings are shown at once.
    ctx.references.invalidate()
    if not isinstance(cuda_version, Unchanged):
        ctx.wake()  # clusters waiting for a host of that version may be placed now
    return view


def set_cuda_version(
    ctx: Context, principal: Principal, host_id: int, cuda_version: str | None
) -> HostView:
    """(Admin.) :func:`update_host` of the CUDA version alone."""
    return update_host(ctx, principal, host_id, HostChanges(cuda_version=cuda_version))


def _set_status(ctx: Context, host_id: int, decide: Callable[[HostStatus], HostStatus]) -> HostView:
    """Set the host's status to ``decide(current)``. Raises HostNotFound."""
    with ctx.transaction() as session:
        lock_placement(session)
        host = session.get(Host, host_id)
        if host is None:
            raise HostNotFound(f"host {host_id} not found", {"host_id": host_id})
        status = decide(HostStatus(host.status))
        if host.status != status.value:
            host.status = status.value
            host.updated_at = utcnow()
            session.flush()
        view = view_of(session, host_id)
    ctx.wake()
    return view


def cordon(ctx: Context, principal: Principal, host_id: int) -> HostView:
    """(Admin.) Take no new placements on the host (what runs there stays). Idempotent; a
    draining host stays draining (it is cordoned already). Raises HostNotFound."""
    principal.require(Scope.ADMIN)
    return _set_status(
        ctx,
        host_id,
        lambda now: HostStatus.DRAINING if now is HostStatus.DRAINING else HostStatus.CORDONED,
    )


def uncordon(ctx: Context, principal: Principal, host_id: int) -> HostView:
    """(Admin.) Take placements again; ends a drain too (clusters already moved stay where
    they are). Idempotent. Raises HostNotFound."""
    principal.require(Scope.ADMIN)
    return _set_status(ctx, host_id, lambda _now: HostStatus.ACTIVE)


def _left_on(session: Session, host_id: int) -> dict[str, list[Any]]:
    """Everything that keeps a host from being deleted, by kind (empty kinds left out)."""
    live_trainings = select(TrainingCluster.id).where(TrainingCluster.deleted_at.is_(None))
    left: dict[str, list[Any]] = {
        "clusters": list(
            session.scalars(
                select(Cluster.id)
                .where(
                    Cluster.host_id == host_id,
                    Cluster.status != ClusterStatus.TERMINATED.value,
                )
                .order_by(Cluster.id)
            )
        ),
        "training_clusters": list(
            session.scalars(
                select(TrainingCluster.id)
                .where(
                    TrainingCluster.deleted_at.is_(None),
                    or_(
                        TrainingCluster.host_id == host_id,
                        TrainingCluster.id.in_(
                            select(TrainingNode.cluster_id).where(TrainingNode.host_id == host_id)
                        ),
                    ),
                )
                .order_by(TrainingCluster.id)
            )
        ),
        # Named, so the operator can tell which nodes to drain or which clusters to end.
        "training_nodes": [
            {"node_id": node_id, "name": name, "role": role, "training_cluster_id": cluster_id}
            for node_id, name, role, cluster_id in session.execute(
                select(
                    TrainingNode.id, TrainingNode.name, TrainingNode.role, TrainingNode.cluster_id
                )
                .where(TrainingNode.host_id == host_id, TrainingNode.cluster_id.in_(live_trainings))
                .order_by(TrainingNode.id)
            )
        ],
        "reservations": list(
            session.scalars(
                select(Reservation.cluster_id)
                .where(Reservation.host_id == host_id)
                .order_by(Reservation.cluster_id)
            )
        ),
        "gpu_allocations": [
            {"gpu_index": index, "holder": holder}
            for index, holder in session.execute(
                select(GpuAllocation.gpu_index, GpuAllocation.cluster_id)
                .where(GpuAllocation.host_id == host_id)
                .order_by(GpuAllocation.gpu_index)
            )
        ],
        "port_allocations": [
            {"port": port, "protocol": protocol, "holder": holder}
            for port, protocol, holder in session.execute(
                select(PortAllocation.port, PortAllocation.protocol, PortAllocation.cluster_id)
                .where(PortAllocation.host_id == host_id)
                .order_by(PortAllocation.port, PortAllocation.protocol)
            )
        ],
        "volume_moves": [
            {"cluster_id": cid, "from_host_id": src, "to_host_id": dst, "status": status}
            for cid, src, dst, status in session.execute(
                select(
                    VolumeMove.cluster_id,
                    VolumeMove.from_host_id,
                    VolumeMove.to_host_id,
                    VolumeMove.status,
                )
                .where(
                    or_(VolumeMove.from_host_id == host_id, VolumeMove.to_host_id == host_id),
                    VolumeMove.status.in_(MOVES_IN_FLIGHT),
                )
                .order_by(VolumeMove.cluster_id)
            )
        ],
        # Quarantined volumes hold data nobody has decided about yet (/v1/orphans).
        "orphan_volumes": list(
            session.scalars(
                select(OrphanVolume.name)
                .where(OrphanVolume.host_id == host_id, OrphanVolume.deleted_at.is_(None))
                .order_by(OrphanVolume.name)
            )
        ),
    }
    return {kind: items for kind, items in left.items() if items}


def _describe(left: dict[str, list[Any]]) -> str:
    parts = []
    for kind, items in left.items():
        shown = [
            str(i.get("name") or i.get("cluster_id") or i.get("holder"))
            if isinstance(i, dict)
            else str(i)
            for i in items[:3]
        ]
        more = f", +{len(items) - 3}" if len(items) > 3 else ""
        parts.append(f"{len(items)} {kind.replace('_', ' ')} ({', '.join(shown)}{more})")
    return "; ".join(parts)


def delete_host(ctx: Context, principal: Principal, host_id: int) -> dict[str, Any]:
    """(Admin.) Remove a host that holds nothing: no live cluster or training cluster, no
    reservation, GPU or port allocation, no volume move from or to it and no
    quarantined volume. Its GPU rows go with it; what only remembers it (terminated
    clusters, deleted training clusters, finished moves) forgets it. Raises
    HostNotFound, LocalHostProtected (the server's own machine) or HostNotEmpty
    (``details.left`` lists what is left)."""
    principal.require(Scope.ADMIN)
    with ctx.transaction() as session:
        # No placement can land on it between the check and the delete.
        lock_placement(session)
        host = session.get(Host, host_id)
        if host is None:
            raise HostNotFound(f"host {host_id} not found", {"host_id": host_id})
        name = host.name
        label = f"{name} (#{host_id})"
        if host.is_local:
            raise LocalHostProtected(
                f"host {label} is the machine a gpuyard server runs on; it is registered "
                "at every start of that server and cannot be deleted (cordon it to place "
                "nothing new there)",
                {"host_id": host_id},
            )
        left = _left_on(session, host_id)
        if left:
            raise HostNotEmpty(
                f"host {label} is not empty: {_describe(left)}. Terminate these or "
                "drain the host (POST /v1/hosts/{id}/drain) first",
                {"host_id": host_id, "left": left},
            )
        session.execute(delete(HostGpu).where(HostGpu.host_id == host_id))
        session.execute(
            delete(VolumeMove).where(
                or_(VolumeMove.from_host_id == host_id, VolumeMove.to_host_id == host_id)
            )
        )
        for table in (Cluster, TrainingCluster, TrainingNode):
            session.execute(
                update(table)
                .where(table.host_id == host_id)
                .values(host_id=None)
                .execution_options(synchronize_session=False)
            )
        session.delete(host)
    ctx.wake()
    return {"id": host_id, "name": name, "deleted": True}


def installation_ssh_key(ctx: Context, principal: Principal) -> str:
    """(Admin.) The installation's SSH public key, for a host's ``authorized_keys``."""
    principal.require(Scope.ADMIN)
    return ssh_public_key(ctx.settings.home)


def ssh_public_key(home: Path) -> str:
    """The installation's SSH public key (one OpenSSH line) for hosts' authorized_keys,
    made on first use (runtimes/hosts/ssh_tunnel.py SshKeys)."""
    return SshKeys(home).public_key()
