"""What every part of the training service shares about a cluster's nodes and status:
the node plan, the nodes of a cluster, what a node claims, its meter, and the one
function that changes a training cluster's status.

Kept apart from services/training/use_cases.py (create, delete, actions) so the control plane's
stop and start (services/training/stops.py) use the same rules without importing it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.models import CloudType, ResourceRequest
from gpuyard.core.states import ClusterStatus
from gpuyard.core.training import clusters as domain
from gpuyard.core.training.clusters import NodeRole, TrainingStatus
from gpuyard.services.clusters.lifecycle import IllegalTransition, meter_status, record_event
from gpuyard.store.schema import TrainingCluster, TrainingNode


@dataclass(frozen=True)
class NodePlan:
    gpu_type: str
    gpus_per_node: int
    cpus_per_node: int
    memory_gb_per_node: int
    sku_id: int | None


def nodes_of(session: Session, cluster_id: int) -> list[TrainingNode]:
    """The cluster's nodes: the controller first, then workers in the order made."""
    return list(
        session.scalars(
            select(TrainingNode)
            .where(TrainingNode.cluster_id == cluster_id)
            .order_by(TrainingNode.role, TrainingNode.id)
        )
    )


def plan_of(cluster: TrainingCluster) -> NodePlan:
    return NodePlan(
        cluster.gpu_type,
        cluster.gpus_per_node,
        cluster.cpus_per_node,
        cluster.memory_gb_per_node,
        cluster.sku_id,
    )


def node_request(role: NodeRole, plan: NodePlan) -> ResourceRequest:
    """What one node of ``role`` claims on its host."""
    if role is NodeRole.CONTROLLER:
        return ResourceRequest(
            gpu_type=None,
            gpu_count=0,
            vcpus=domain.CONTROLLER_VCPUS,
            memory_gb=domain.CONTROLLER_MEMORY_GB,
            disk_gb=0,
            cloud_type=CloudType.ALL,
        )
    return ResourceRequest(
        gpu_type=plan.gpu_type,
        gpu_count=plan.gpus_per_node,
        vcpus=plan.cpus_per_node,
        memory_gb=plan.memory_gb_per_node,
        disk_gb=0,
        cloud_type=CloudType.ALL,
    )


def meter_node(
    session: Session,
    cluster: TrainingCluster,
    node: TrainingNode,
    status: ClusterStatus,
    now: datetime,
) -> None:
    """Open (``running``) or close (``stopped``, ``terminated``) the node's usage
    intervals: a node is billed like an on-demand cluster of its size while it holds
    its place, from placement to a stop or the deletion (a node holds no volume, so a
    stopped one bills nothing). Like a cluster's, its meter opens nothing while its own
    host is unreachable (services/clusters/lifecycle.billing_paused)."""
    worker = node.role == NodeRole.WORKER
    as_cluster = SimpleNamespace(
        id=domain.node_owner(node.id),
        project_id=cluster.project_id,
        host_id=node.host_id,
        gpu_type=cluster.gpu_type if worker else None,
        gpu_count=cluster.gpus_per_node if worker else 0,
        cpu_cores=cluster.cpus_per_node if worker else domain.CONTROLLER_VCPUS,
        memory_gb=cluster.memory_gb_per_node if worker else domain.CONTROLLER_MEMORY_GB,
        container_disk_gb=0,
        volume_gb=0,
        cloud_type=CloudType.SECURE.value,
        interruptible=False,
        bid_per_gpu=None,
    )
    meter_status(session, as_cluster, status, now)


def billed_nodes_on(session: Session, host_id: int) -> list[tuple[TrainingCluster, TrainingNode]]:
    """The nodes on ``host_id`` that hold their place and are billed (their cluster is
    live and in a status that holds, ``domain.HOLDING``), with their cluster: what a
    host's reachability pauses and resumes the meters of."""
    rows = session.execute(
        select(TrainingCluster, TrainingNode)
        .join(TrainingNode, TrainingNode.cluster_id == TrainingCluster.id)
        .where(
            TrainingNode.host_id == host_id,
            TrainingCluster.deleted_at.is_(None),
            TrainingCluster.status.in_([s.value for s in domain.HOLDING]),
        )
        .order_by(TrainingNode.cluster_id, TrainingNode.id)
    )
    return [(row[0], row[1]) for row in rows]


def transition_training(
    session: Session,
    cluster: TrainingCluster,
    target: TrainingStatus,
    reason: str,
    now: datetime,
    *,
    operation: dict[str, Any] | None = None,
    error_message: str | None = None,
) -> None:
    """The one place a training cluster's status changes (the cluster row read in this
    session, locked where the caller needs it). Checks the transition table, sets the
    reason, error message and recorded operation, bumps the version and records an
    event under the cluster's holder id. Raises IllegalTransition."""
    current = TrainingStatus(cluster.status)
    if not domain.can_transition(current, target):
        raise IllegalTransition(
            f"training cluster {cluster.id}: {current} -> {target} is not allowed"
        )
    cluster.status = target.value
    cluster.status_reason = reason
    cluster.error_message = error_message
    cluster.operation = operation
    cluster.updated_at = now
    cluster.version += 1
    message = f"{reason}: {error_message}" if error_message else reason
    record_event(session, domain.cluster_owner(cluster.id), now, "status", message, current, target)


def begin_operation(
    session: Session,
    cluster: TrainingCluster,
    status: TrainingStatus,
    operation: dict[str, Any],
    reason: str,
    now: datetime,
) -> None:
    """Start an operation: the status it runs in, and the operation with a new token
    (a running job of an older token stops at its next step)."""
    operation = {**operation, "token": secrets.token_hex(8)}
    transition_training(session, cluster, status, reason, now, operation=operation)
