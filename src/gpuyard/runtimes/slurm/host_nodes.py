"""The Slurm node runtime of each host of a fleet: training-cluster nodes run on the
engine of the host whose GPUs, vCPUs and memory they claimed.

A host's node runtime is made from that host's runtime (runtimes/fleet.py): the local
host's (and every host's in the single-engine mode) is the node runtime the server
was built with, exactly as before fleets; any other host's is made by ``make`` from
the host's runtime on first use, and made again when the fleet replaced that runtime
(the host's engine URL changed). Generic over the node runtime so this module needs
nothing of the training operator (tests make in-memory ones).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.fleet import Fleet


class _Bindable(Protocol):
    def bind(self, owner: Ownership) -> None: ...


N = TypeVar("N", bound=_Bindable)


class HostNodes(Generic[N]):
    """Host id -> the node runtime on that host's engine. Thread-safe."""

    def __init__(self, fleet: Fleet, local: N, make: Callable[[Runtime], N]) -> None:
        self.fleet = fleet
        self.local = local
        self._make = make
        self._owner: Ownership | None = None
        self._lock = threading.Lock()
        # Host id -> (the fleet's runtime it was made from, the node runtime).
        self._made: dict[int, tuple[Runtime, N]] = {}

    def bind(self, owner: Ownership) -> None:
        """Act for installation ``owner``: the local node runtime now, others when made."""
        self._owner = owner
        self.local.bind(owner)
        with self._lock:
            made = [nodes for _, nodes in self._made.values()]
        for nodes in made:
            nodes.bind(owner)

    def on_host(self, host_id: int | None) -> N:
        """The node runtime of ``host_id`` (None: a cluster with no host recorded, which
        runs here). Raises RuntimeFailure for a host the fleet does not know."""
        runtime = self.fleet.for_host(host_id)
        if runtime is self.fleet.local or host_id is None:
            return self.local
        with self._lock:
            found = self._made.get(host_id)
            if found is not None and found[0] is runtime:
                return found[1]
            nodes = self._make(runtime)
            if self._owner is not None:
                nodes.bind(self._owner)
            self._made[host_id] = (runtime, nodes)
            return nodes
