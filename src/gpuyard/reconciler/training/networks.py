"""The network side of a training cluster's nodes, apart from creating them: every node's
/etc/hosts block naming all the cluster's nodes, and the overlay between the hosts of a
cluster that spans several, re-applied now and then (runtimes/slurm/overlay.py)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from gpuyard.core.errors import GpuyardError
from gpuyard.core.training.clusters import NodeName
from gpuyard.reconciler.training.nodes import LANE

if TYPE_CHECKING:
    from gpuyard.reconciler.training.nodes import NodeRuntime, Snapshot
    from gpuyard.reconciler.training.steps import OperatorSteps

log = logging.getLogger(__name__)


def hosts_file(snap: Snapshot) -> dict[str, str]:
    """Every node's name and fixed address (empty for a cluster without its own
    subnet, whose nodes find each other through the engine's DNS)."""
    return {n.name: n.address for n in snap.nodes if n.address}


class ClusterNetworks:
    """Of the training operator ``op``."""

    def __init__(self, op: OperatorSteps, heal_every_s: float = 60.0) -> None:
        self.op = op
        self.heal_every_s = heal_every_s
        # When each cluster's overlay was last re-applied (time.monotonic()).
        self._checked: dict[int, float] = {}

    def publish_hosts(self, nodes: NodeRuntime, snap: Snapshot) -> None:
        """Give every node the /etc/hosts entries of all the cluster's nodes: a node
        created earlier learns the names of those added since (a scale), wherever they
        run. A no-op for a cluster without its own subnet."""
        entries = hosts_file(snap)
        if not entries:
            return
        for node in snap.nodes:
            if nodes.node_state(node.name) == "running":
                nodes.set_hosts(node.name, entries)

    def heal_soon(self, cluster_id: int, host_id: int | None) -> None:
        """Every ``heal_every_s``, queue re-applying the cluster's overlay on each of its
        hosts (runtimes/slurm/overlay.py): a host's bridge is made anew when its last node
        container was replaced, and a host rebooted loses the interface and rules."""
        now = time.monotonic()
        if now - self._checked.get(cluster_id, float("-inf")) < self.heal_every_s:
            return
        self._checked[cluster_id] = now
        lane = self.op.lane_of(host_id) if self.op.lane_of is not None else LANE
        self.op.queue.submit(("training-overlay", cluster_id), lane, lambda: self.heal(cluster_id))

    def heal(self, cluster_id: int) -> None:
        """Re-apply the overlay of a running cluster that spans hosts (idempotent)."""
        snap = self.op.snapshot(cluster_id)
        if snap is None or snap.operation is not None:
            return
        nodes = self.op.nodes_of(snap)
        try:
            nodes.join(NodeName(cluster_id, snap.cluster.name_prefix).network)
        except GpuyardError as exc:  # a host down: the next pass tries again
            log.warning("training cluster %s: overlay not re-applied: %s", cluster_id, exc)
