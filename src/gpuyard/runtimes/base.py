"""The runtime interface every driver implements.

Contracts shared by all methods:
- idempotent on the cluster id: calling twice has the effect of calling once;
- quick: no method waits for a container to become ready beyond the engine's own
  start call; readiness is observed with :meth:`Runtime.observe`;
- typed inputs and outputs; failures raise :class:`gpuyard.core.errors.RuntimeFailure`
  with a message a user can act on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol

LABEL_CLUSTER = "gpuyard.cluster_id"
LABEL_MANAGED = "gpuyard.managed"


class ContainerState(StrEnum):
    MISSING = "missing"
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"


@dataclass(frozen=True)
class PortBinding:
    internal_port: int
    external_port: int
    protocol: Literal["tcp", "udp"] = "tcp"


@dataclass(frozen=True)
class ContainerSpec:
    """What to run for one cluster. ``volume_name`` None means no persistent volume."""

    cluster_id: str
    image: str
    command: tuple[str, ...] | None
    env: dict[str, str]
    ports: tuple[PortBinding, ...]
    volume_name: str | None
    volume_mount_path: str
    cpu_cores: float
    memory_gb: float
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Observed:
    state: ContainerState
    container_id: str | None = None
    exit_code: int | None = None
    error: str | None = None
    started_at: str | None = None


@dataclass(frozen=True)
class ManagedContainer:
    cluster_id: str
    container_id: str
    state: ContainerState


@dataclass(frozen=True)
class ContainerStats:
    cpu_percent: float
    memory_percent: float
    memory_bytes: int


@dataclass(frozen=True)
class Capabilities:
    real_gpus: bool
    cpu_limits: bool
    memory_limits: bool
    stats: bool


class Runtime(Protocol):
    """A container engine driver. See the module docstring for shared contracts."""

    name: str

    def capabilities(self) -> Capabilities: ...

    def available(self) -> str | None:
        """None when the engine answers, else a message saying what to install or start."""
        ...

    def ensure_image(self, image: str) -> None:
        """Make ``image`` present locally, pulling it if needed."""
        ...

    def ensure_volume(self, name: str) -> None: ...

    def create(self, spec: ContainerSpec) -> str:
        """Create (not start) the cluster's container, replacing any previous one of the
        same cluster. Returns the container id."""
        ...

    def start(self, cluster_id: str) -> None: ...

    def stop(self, cluster_id: str, timeout_s: int = 10) -> None:
        """Stop and remove the cluster's container (the container disk is wiped)."""
        ...

    def remove_volume(self, name: str) -> None: ...

    def observe(self, cluster_id: str) -> Observed: ...

    def list_managed(self) -> list[ManagedContainer]:
        """Every container this control plane created, found by label."""
        ...

    def stats(self, cluster_id: str) -> ContainerStats | None: ...

    def logs(self, cluster_id: str, tail: int = 200) -> str: ...


def container_name(cluster_id: str) -> str:
    return f"gpuyard-{cluster_id}"


def volume_name(cluster_id: str) -> str:
    return f"gpuyard-vol-{cluster_id}"
