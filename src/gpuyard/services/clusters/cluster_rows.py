"""One cluster's row as the use cases read it: the caller's (``load_cluster``, the
same 404 for another account's as for none), whether an action suits its status, the
account's principal for the control plane's own moves, and what it asks of a host.
Everything here runs inside the caller's session."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import ClusterNotFound, InvalidState, WorkerCluster
from gpuyard.core.models import CloudType, ResourceRequest
from gpuyard.core.states import (
    REQUIRED_STATUS,
    SUGGESTIONS,
    Action,
    ClusterStatus,
    allowed_actions,
)
from gpuyard.services.tenancy.auth import Principal, Scope
from gpuyard.store.schema import Cluster, Project

# How often a use case retries a transaction that lost a race on the cluster's row
# (its version moved meanwhile) before answering Conflict.
MAX_CONFLICT_RETRIES = 5

# Acting for whichever endpoint a worker cluster belongs to (the control plane's own
# stops: a suspension, a spent budget, a drain).
ANY_ENDPOINT = "*"


def request_of(c: Cluster, cloud_type: CloudType = CloudType.ALL) -> ResourceRequest:
    """What the cluster asks of a host (its container disk; the volume is sized apart)."""
    return ResourceRequest(
        gpu_type=c.gpu_type,
        gpu_count=c.gpu_count,
        vcpus=c.cpu_cores,
        memory_gb=c.memory_gb,
        disk_gb=c.container_disk_gb,
        cloud_type=cloud_type,
        **cuda_of(c),
    )


def cuda_of(c: Cluster) -> dict[str, Any]:
    """The cluster's CUDA constraints as ResourceRequest fields: every placement of it
    (create, a start on another host, a stopped volume's move) honours them."""
    allowed = c.allowed_cuda_versions
    return {
        "min_cuda_version": c.min_cuda_version,
        "allowed_cuda_versions": tuple(allowed) if allowed is not None else None,
    }


def load_cluster(session: Session, principal: Principal, cluster_id: str) -> Cluster:
    """The caller's cluster; another account's id, and a cluster of a project the
    caller may not use (``principal.project_ids``), are indistinguishable from none."""
    cluster = session.scalar(
        select(Cluster)
        .join(Project, Project.id == Cluster.project_id)
        .where(Cluster.id == cluster_id, Project.account_id == principal.account_id)
    )
    if cluster is None or not principal.may_use_project(cluster.project_id):
        raise ClusterNotFound(f"cluster {cluster_id!r} not found", {"cluster_id": cluster_id})
    return cluster


def refuse_worker(cluster: Cluster, acting_for: str | None = None) -> None:
    """Raise WorkerCluster (409) when ``cluster`` is a worker of a serverless endpoint
    and the caller does not act for that endpoint (``acting_for``: the endpoint's id,
    :data:`ANY_ENDPOINT` for the control plane's own stops, None for a user)."""
    endpoint_id = cluster.serverless_endpoint_id
    if endpoint_id is None or acting_for in (ANY_ENDPOINT, endpoint_id):
        return
    raise WorkerCluster(
        f"this cluster is a worker of endpoint {endpoint_id}: its endpoint's scaler starts "
        "and stops it (change or delete the endpoint instead)",
        {"cluster_id": cluster.id, "endpoint_id": endpoint_id},
    )


def require_action(cluster: Cluster, action: Action) -> None:
    status = ClusterStatus(cluster.status)
    allowed = allowed_actions(status)
    if action not in allowed:
        raise InvalidState(
            f"Cannot {action.value} a cluster that is {status.value}",
            {
                "current_status": status.value,
                "required_status": REQUIRED_STATUS[action],
                "allowed_actions": [a.value for a in allowed],
                "suggestion": SUGGESTIONS[action],
            },
        )


def owner_principal(session: Session, cluster_id: str) -> Principal | None:
    """Acting for the cluster's account (the control plane's own moves)."""
    row = session.execute(
        select(Project.account_id, Project.id)
        .join(Cluster, Cluster.project_id == Project.id)
        .where(Cluster.id == cluster_id)
    ).one_or_none()
    if row is None:
        return None
    return Principal(
        key_id=0, user_id=0, account_id=row[0], scope=Scope.WRITE, default_project_id=row[1]
    )
