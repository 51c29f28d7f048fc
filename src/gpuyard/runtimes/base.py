"""The runtime interface every driver implements: the sum of the capabilities of
runtimes/capabilities.py, plus the few facts a caller asks of the engine behind it.

Contracts shared by all methods:
- idempotent on the cluster id: calling twice has the effect of calling once;
- quick: no method waits for a container to become ready beyond the engine's own
  start call; readiness is observed with :meth:`Runtime.observe`;
- typed inputs and outputs; failures raise :class:`gpuyard.core.errors.RuntimeFailure`
  with a message a user can act on.

The records runtimes take and answer live in runtimes/records.py and are named here
too, so a caller imports everything it needs of a runtime from this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gpuyard.core.log_lines import LogLine
from gpuyard.core.ownership import (
    LABEL_ACCOUNT,
    LABEL_CLUSTER,
    LABEL_INSTALLATION,
    LABEL_MANAGED,
    LABEL_SIZE,
)
from gpuyard.runtimes.capabilities import (
    ContainerLifecycle,
    ContainerLogs,
    ExecAccess,
    ImageListing,
    LogFollow,
    VolumeIO,
)
from gpuyard.runtimes.records import (
    GIB,
    Capabilities,
    Chunk,
    ContainerSpec,
    ContainerState,
    ContainerStats,
    EngineInventory,
    ExecEndpoint,
    ManagedContainer,
    ManagedVolume,
    Observed,
    PortBinding,
    StatsConsumer,
)

if TYPE_CHECKING:
    from gpuyard.runtimes.engines.engine import Engine

__all__ = [
    "GIB",
    "LABEL_ACCOUNT",
    "LABEL_CLUSTER",
    "LABEL_INSTALLATION",
    "LABEL_MANAGED",
    "LABEL_SIZE",
    "Capabilities",
    "Chunk",
    "ContainerLifecycle",
    "ContainerLogs",
    "ContainerSpec",
    "ContainerState",
    "ContainerStats",
    "ExecAccess",
    "ExecEndpoint",
    "ImageListing",
    "LogFollow",
    "LogLine",
    "ManagedContainer",
    "ManagedVolume",
    "Observed",
    "PortBinding",
    "Runtime",
    "StatsConsumer",
    "VolumeIO",
]


class Runtime(ContainerLifecycle, ContainerLogs, ExecAccess, Protocol):
    """A container engine driver. See the module docstring for shared contracts."""

    name: str

    def volume_io(self) -> VolumeIO:
        """Our volumes on this runtime's engine as tar streams (reads never fail here:
        a runtime that cannot reach its engine says so when the stream is asked)."""
        ...

    def docker_engine(self) -> Engine | None:
        """The Docker-API engine behind this runtime, for drivers built on the same
        engine (Slurm nodes run beside the clusters' containers); None for a runtime
        with none (the in-memory one)."""
        ...

    def inventory(self) -> EngineInventory | None:
        """What the engine's host has (CPUs, memory, disk, GPUs, engine version:
        runtimes/engines/inventory.py); None where the runtime cannot say. Raises
        RuntimeFailure when the engine does not answer."""
        ...
