"""The operator's steps its helpers (node recovery, keys, networks, moves) run: a
narrow interface the operator implements, so the helpers need not import it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from gpuyard.core.training.clusters import NodeStatus
from gpuyard.reconciler.training.cluster_nodes import ClusterNodes
from gpuyard.reconciler.training.nodes import NodeRuntime, Snapshot
from gpuyard.reconciler.workqueue import WorkQueue
from gpuyard.services.context import Context
from gpuyard.store.schema import TrainingCluster, TrainingNode


class OperatorSteps(Protocol):
    """What the training operator (operator.py TrainingOperator) offers its helpers."""

    ctx: Context
    # How long a node may take to (re)join Slurm.
    ready_timeout_s: float
    # The queue its jobs run on, and the lane of a host's jobs (None: nodes.LANE).
    queue: WorkQueue
    lane_of: Callable[[int | None], str] | None

    def on_host(self, host_id: int | None) -> NodeRuntime:
        """The node runtime of the engine of ``host_id``."""
        ...

    def nodes_of(self, snap: Snapshot) -> ClusterNodes:
        """The cluster's nodes over every host they run on."""
        ...

    def cluster_nodes(
        self,
        cluster: TrainingCluster,
        nodes: Sequence[TrainingNode],
        addresses: Mapping[int, str] | None = None,
    ) -> ClusterNodes:
        """The nodes ``nodes`` of ``cluster`` over every host they run on."""
        ...

    def snapshot(self, cluster_id: int) -> Snapshot | None:
        """One read of the cluster (None: gone)."""
        ...

    def check(self, cluster_id: int, token: str | None) -> None:
        """Raise Superseded unless operation ``token`` is still the recorded one."""
        ...

    def create(self, snap: Snapshot, node: TrainingNode, image_version_id: int) -> str:
        """Create ``node``'s container (its id)."""
        ...

    def set_nodes(self, ids: Sequence[int], status: NodeStatus, **values: Any) -> None:
        """Record the nodes' status (and ``values``)."""
        ...

    def readdress(self, nodes: NodeRuntime, snap: Snapshot) -> None:
        """Tell the controller where each worker is now."""
        ...

    def await_lifecycle(self, nodes: NodeRuntime, cluster_id: int, token: str | None) -> list[str]:
        """Wait for new nodes' lifecycle scripts; the nodes where one failed."""
        ...

    def ship_images(
        self, nodes: NodeRuntime, snap: Snapshot, token: str, image_version_ids: set[int]
    ) -> None:
        """Copy the node images to the hosts that lack them."""
        ...

    def wait_gpus_free(self, node: TrainingNode, cluster_id: int, token: str) -> None:
        """Wait until no cluster still stops on the node's GPUs."""
        ...

    def sync_edge(self, cluster_id: int) -> None:
        """Bring the cluster's network edge in line with the store."""
        ...
