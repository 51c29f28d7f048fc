"""One training cluster's nodes over every host they run on.

A cluster's nodes may run on several hosts (each on the host whose GPUs, vCPUs and
memory it claimed: ``TrainingNode.host_id``). :class:`ClusterNodes` is the node runtime
the training operator drives a cluster through: every call about a node goes to the
engine of the node's host (runtimes/slurm/host_nodes.py), Slurm questions and the state volume
to the controller's, and the network is made on every host the cluster uses, each copy
joined to the others by the overlay (runtimes/slurm/overlay.py) once the cluster spans more
than one host.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from gpuyard.core.training import network as training_network
from gpuyard.runtimes.slurm.overlay import OverlaySpec

if TYPE_CHECKING:
    from gpuyard.reconciler.training.nodes import NodeRuntime

log = logging.getLogger(__name__)


class ClusterNodes:
    """The node runtime of one cluster: ``placement`` maps each node's name to its host
    (None: a cluster with no host recorded, which runs here); ``on_host`` gives a host's
    node runtime; ``subnet``: the cluster's own subnet (None: one made before clusters
    spanned hosts); ``addresses``: each host's address as the other hosts reach it."""

    def __init__(
        self,
        on_host: Callable[[int | None], NodeRuntime],
        placement: Mapping[str, int | None],
        controller: str,
        subnet: str | None = None,
        addresses: Mapping[int, str] | None = None,
    ) -> None:
        self._on_host = on_host
        self.placement = dict(placement)
        self.controller = controller
        self.subnet = subnet
        self.addresses = dict(addresses or {})

    # -- where things are ---------------------------------------------------------------

    def hosts(self) -> list[int | None]:
        """The hosts the cluster's nodes are on (the controller's first)."""
        first = self.placement.get(self.controller)
        rest = sorted({h for h in self.placement.values() if h is not None and h != first})
        return [first, *rest] if self.placement else []

    def spans_hosts(self) -> bool:
        return len(set(self.placement.values())) > 1

    def runtime(self, name: str) -> NodeRuntime:
        """The node runtime of the host ``name`` is placed on (the controller's for a
        name the cluster does not list)."""
        return self._on_host(self.placement.get(name, self.placement.get(self.controller)))

    def _everywhere(self) -> list[NodeRuntime]:
        return [self._on_host(h) for h in self.hosts()]

    # -- the network ---------------------------------------------------------------------

    def ensure_network(self, name: str, subnet: str | None = None) -> None:
        """The cluster's network on every host it uses, joined across them."""
        for runtime in self._everywhere():
            runtime.ensure_network(name, subnet or self.subnet)
        self.join(name)

    def join(self, network: str, host_id: int | None = -1) -> None:
        """Join each host's copy of the network to the others' (``host_id``: only that
        host's part; -1: every host's). A no-op for a cluster on one host."""
        if self.subnet is None or not self.spans_hosts():
            return
        hosts = [h for h in self.hosts() if h is not None]
        for host in hosts if host_id == -1 else [host_id]:
            if host is None:
                continue
            local = self.addresses.get(host)
            peers = tuple(self.addresses[h] for h in hosts if h != host and h in self.addresses)
            if local is None:
                continue
            self._on_host(host).attach_overlay(
                OverlaySpec(network, local, peers, training_network.gateway(self.subnet))
            )

    def attach_overlay(self, spec: OverlaySpec) -> None:
        """Every host's part of the overlay of ``spec.network`` (the cluster knows its
        hosts and their addresses; ``spec`` names only the network)."""
        self.join(spec.network)

    def detach_overlay(self, network: str) -> None:
        for runtime in self._everywhere():
            runtime.detach_overlay(network)

    def remove_network(self, name: str) -> None:
        for runtime in self._everywhere():
            runtime.detach_overlay(name)
            runtime.remove_network(name)

    # -- nodes ---------------------------------------------------------------------------

    def bind(self, owner: Any) -> None:
        """The hosts' runtimes are bound by the operator."""

    def ensure_image(self, image: str, progress: Callable[[str], None] | None = None) -> bool:
        copied = False
        for runtime in self._everywhere():
            copied |= runtime.ensure_image(image, progress)
        return copied

    def create_node(self, spec: Any, files: dict[str, tuple[bytes, int]]) -> str:
        """Create the node on its host, then join that host to the cluster's other
        hosts (its bridge exists from the node's start on)."""
        container = self.runtime(spec.name).create_node(spec, files)
        self.join(spec.network, self.placement.get(spec.name))
        return container

    def install_authorized_keys(self, name: str, keys_text: str) -> None:
        self.runtime(name).install_authorized_keys(name, keys_text)

    def exec(self, name: str, argv: list[str], timeout_s: float = 30) -> tuple[int, str]:
        return self.runtime(name).exec(name, argv, timeout_s)

    def set_hosts(self, name: str, entries: Mapping[str, str]) -> None:
        self.runtime(name).set_hosts(name, entries)

    def restart_node(self, name: str) -> None:
        self.runtime(name).restart_node(name)

    def remove_node(self, name: str) -> None:
        """Remove the node wherever it may be: on its host, or (a name the cluster does
        not list, e.g. one a crash left) on every host of the cluster."""
        targets = [self.runtime(name)] if name in self.placement else self._everywhere()
        for runtime in targets:
            runtime.remove_node(name)

    def node_state(self, name: str) -> Literal["missing", "created", "running", "exited"]:
        return self.runtime(name).node_state(name)

    def node_address(self, name: str, network: str) -> str | None:
        return self.runtime(name).node_address(name, network)

    def list_nodes(self, label: str, value: str) -> list[str]:
        found: set[str] = set()
        for runtime in self._everywhere():
            found.update(runtime.list_nodes(label, value))
        return sorted(found)

    def wait_slurm_ready(self, controller: str, workers: list[str], timeout_s: float) -> None:
        self.runtime(controller).wait_slurm_ready(controller, workers, timeout_s)

    def sinfo(self, controller: str) -> list[tuple[str, str]]:
        return self.runtime(controller).sinfo(controller)

    def lifecycle_result(self, name: str) -> int | None:
        return self.runtime(name).lifecycle_result(name)

    def remove_volume(self, name: str) -> None:
        """The Slurm state volume lives on the controller's host."""
        self.runtime(self.controller).remove_volume(name)
