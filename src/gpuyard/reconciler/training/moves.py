"""A drain's ``move_nodes`` operation, carried out on the nodes (services/training/drain.py
records it): each moved worker leaves the host it was on and is created again, same
name and address, on the host it now holds its place on."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gpuyard.core.errors import GpuyardError
from gpuyard.core.training.clusters import NodeName, NodeStatus
from gpuyard.reconciler.training import slurm_control

if TYPE_CHECKING:
    from gpuyard.reconciler.training.networks import ClusterNetworks
    from gpuyard.reconciler.training.nodes import Snapshot
    from gpuyard.reconciler.training.steps import OperatorSteps

log = logging.getLogger(__name__)


def move_nodes(op: OperatorSteps, networks: ClusterNetworks, snap: Snapshot, token: str) -> bool:
    """Carry out a drain's ``move_nodes``: each moved worker's old container is
    removed from the host it left, then the worker is created, same name and
    address, on the host it now holds its place on, joins the cluster's network
    there and rejoins Slurm; jobs on the other nodes run on. False (the operation
    stays, retried by the scan) while a host a node left does not answer: two
    slurmds of one name must never run at once."""
    operation = snap.operation or {}
    moving = {int(i) for i in operation.get("nodes", [])}
    left = {int(k): int(v) for k, v in (operation.get("from_hosts") or {}).items()}
    chosen = [n for n in snap.nodes if n.id in moving]
    nodes = op.nodes_of(snap)
    names = NodeName(snap.cluster.id, snap.cluster.name_prefix)
    for node in chosen:
        op.check(snap.cluster.id, token)
        old = left.get(node.id)
        if old is not None and old != node.host_id:
            try:
                op.on_host(old).remove_node(node.name)
            except GpuyardError as exc:
                log.warning("training node %s: not removed from host %s yet: %s",
                            node.name, old, exc.message)  # fmt: skip
                return False
    op.ship_images(nodes, snap, token, {n.image_version_id for n in chosen})
    nodes.ensure_network(names.network)
    before = slurm_control.slurmd_started(nodes, names.controller)
    for node in chosen:
        op.check(snap.cluster.id, token)
        op.wait_gpus_free(node, snap.cluster.id, token)
        container = op.create(snap, node, node.image_version_id)
        op.set_nodes([node.id], NodeStatus.REPLACING, container_id=container)
    workers = [n.name for n in chosen]
    slurm_control.wait_reregistered(nodes, names.controller, workers, before, op.ready_timeout_s)
    op.readdress(nodes, snap)
    for name in workers:
        slurm_control.resume(nodes, names.controller, name, op.ready_timeout_s)
    networks.publish_hosts(nodes, snap)
    nodes.wait_slurm_ready(names.controller, workers, op.ready_timeout_s)
    op.set_nodes([n.id for n in chosen], NodeStatus.RUNNING)
    return True
