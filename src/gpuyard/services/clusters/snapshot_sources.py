"""Which snapshot a cluster's create (a clone) or start (a restore) takes, checked
inside that create's or start's transaction (services/clusters/use_cases.py)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpuyard.core.errors import InvalidState, ValidationFailed
from gpuyard.services.billing.storage import GB
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.volumes.snapshots import restorable
from gpuyard.store.schema import Cluster, Snapshot


def restorable_for(
    session: Session, principal: Principal, cluster: Cluster, body: StartCluster
) -> Snapshot | None:
    """The ready snapshot ``body`` restores (None: no restore). Raises SnapshotNotFound
    (unknown, another account's or project's), SnapshotNotReady, ValidationFailed (no volume) or
    InvalidState (a network volume: restored on its own, not through one cluster)."""
    if not body.restore_from_snapshot:
        return None
    snap = restorable(session, principal, body.restore_from_snapshot)
    if cluster.network_volume_id is not None:
        raise InvalidState(
            "this cluster mounts a network volume; restore the network volume itself",
            {
                "network_volume_id": cluster.network_volume_id,
                "suggestion": "POST /v1/networkvolumes/{id}/restore with the snapshot_id",
            },
        )
    if cluster.volume_gb <= 0:
        raise ValidationFailed(
            "restore_from_snapshot",
            "this cluster has no volume to restore into",
            {"volume_gb": cluster.volume_gb},
        )
    return snap


def clone_source(session: Session, principal: Principal, body: CreateCluster) -> Snapshot | None:
    """The ready snapshot a create clones (None: not a clone). Raises SnapshotNotFound,
    SnapshotNotReady, ValidationFailed (with a network volume: restore that instead)."""
    if body.snapshot_id is None:
        return None
    if body.network_volume_id is not None:
        raise ValidationFailed(
            "snapshot_id",
            "a cluster mounting a network volume has no volume of its own to clone into; "
            "restore the network volume instead",
        )
    return restorable(session, principal, body.snapshot_id)


def check_fits(snap: Snapshot, volume_gb: int, field: str = "restore_from_snapshot") -> None:
    """A snapshot whose data is larger than the volume is refused (grow it first)."""
    if snap.size_bytes is not None and snap.size_bytes > volume_gb * GB:
        raise ValidationFailed(
            field,
            f"snapshot {snap.id} holds {snap.size_bytes} bytes, more than the volume's "
            f"{volume_gb} GB; grow it with update_configuration.storage_gb",
            {"size_bytes": snap.size_bytes, "volume_gb": volume_gb},
        )
