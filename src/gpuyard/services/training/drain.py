"""A draining host's training nodes: the store's side of moving them away.

A drain (services/clusters/moves.py ``drain_host``) sends a host's training workers to other
hosts of their cluster's location, one node at a time and all or nothing per node:
under the placement lock, the node's capacity is claimed on another active, healthy
host (its old claim on the draining host is released in the same claim: one holder,
``tn-<node id>``, holds one place), ``node.host_id`` names the new host, the node is
marked ``replacing`` and the cluster records a ``move_nodes`` operation naming the
moved nodes and the host each left. The training operator carries it out: it removes
each node's old container on the host it left and creates it, same name, on its new
host, where it rejoins Slurm (the controller and its state volume are untouched, so
the queue and the jobs on other nodes are kept).

What cannot move is answered per node with the reason, and tried again on every scan
while the host drains (reconciler/duties/drains.py): a controller never moves (its Slurm state
volume lives on its host); a cluster busy with an operation, stopping, or in
``error`` waits; a host that does not answer keeps its nodes (their containers may
still run there, so their GPUs are not given to anyone else); and a node no other
host of the location has room for stays. A stopped cluster's workers hold nothing:
they are only pointed at a host of the location with room for them now, where its
start claims their places.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import InsufficientCapacity
from gpuyard.core.fleet import HostStatus
from gpuyard.core.models import ResourceRequest
from gpuyard.core.training import clusters as domain
from gpuyard.core.training.clusters import NodeRole, NodeStatus, TrainingStatus
from gpuyard.services.capacity.candidates import candidate_hosts
from gpuyard.services.capacity.placement import claim, lock_placement
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.context import Context
from gpuyard.services.training.nodes import begin_operation, node_request, nodes_of, plan_of
from gpuyard.services.training.placement import hosts_without_overlay
from gpuyard.store.schema import Host, TrainingCluster, TrainingNode

log = logging.getLogger(__name__)

# The operation a drain records: {"action": MOVE_NODES, "nodes": [node ids],
# "from_hosts": {"<node id>": host id it left}} (JSON keys are strings).
MOVE_NODES = "move_nodes"


@dataclass(frozen=True)
class NodeMoving:
    node_id: int
    name: str
    training_cluster_id: int
    to_host_id: int


@dataclass(frozen=True)
class NodeStays:
    node_id: int
    name: str
    training_cluster_id: int
    role: str
    reason: str


@dataclass
class TrainingDrain:
    """What a drain did with the host's training nodes."""

    moving: list[NodeMoving] = field(default_factory=list)
    cannot_move: list[NodeStays] = field(default_factory=list)


def _label(host: Host | None, host_id: int) -> str:
    return f"{host.name} (#{host_id})" if host is not None else f"#{host_id}"


def drain_training_nodes(ctx: Context, host_id: int) -> TrainingDrain:
    """Send the training nodes on ``host_id`` to other hosts of their location (see the
    module's docstring); each cluster in its own transaction. Idempotent: a node that
    moved is no longer on the host. Wakes the operator for each cluster given a move."""
    with ctx.read() as session:
        cluster_ids = list(
            session.scalars(
                select(TrainingNode.cluster_id)
                .join(TrainingCluster, TrainingCluster.id == TrainingNode.cluster_id)
                .where(TrainingNode.host_id == host_id, TrainingCluster.deleted_at.is_(None))
                .distinct()
                .order_by(TrainingNode.cluster_id)
            )
        )
    report = TrainingDrain()
    for cluster_id in cluster_ids:
        if _drain_cluster(ctx, cluster_id, host_id, report):
            ctx.training_wake(cluster_id)
    return report


def retry_training_drains(ctx: Context, host_ids: Sequence[int]) -> None:
    """Move what could not move yet off those of ``host_ids`` that drain (empty: every
    draining host) and still hold a worker of a live cluster (a controller never
    moves). Level based: called on every scan of a host's engine."""
    workers = (
        select(TrainingNode.host_id)
        .join(TrainingCluster, TrainingCluster.id == TrainingNode.cluster_id)
        .where(TrainingNode.role == NodeRole.WORKER.value, TrainingCluster.deleted_at.is_(None))
    )
    with ctx.read() as session:
        q = (
            select(Host.id)
            .where(Host.status == HostStatus.DRAINING.value, Host.id.in_(workers))
            .order_by(Host.id)
        )
        if host_ids:
            q = q.where(Host.id.in_(list(host_ids)))
        draining = list(session.scalars(q))
    for host_id in draining:
        report = drain_training_nodes(ctx, host_id)
        for stays in report.cannot_move:
            log.info(
                "training node %s cannot leave host %s yet: %s", stays.name, host_id, stays.reason
            )


def _drain_cluster(ctx: Context, cluster_id: int, host_id: int, report: TrainingDrain) -> bool:
    """Move what can move of one cluster's nodes on ``host_id``; True when a move
    operation was recorded."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        # The cluster first, then the placement lock: the order actions take them in.
        cluster = session.get(TrainingCluster, cluster_id, with_for_update=True)
        if cluster is None or cluster.deleted_at is not None:
            return False
        lock_placement(session)
        host = session.get(Host, host_id)
        here = [n for n in nodes_of(session, cluster_id) if n.host_id == host_id]
        workers: list[TrainingNode] = []
        for node in here:
            if node.role == NodeRole.CONTROLLER:
                _stays(
                    report,
                    node,
                    "a controller does not move: the cluster's Slurm state (its job queue) "
                    "is on a volume on this host; delete the cluster, or uncordon the host",
                )
            else:
                workers.append(node)
        if not workers:
            return False
        waiting = _why_workers_wait(cluster, host)
        if waiting is not None:
            for node in workers:
                _stays(report, node, waiting)
            return False
        if TrainingStatus(cluster.status) is TrainingStatus.STOPPED:
            for node in workers:
                _point_elsewhere(ctx, session, cluster, node, host, report, now)
            return False
        moved: dict[str, int] = {}
        for node in workers:
            if _move_worker(ctx, session, cluster, node, host, report, now):
                moved[str(node.id)] = host_id
        if not moved:
            return False
        names = ", ".join(n.name for n in workers if str(n.id) in moved)
        begin_operation(
            session,
            cluster,
            TrainingStatus.RESTARTING,
            {"action": MOVE_NODES, "nodes": [int(i) for i in moved], "from_hosts": moved},
            f"moving {names} off host {_label(host, host_id)}, which drains",
            now,
        )
    return True


def _why_workers_wait(cluster: TrainingCluster, host: Host | None) -> str | None:
    """Why the cluster's workers on ``host`` cannot move now (None: they may)."""
    status = TrainingStatus(cluster.status)
    if status is TrainingStatus.DELETING:
        return "the cluster is being deleted; its nodes go with it"
    if status is TrainingStatus.STOPPING:
        return "the cluster is stopping; its workers move once it has stopped"
    if status is TrainingStatus.ERROR:
        return (
            "the cluster is in error; its workers move once restart_cluster has brought it "
            "back (or it is deleted)"
        )
    if status is not TrainingStatus.RUNNING and status is not TrainingStatus.STOPPED:
        action = (cluster.operation or {}).get("action", status.value)
        return f"the cluster is {status.value} ({action}); its workers move once that is done"
    if status is TrainingStatus.RUNNING and host is not None and not host.healthy:
        return (
            f"host {host.name} does not answer: the worker may still run there, so its GPUs "
            "are not given to another node; it moves once the host answers"
        )
    return None


def _stays(report: TrainingDrain, node: TrainingNode, reason: str) -> None:
    report.cannot_move.append(NodeStays(node.id, node.name, node.cluster_id, node.role, reason))


def _request(cluster: TrainingCluster, node: TrainingNode) -> ResourceRequest:
    """What the node claims, in its cluster's location."""
    return replace(node_request(NodeRole(node.role), plan_of(cluster)), location=cluster.location)


def _may_span(cluster: TrainingCluster, node: TrainingNode, report: TrainingDrain) -> bool:
    """Whether the cluster's nodes may run on several hosts (else the node stays)."""
    if cluster.subnet is not None:
        return True
    _stays(
        report,
        node,
        "the cluster was made before training clusters spanned hosts: its nodes share "
        "one host's network, so its workers cannot move (delete and create it anew)",
    )
    return False


def _move_worker(
    ctx: Context,
    session: Session,
    cluster: TrainingCluster,
    node: TrainingNode,
    host: Host | None,
    report: TrainingDrain,
    now: datetime,
) -> bool:
    """Claim the worker's place on another host of the location (its place here is
    released by the same claim) and point it there; all or nothing (a savepoint)."""
    old = node.host_id
    assert old is not None
    if not _may_span(cluster, node, report):
        return False
    try:
        with session.begin_nested():
            placement = claim(
                session,
                cluster_id=domain.node_owner(node.id),
                request=_request(cluster, node),
                volume_gb=0,
                ratios=ctx.settings.allocation_ratios,
                now=now,
                exclude_hosts=frozenset({old}) | hosts_without_overlay(session, cluster.location),
                policy=ctx.settings.placement_policy,
            )
    except InsufficientCapacity as exc:
        _stays(
            report,
            node,
            f"no other host of location {cluster.location!r} has room for it ({exc.message}); "
            "it moves once one has",
        )
        return False
    node.host_id = placement.host_id
    node.gpu_indices = list(placement.gpu_indices)
    node.status = NodeStatus.REPLACING.value
    to = session.get(Host, placement.host_id)
    record_event(
        session,
        domain.cluster_owner(cluster.id),
        now,
        "moved",
        f"{node.role} {node.name} moves from host {_label(host, old)} to host "
        f"{_label(to, placement.host_id)} (host {_label(host, old)} drains)",
    )
    report.moving.append(NodeMoving(node.id, node.name, cluster.id, placement.host_id))
    return True


def _point_elsewhere(
    ctx: Context,
    session: Session,
    cluster: TrainingCluster,
    node: TrainingNode,
    host: Host | None,
    report: TrainingDrain,
    now: datetime,
) -> None:
    """A stopped cluster's worker holds nothing: point it at the host of the location
    the placement policy picks for it now (its start claims its place there)."""
    old = node.host_id
    assert old is not None
    if not _may_span(cluster, node, report):
        return
    found = candidate_hosts(
        session,
        _request(cluster, node),
        ctx.settings.allocation_ratios,
        ctx.settings.placement_policy,
        exclude=(old, *hosts_without_overlay(session, cluster.location)),
        limit=1,
    )
    if not found:
        _stays(
            report,
            node,
            f"no other host of location {cluster.location!r} has room for it now; "
            "it moves once one has",
        )
        return
    to_id = found[0].host_id
    node.host_id = to_id
    record_event(
        session,
        domain.cluster_owner(cluster.id),
        now,
        "moved",
        f"{node.role} {node.name} of the stopped cluster will start on host "
        f"{_label(session.get(Host, to_id), to_id)} instead of {_label(host, old)} "
        f"(host {_label(host, old)} drains)",
    )
    report.moving.append(NodeMoving(node.id, node.name, cluster.id, to_id))
