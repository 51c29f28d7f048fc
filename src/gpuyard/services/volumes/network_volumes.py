"""Network volumes (RunPod's): storage that outlives clusters, on one host.

A network volume is an engine volume on one host of a data centre (a host
``location``), mounted by any number of the account's clusters placed on that host.

- **Capacity.** Its disk is held by a ``reservations`` row whose holder is the volume's
  id (claimed like a cluster's, services/capacity/placement.py, so two creates racing for the
  last disk of a host cannot both commit); growing it claims the difference there.
- **The engine volume** (``Ownership.network_volume``) is made by the reconciler when
  the first cluster mounting it starts (reconciler/clusters/driver.py), with our labels; a
  volume never mounted has none yet.
- **Billing.** From creation to deletion, per second, by size (``network_volume``
  meter, the volume's id as holder, services/billing/storage.py); a size change
  closes the interval and opens one at the new rate.
- **Deletion** is refused while a cluster that is not terminated mounts it or while
  snapshots of it exist. It is recorded first (``deleted_at``; billing ends), then the
  engine volume is removed and the disk released; when the host does not answer, the
  reconciler's volume duty finishes it (reconciler/duties/volume_usage.py), and until then the
  orphan collector counts the engine volume as known.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from pydantic import Field, field_validator
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gpuyard.core.errors import (
    GpuyardError,
    InvalidState,
    NetworkVolumeInUse,
    NetworkVolumeNotFound,
    ValidationFailed,
)
from gpuyard.core.ids import new_network_volume_id
from gpuyard.core.input_rules import REQUIRED_NAME_PATTERN, check_name
from gpuyard.core.models import CloudType, ResourceRequest
from gpuyard.core.snapshots import RestoreStatus
from gpuyard.core.states import ClusterStatus
from gpuyard.observability.crash_points import crash_point
from gpuyard.runtimes.base import Runtime
from gpuyard.services.billing.admission import refuse_closed_account
from gpuyard.services.billing.quotas import check_storage
from gpuyard.services.billing.storage import bill_storage, stop_storage_billing
from gpuyard.services.capacity.placement import claim, lock_placement, release_all
from gpuyard.services.catalog.locations import check_location
from gpuyard.services.clusters.requests import MAX_ID, _Body
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import in_usable_projects, project_for_create
from gpuyard.store.schema import (
    Cluster,
    NetworkVolume,
    Reservation,
    Snapshot,
    VolumeRestore,
)

log = logging.getLogger(__name__)

# The largest network volume, in GB (64 TiB: what one host's disk may sensibly hold).
MAX_SIZE_GB = 65536
METER = "network_volume"
# A storage claim outbids nobody: a volume never preempts a spot cluster (which would
# free its compute and container disk, not the disk a volume needs anyway).
_NO_PREEMPTION = 0.0


class CreateNetworkVolume(_Body):
    """``POST /v1/networkvolumes`` (RunPod's body): a name, a size in GB and the data
    centre (a host location, ``GET /v1/locations``) it lives in."""

    name: str = Field(
        min_length=1, max_length=200, json_schema_extra={"pattern": REQUIRED_NAME_PATTERN}
    )
    size: int = Field(ge=1, le=MAX_SIZE_GB, strict=True, description="Size in GB")
    data_center_id: str = Field(
        alias="dataCenterId",
        min_length=1,
        max_length=100,
        description="A host location (data centre) of this installation",
    )
    project_id: int | None = Field(default=None, ge=1, le=MAX_ID, strict=True)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return check_name(name)


class UpdateNetworkVolume(_Body):
    """``PATCH /v1/networkvolumes/{id}``: a new name and/or a larger size."""

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        json_schema_extra={"pattern": REQUIRED_NAME_PATTERN},
    )
    size: int | None = Field(
        default=None, ge=1, le=MAX_SIZE_GB, strict=True, description="Size in GB; only grows"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str | None) -> str | None:
        return None if name is None else check_name(name)


@dataclass(frozen=True)
class NetworkVolumeView:
    """What every surface shows of a network volume."""

    id: str
    name: str
    size_gb: int
    location: str
    project_id: int
    host_id: int
    used_bytes: int | None
    measured_at: datetime | None
    created_at: datetime
    attached_cluster_ids: tuple[str, ...]


def _view(nv: NetworkVolume, attached: Iterable[str]) -> NetworkVolumeView:
    return NetworkVolumeView(
        id=nv.id,
        name=nv.name,
        size_gb=nv.size_gb,
        location=nv.location,
        project_id=nv.project_id,
        host_id=nv.host_id,
        used_bytes=nv.used_bytes,
        measured_at=nv.measured_at,
        created_at=nv.created_at,
        attached_cluster_ids=tuple(sorted(attached)),
    )


def load_network_volume(session: Session, principal: Principal, volume_id: str) -> NetworkVolume:
    """The caller's live network volume, inside the caller's session: of the acting
    account, in a project the caller may use. Another account's id, another
    project's (for a key or member restricted to some projects), a deleted volume and
    an unknown id are all NetworkVolumeNotFound."""
    nv = session.scalar(
        select(NetworkVolume).where(
            NetworkVolume.id == volume_id,
            NetworkVolume.account_id == principal.account_id,
            NetworkVolume.deleted_at.is_(None),
        )
    )
    if nv is None or not principal.may_use_project(nv.project_id):
        raise NetworkVolumeNotFound(
            f"network volume {volume_id!r} not found", {"network_volume_id": volume_id}
        )
    return nv


def _attached(session: Session, volume_ids: list[str]) -> dict[str, list[str]]:
    """The clusters (not terminated) mounting each volume, by volume id."""
    out: dict[str, list[str]] = {v: [] for v in volume_ids}
    if volume_ids:
        rows = session.execute(
            select(Cluster.network_volume_id, Cluster.id).where(
                Cluster.network_volume_id.in_(volume_ids),
                Cluster.status != ClusterStatus.TERMINATED.value,
            )
        )
        for volume_id, cluster_id in rows:
            out[str(volume_id)].append(cluster_id)
    return out


def _bill(ctx: Context, session: Session, nv: NetworkVolume, now: datetime) -> None:
    bill_storage(
        session,
        holder_id=nv.id,
        project_id=nv.project_id,
        meter=METER,
        gb=nv.size_gb,
        price_gb_month=ctx.settings.price_network_volume_gb_month,
        now=now,
    )


def _disk_only(location: str | None) -> ResourceRequest:
    return ResourceRequest(
        gpu_type=None,
        gpu_count=0,
        vcpus=0,
        memory_gb=0,
        disk_gb=0,
        cloud_type=CloudType.ALL,
        location=location,
    )


def create_network_volume(
    ctx: Context, principal: Principal, body: CreateNetworkVolume
) -> NetworkVolumeView:
    """Place and record a network volume: on a host of ``dataCenterId`` that takes
    placements and has ``size`` GB of disk free, held by a reservation in the same
    transaction; billed from now. Raises ValidationFailed (``dataCenterId`` unknown),
    InsufficientCapacity (no host there has the disk), NotFound (a project of another
    account or one the caller may not use), AccountSuspended or BudgetExhausted;
    nothing is stored then."""
    principal.require_write()
    now = ctx.clock.now()
    with ctx.transaction() as session:
        refuse_closed_account(session, principal.account_id)
        project_id = project_for_create(session, principal, body.project_id)
        check_location(session, body.data_center_id, "dataCenterId")
        volume_id = new_network_volume_id()
        placement = claim(
            session,
            cluster_id=volume_id,
            request=_disk_only(body.data_center_id),
            volume_gb=body.size,
            ratios=ctx.settings.allocation_ratios,
            now=now,
            bid=_NO_PREEMPTION,
            not_enough_message=(
                f"no host in {body.data_center_id} has {body.size} GB of disk free"
            ),
            policy=ctx.settings.placement_policy,
        )
        nv = NetworkVolume(
            id=volume_id,
            account_id=principal.account_id,
            project_id=project_id,
            name=body.name,
            size_gb=body.size,
            host_id=placement.host_id,
            location=body.data_center_id,
            volume_name=ctx.ownership.network_volume(volume_id),
            created_at=now,
            updated_at=now,
            version=1,
        )
        session.add(nv)
        session.flush()
        check_storage(session, principal.account_id, project_id, volume_gb=body.size)
        _bill(ctx, session, nv, now)
        view = _view(nv, ())
    crash_point("network_volume.create.after_row")
    return view


def list_network_volumes(ctx: Context, principal: Principal) -> list[NetworkVolumeView]:
    """The account's network volumes (not deleted) in the projects the caller may
    use, newest first."""
    with ctx.read() as session:
        rows = list(
            session.scalars(
                select(NetworkVolume)
                .where(
                    NetworkVolume.account_id == principal.account_id,
                    NetworkVolume.deleted_at.is_(None),
                    in_usable_projects(principal, NetworkVolume.project_id),
                )
                .order_by(NetworkVolume.created_at.desc(), NetworkVolume.id)
            )
        )
        attached = _attached(session, [nv.id for nv in rows])
        return [_view(nv, attached[nv.id]) for nv in rows]


def get_network_volume(ctx: Context, principal: Principal, volume_id: str) -> NetworkVolumeView:
    """One of the caller's network volumes. Raises NetworkVolumeNotFound."""
    with ctx.read() as session:
        nv = load_network_volume(session, principal, volume_id)
        return _view(nv, _attached(session, [nv.id])[nv.id])


def update_network_volume(
    ctx: Context,
    principal: Principal,
    volume_id: str,
    body: UpdateNetworkVolume,
    runtime_of: Callable[[int | None], Runtime] | None = None,
) -> NetworkVolumeView:
    """Rename and/or grow a network volume. Growing claims the extra disk on its host
    (InsufficientCapacity when the host lacks it, or takes no placements: cordoned,
    draining, unreachable) and bills the new size from now; a smaller size is a
    ValidationFailed naming ``size`` with the current size. Growing is billed storage:
    a suspended account, or one whose budget or balance is spent, is refused
    (AccountSuspended 403, BudgetExhausted 402); a rename is not. With ``runtime_of``
    the engine volume is then grown on its host (its enforced size, runtimes/
    runtimes/volumes/images.py); where the host does not answer, the next start of a cluster
    that mounts it grows it."""
    principal.require_write()
    now = ctx.clock.now()
    grown_to: tuple[int | None, str, int] | None = None
    with ctx.transaction() as session:
        lock_placement(session)
        nv = load_network_volume(session, principal, volume_id)
        if body.size is not None and body.size < nv.size_gb:
            raise ValidationFailed(
                "size",
                f"a network volume only grows ({nv.size_gb} GB -> {body.size} GB)",
                {"current_size": nv.size_gb},
            )
        changed = False
        if body.size is not None and body.size != nv.size_gb:
            # Under the placement lock, which a suspension or exhaustion takes too.
            refuse_closed_account(session, nv.account_id)
            claim(
                session,
                cluster_id=nv.id,
                request=_disk_only(None),
                volume_gb=body.size,
                ratios=ctx.settings.allocation_ratios,
                now=now,
                host_id=nv.host_id,
                bid=_NO_PREEMPTION,
                not_enough_message=(
                    f"the network volume's host lacks {body.size - nv.size_gb} GB more disk"
                ),
            )
            grown = body.size - nv.size_gb
            nv.size_gb = body.size
            check_storage(session, nv.account_id, nv.project_id, volume_gb=grown)
            _bill(ctx, session, nv, now)
            changed = True
            grown_to = (nv.host_id, nv.volume_name, nv.size_gb)
        if body.name is not None and body.name != nv.name:
            nv.name = body.name
            changed = True
        if changed:
            nv.updated_at = now
            nv.version += 1
        view = _view(nv, _attached(session, [nv.id])[nv.id])
    if grown_to is not None and runtime_of is not None:
        host_id, name, size_gb = grown_to
        try:
            runtime_of(host_id).ensure_volume(name, volume_id, size_gb)
        except GpuyardError as exc:
            log.warning("network volume %s grows on its next use: %s", volume_id, exc.message)
    return view


def delete_network_volume(
    ctx: Context,
    principal: Principal,
    volume_id: str,
    runtime_of: Callable[[int | None], Runtime],
) -> None:
    """Delete a network volume and its data. Refused with NetworkVolumeInUse (details
    ``cluster_ids``, ``snapshot_ids``) while a cluster that is not terminated mounts it
    or snapshots of it exist; NetworkVolumeNotFound for an unknown or foreign id.

    Recorded first (billing ends now; no cluster can mount it from now on), then the
    engine volume is removed on its host and the disk released. If the host does not
    answer, the reconciler finishes the removal later (``finish_deletions``)."""
    principal.require_write()
    now = ctx.clock.now()
    with ctx.transaction() as session:
        # A create mounting it takes this lock before reading the volume: the two
        # cannot interleave, so no cluster mounts a volume being deleted.
        lock_placement(session)
        nv = load_network_volume(session, principal, volume_id)
        if session.scalar(
            select(VolumeRestore.id).where(
                VolumeRestore.holder_id == nv.id,
                VolumeRestore.status == RestoreStatus.RESTORING.value,
            )
        ):
            raise InvalidState(
                f"network volume {nv.id} is being restored; delete it once that is done",
                {"network_volume_id": nv.id},
            )
        users = _attached(session, [nv.id])[nv.id]
        snapshots = list(
            session.scalars(
                select(Snapshot.id)
                .where(
                    Snapshot.source_network_volume_id == nv.id,
                    Snapshot.deleted_at.is_(None),
                )
                .order_by(Snapshot.id)
            )
        )
        if users or snapshots:
            what = []
            if users:
                what.append(f"mounted by cluster(s) {', '.join(sorted(users))}")
            if snapshots:
                what.append(f"has snapshot(s) {', '.join(snapshots)}")
            raise NetworkVolumeInUse(
                f"network volume {nv.id} is {' and '.join(what)}; terminate those clusters "
                "and delete those snapshots first",
                {"cluster_ids": sorted(users), "snapshot_ids": snapshots},
            )
        nv.deleted_at = nv.updated_at = now
        nv.version += 1
        stop_storage_billing(session, nv.id, now)
        pending = PendingRemoval(nv.id, nv.host_id, nv.volume_name)
    crash_point("network_volume.delete.after_row")
    try:
        runtime = runtime_of(pending.host_id)
    except GpuyardError as exc:
        log.warning("network volume %s: removal left to the reconciler: %s", volume_id, exc)
        return
    remove_engine_volume(ctx, runtime, pending)


def mount_for_cluster(
    session: Session,
    principal: Principal,
    volume_id: str,
    location: str | None,
    project_id: int | None,
) -> NetworkVolume:
    """The network volume a new cluster mounts (inside the create's transaction, which
    this serialises against deletes). A cluster mounts only a volume of its own
    project — the volume's data would otherwise be open to whoever may use the
    cluster's project — so a create that names a project (``project_id``) must name
    the volume's, and one that names none lands in the volume's. Raises
    NetworkVolumeNotFound (also for a project the caller may not use),
    ValidationFailed on ``network_volume_id`` for a volume of another project than the
    one named, or on ``location`` when the cluster is pinned to another data
    centre."""
    lock_placement(session)
    nv = load_network_volume(session, principal, volume_id)
    if project_id is not None and nv.project_id != project_id:
        raise ValidationFailed(
            "network_volume_id",
            f"network volume {nv.id} belongs to project {nv.project_id}, not to the "
            f"cluster's project {project_id}",
            {"network_volume_project_id": nv.project_id, "project_id": project_id},
        )
    if location is not None and location != nv.location:
        raise ValidationFailed(
            "location",
            f"network volume {nv.id} is in {nv.location}, not {location}",
            {"network_volume_location": nv.location},
        )
    return nv


# -- the reconciler's side ------------------------------------------------------------


@dataclass(frozen=True)
class PendingRemoval:
    """A deleted network volume whose engine volume (and disk) is still held."""

    volume_id: str
    host_id: int
    volume_name: str


def pending_removals(ctx: Context, host_ids: tuple[int, ...] | None) -> list[PendingRemoval]:
    """Deleted network volumes (on ``host_ids``; None: every host) that still hold
    their reservation: their engine volume may still exist."""
    with ctx.read() as session:
        q = (
            select(NetworkVolume.id, NetworkVolume.host_id, NetworkVolume.volume_name)
            .join(Reservation, Reservation.cluster_id == NetworkVolume.id)
            .where(NetworkVolume.deleted_at.is_not(None))
        )
        if host_ids is not None:
            q = q.where(NetworkVolume.host_id.in_(host_ids))
        return [PendingRemoval(*row) for row in session.execute(q.order_by(NetworkVolume.id))]


def remove_engine_volume(ctx: Context, runtime: Runtime, pending: PendingRemoval) -> bool:
    """Remove a deleted network volume's engine volume, then release its disk.
    Idempotent; False (nothing released) when the engine refuses or does not answer."""
    try:
        runtime.remove_volume(pending.volume_name)
    except GpuyardError as exc:
        log.warning(
            "network volume %s: engine volume %s not removed yet: %s",
            pending.volume_id,
            pending.volume_name,
            exc.message,
        )
        return False
    crash_point("network_volume.delete.after_engine_remove")
    with ctx.transaction() as session:
        release_all(session, pending.volume_id)
    return True


def finish_deletions(ctx: Context, runtime: Runtime, host_ids: tuple[int, ...] | None) -> int:
    """Remove what deletes left on the engine of ``host_ids``; returns how many."""
    return sum(remove_engine_volume(ctx, runtime, p) for p in pending_removals(ctx, host_ids))


def known_engine_names(session: Session) -> set[str]:
    """Engine volumes of network volumes that live, or whose removal is pending (the
    orphan collector must never quarantine either)."""
    rows = session.scalars(
        select(NetworkVolume.volume_name)
        .outerjoin(Reservation, Reservation.cluster_id == NetworkVolume.id)
        .where(or_(NetworkVolume.deleted_at.is_(None), Reservation.cluster_id.is_not(None)))
    )
    return set(rows)
