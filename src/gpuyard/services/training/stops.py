"""The control plane's stop of a training cluster, and its start again.

An account that is suspended or whose money ran out has its training clusters stopped
as its other clusters are: at the stop every node's meter closes (billing ends then)
and the cluster goes ``stopping``; the operator (reconciler/training/operator.py) removes the
node containers and only then (:func:`finish_stop`) releases their capacity (GPUs,
vCPUs, memory) and marks it ``stopped``: a GPU is never handed to another cluster while
a node container may still use it. The Slurm state volume (the job queue), the private
network, the SSH port and every setting are kept. ``restart_cluster`` on a stopped
cluster claims the nodes' places again on the same host (the state volume lives there),
reopens the meters and has the operator build the nodes anew, once the account takes
new work again.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import InsufficientCapacity
from gpuyard.core.states import ClusterStatus
from gpuyard.core.training import clusters as domain
from gpuyard.core.training.clusters import NodeRole, NodeStatus, TrainingStatus
from gpuyard.services.billing.admission import refuse_closed_account
from gpuyard.services.billing.quotas import check_training
from gpuyard.services.capacity.placement import claim, lock_placement, release_all
from gpuyard.services.context import Context
from gpuyard.services.training.nodes import (
    begin_operation,
    meter_node,
    node_request,
    nodes_of,
    plan_of,
    transition_training,
)
from gpuyard.store.schema import TrainingCluster

STOP = "stop"
START = "start"


def holding_clusters(session: Session, account_id: int) -> list[int]:
    """The account's training clusters whose nodes hold capacity and are billed (the
    ones a stop applies to), oldest first."""
    return list(
        session.scalars(
            select(TrainingCluster.id)
            .where(
                TrainingCluster.account_id == account_id,
                TrainingCluster.deleted_at.is_(None),
                TrainingCluster.status.in_([s.value for s in domain.HOLDING]),
            )
            .order_by(TrainingCluster.id)
        )
    )


def stop_cluster(ctx: Context, cluster_id: int, reason: str) -> bool:
    """Stop training cluster ``cluster_id`` for the control plane's ``reason`` (shown
    as its status reason and in its events): billing ends now, capacity once the
    operator has removed the nodes (:func:`finish_stop`); a running operation is
    superseded. True when a stop began; False for a cluster that holds nothing (stopping
    or stopped already, deleting, gone). Idempotent."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        cluster = session.get(TrainingCluster, cluster_id, with_for_update=True)
        if (
            cluster is None
            or cluster.deleted_at is not None
            or TrainingStatus(cluster.status) not in domain.HOLDING
        ):
            return False
        begin_stop(session, cluster, reason, now)
    ctx.training_wake(cluster_id)
    return True


def begin_stop(session: Session, cluster: TrainingCluster, reason: str, now: datetime) -> None:
    """Inside the caller's transaction, for a cluster (locked) whose nodes hold their
    places: close every node's meter and record the ``stop`` operation with ``reason``.
    The caller wakes the operator after the commit."""
    for node in nodes_of(session, cluster.id):
        meter_node(session, cluster, node, ClusterStatus.STOPPED, now)
    begin_operation(
        session,
        cluster,
        TrainingStatus.STOPPING,
        {"action": STOP, "reason": reason},
        reason,
        now,
    )


def finish_stop(ctx: Context, cluster_id: int, token: str) -> bool:
    """After the operator removed every node container of stop ``token``: release the
    nodes' capacity and mark the cluster ``stopped`` (its reason kept). False, changing
    nothing, when that stop is no longer the recorded operation (a delete superseded
    it)."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        cluster = session.get(TrainingCluster, cluster_id, with_for_update=True)
        operation = cluster.operation if cluster is not None else None
        if cluster is None or not operation or operation.get("token") != token:
            return False
        lock_placement(session)
        for node in nodes_of(session, cluster_id):
            release_all(session, domain.node_owner(node.id))
            node.gpu_indices = []
            node.status = NodeStatus.STOPPED.value
            node.container_id = None
            node.lifecycle_status = None
        why = str(operation.get("reason") or "stopped")
        transition_training(session, cluster, TrainingStatus.STOPPED, why, now)
    return True


def start_stopped(ctx: Context, session: Session, cluster: TrainingCluster, now: datetime) -> None:
    """Inside restart_cluster's transaction, for a stopped cluster (locked): refuse
    unless its account takes new work, claim every node's place again on its host,
    reopen the meters, begin the ``start`` operation and check the quotas with the
    cluster counted. Raises AccountSuspended, BudgetExhausted, InsufficientCapacity or
    QuotaExceeded; the caller's transaction then rolls back and it stays stopped."""
    lock_placement(session)
    refuse_closed_account(session, cluster.account_id)
    plan = plan_of(cluster)
    nodes = nodes_of(session, cluster.id)
    for node in nodes:
        if node.host_id is None:
            raise InsufficientCapacity(
                f"node {node.name} has no host to start on", {"node": node.name}
            )
        placement = claim(
            session,
            cluster_id=domain.node_owner(node.id),
            request=node_request(NodeRole(node.role), plan),
            volume_gb=0,
            ratios=ctx.settings.allocation_ratios,
            now=now,
            host_id=node.host_id,
            not_enough_message=(
                "not enough free capacity on the cluster's host to start it again "
                "(it stays stopped; try again later, or delete it)"
            ),
        )
        node.gpu_indices = list(placement.gpu_indices)
        # Every node is built anew, on the cluster's image: an update_image the stop
        # cut short ends with it.
        node.image_version_id = cluster.image_version_id
        meter_node(session, cluster, node, ClusterStatus.RUNNING, now)
    begin_operation(
        session, cluster, TrainingStatus.RESTARTING, {"action": START}, "starting every node", now
    )
    # A new run: its runtime and cost limits count from here, as its billing does.
    cluster.run_started_at = now
    check_training(session, cluster.account_id, cluster.project_id, [n.id for n in nodes])
