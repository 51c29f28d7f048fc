"""What the training operator and its helpers share: the node runtime they drive (a
protocol of runtimes/slurm_nodes.SlurmNodeRuntime), one read of a cluster, and the
signal that a newer operation replaced the one being run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gpuyard.core.ownership import Ownership
from gpuyard.store.schema import TrainingCluster, TrainingNode

if TYPE_CHECKING:
    from gpuyard.runtimes.slurm.nodes import NodeSpec
    from gpuyard.runtimes.slurm.overlay import OverlaySpec

# The work queue lane of operations and recoveries: the reconciler's slow lane (they
# wait on Slurm, drains and lifecycle scripts; stops never queue behind them).
LANE = "slow"


class NodeRuntime(Protocol):
    """What the operator needs of runtimes/slurm_nodes.SlurmNodeRuntime."""

    def bind(self, owner: Ownership) -> None: ...
    def ensure_network(self, name: str, subnet: str | None = None) -> None: ...
    def remove_network(self, name: str) -> None: ...
    def attach_overlay(self, spec: OverlaySpec) -> None: ...
    def detach_overlay(self, network: str) -> None: ...
    def set_hosts(self, name: str, entries: Mapping[str, str]) -> None: ...
    def create_node(self, spec: NodeSpec, files: dict[str, tuple[bytes, int]]) -> str: ...
    def install_authorized_keys(self, name: str, keys_text: str) -> None: ...
    def exec(self, name: str, argv: list[str], timeout_s: float = 30) -> tuple[int, str]: ...
    def restart_node(self, name: str) -> None: ...
    def remove_node(self, name: str) -> None: ...
    def node_state(self, name: str) -> Literal["missing", "created", "running", "exited"]: ...
    def node_address(self, name: str, network: str) -> str | None: ...
    def list_nodes(self, label: str, value: str) -> list[str]: ...
    def wait_slurm_ready(
        self, controller: str, expected_nodes: list[str], timeout_s: float
    ) -> None: ...
    def sinfo(self, controller: str) -> list[tuple[str, str]]: ...
    def lifecycle_result(self, name: str) -> int | None: ...
    def remove_volume(self, name: str) -> None: ...
    def ensure_image(self, image: str, progress: Callable[[str], None] | None = None) -> bool: ...


class HostNodeRuntimes(Protocol):
    """What the operator needs of runtimes/host_nodes.HostNodes: the node runtime on
    the engine of a host (None: a cluster with no host recorded, which runs here)."""

    def bind(self, owner: Ownership) -> None: ...
    def on_host(self, host_id: int | None) -> NodeRuntime: ...


class Superseded(Exception):
    """A newer operation replaced the one being run."""


@dataclass(frozen=True)
class Snapshot:
    """One read of a cluster, what its nodes need, and its operation."""

    cluster: TrainingCluster
    nodes: list[TrainingNode]
    images: dict[int, str]
    keys_text: str
    operation: dict[str, Any] | None
    # Each of its hosts' address as the other hosts reach it (for the overlay).
    addresses: dict[int, str]
