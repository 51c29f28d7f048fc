"""The runtime interface every driver implements.

Contracts shared by all methods:
- idempotent on the cluster id: calling twice has the effect of calling once;
- quick: no method waits for a container to become ready beyond the engine's own
  start call; readiness is observed with :meth:`Runtime.observe`;
- typed inputs and outputs; failures raise :class:`gpuyard.core.errors.RuntimeFailure`
  with a message a user can act on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol, runtime_checkable

from gpuyard.core.log_lines import LogLine
from gpuyard.core.ownership import (
    LABEL_ACCOUNT,
    LABEL_CLUSTER,
    LABEL_INSTALLATION,
    LABEL_MANAGED,
    LABEL_SIZE,
    Ownership,
)

__all__ = [
    "LABEL_ACCOUNT",
    "LABEL_CLUSTER",
    "LABEL_INSTALLATION",
    "LABEL_MANAGED",
    "LABEL_SIZE",
    "LogLine",
]

GIB = 1024**3

# Who reads a container's CPU%: each has its own sampling window (see Runtime.stats).
StatsConsumer = Literal["view", "idle"]


class ContainerState(StrEnum):
    MISSING = "missing"
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"


@dataclass(frozen=True)
class PortBinding:
    """A container port published on the host. ``host_ip`` None: on every address of
    the host (what the engine does by default); ``"127.0.0.1"``: on the host's loopback
    alone, out of reach of other hosts and of every container (a private http port,
    which only the HTTP proxy may reach)."""

    internal_port: int
    external_port: int
    protocol: Literal["tcp", "udp"] = "tcp"
    host_ip: str | None = None


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
    # A container of this cluster made before installation ids (unlabelled by any
    # installation), to be removed before this one is created; None: there is none.
    replaces: str | None = None
    # The account the cluster belongs to: its container joins that account's private
    # network (Ownership.account_network), created on demand, with no route to other
    # accounts' networks. None: the engine's default network, shared with everything
    # else on it — only for callers with no account (benchmarks); clusters have one.
    account_id: int | None = None
    # The size of the mounted volume in GiB, enforced where the engine can (0: not
    # sized); a larger size than the volume has grows it.
    volume_gb: int = 0
    # The container disk (the writable layer) in GiB, enforced where the engine can
    # (0: the engine's default, unlimited).
    container_disk_gb: int = 0


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
class ManagedVolume:
    """A volume of this installation: its name, the cluster it was made for (label),
    and its size when the engine reports one."""

    name: str
    cluster_id: str | None
    size_bytes: int | None
    # When the engine made it (its own ISO 8601 text); None where it does not say.
    created_at: str | None = None


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
    # Why the engine refused CPU/memory limits, once it has.
    limits_problem: str | None = None
    # Why volume or container disk sizes are not enforced on this engine (None: they
    # are, as far as known): learnt from the engine's refusal or the host's probe.
    disk_problem: str | None = None


class LogFollow(Protocol):
    """A container's output as it is written (:meth:`Runtime.follow_log`). Iterating
    yields lines until the container stops or :meth:`close` is called; iterate from
    one thread, close from any."""

    def __iter__(self) -> Iterator[LogLine]: ...

    def close(self) -> None:
        """End the iteration and release the connection. Idempotent."""
        ...


@runtime_checkable
class ImageListing(Protocol):
    """A driver that can say which images its engine holds locally (by name); a
    driver without the capability simply does not offer it."""

    def local_images(self) -> list[str]:
        """The names (``repo:tag``) of the images present on the engine, sorted; an
        untagged image has no name and is left out."""
        ...


class Runtime(Protocol):
    """A container engine driver. See the module docstring for shared contracts."""

    name: str

    def bind(self, owner: Ownership) -> None:
        """Act for installation ``owner``: name and label everything with its id, and
        list, observe and remove only objects carrying it. Called once, at start."""
        ...

    def capabilities(self) -> Capabilities: ...

    def available(self) -> str | None:
        """None when the engine answers, else a message saying what to install or start."""
        ...

    def heartbeat(self, timeout_s: float) -> str | None:
        """Like :meth:`available`, answered within about ``timeout_s`` whatever the
        engine's timeout for other operations: a hung engine is a miss, not a wait."""
        ...

    def ensure_image(self, image: str, on_pull: Callable[[], None] | None = None) -> None:
        """Make ``image`` present locally, pulling it if needed; ``on_pull`` is called
        just before a pull begins (never when the image is already there)."""
        ...

    def ensure_volume(
        self, name: str, cluster_id: str | None = None, size_gb: int | None = None
    ) -> None:
        """Make our volume ``name`` if missing. ``size_gb``: its size, enforced where
        the engine can (a write past it fails with ENOSPC); an existing sized volume
        smaller than that is grown, never shrunk. Where sizes cannot be enforced this
        raises RuntimeFailure, unless the operator allowed unenforced disk sizes.
        Idempotent."""
        ...

    def create(self, spec: ContainerSpec) -> str:
        """Create (not start) the cluster's container, replacing any previous one of the
        same cluster. Returns the container id."""
        ...

    def start(self, cluster_id: str) -> None: ...

    def host_ports_in_use(self, low: int, high: int, cluster_id: str) -> frozenset[tuple[int, str]]:
        """The ``(port, transport)`` pairs in ``low..high`` that something on the host
        holds now: other containers (any installation's) and any process
        (runtimes/host_ports.py); the cluster's own container is not counted.
        Best effort: never raises; an answer that cannot be had is empty."""
        ...

    def stop(self, cluster_id: str, timeout_s: int = 10) -> None:
        """Stop and remove the cluster's container (the container disk is wiped)."""
        ...

    def halt(self, cluster_id: str, timeout_s: int = 10) -> None:
        """Stop the cluster's container but keep it, so its logs can still be read."""
        ...

    def remove_volume(self, name: str, *, legacy: bool = False) -> None:
        """Delete our volume ``name``. ``legacy``: it predates installation ids (its
        name comes from the store) and is removed if no installation claims it."""
        ...

    def observe(self, cluster_id: str) -> Observed: ...

    def list_managed(self) -> list[ManagedContainer]:
        """Every cluster container of this installation, found by its labels."""
        ...

    def list_volumes(self) -> list[ManagedVolume]:
        """Every volume of this installation, found by its labels."""
        ...

    def volume_usage(self) -> dict[str, int]:
        """Bytes used by each volume of this installation the engine can measure, by
        name (the engine's disk-usage report); a volume it does not measure is left
        out. Raises RuntimeFailure when the engine does not answer."""
        ...

    def guard_networks(self) -> None:
        """Re-apply the isolation of this installation's networks (host rules a
        firewall reload may have removed); a no-op where nothing is managed."""
        ...

    def stats(self, cluster_id: str, consumer: StatsConsumer = "view") -> ContainerStats | None:
        """CPU% since ``consumer``'s previous call (each consumer its own window) and
        memory%; None unless running."""
        ...

    def logs(self, cluster_id: str, tail: int = 200) -> str: ...

    def log_lines(
        self,
        cluster_id: str,
        *,
        tail: int | None = None,
        since_ns: int | None = None,
        head: int | None = None,
    ) -> list[LogLine]:
        """The container's output (stdout and stderr as written), oldest first, with the
        engine's timestamps: the last ``tail`` lines (None: all) stamped at or after
        ``since_ns`` (None: any), or with ``head`` the first ``head`` of those (the rest
        is not read). The result never starts inside a timestamp: lines sharing the
        first line's stamp are all included, so it may hold more than ``tail``. Empty
        when there is no container. Raises RuntimeFailure."""
        ...

    def follow_log(self, cluster_id: str, *, since_ns: int | None = None) -> LogFollow:
        """The container's output from ``since_ns``'s second on (None: from the start),
        then each line as it is written, until the container stops. Nothing when there
        is no container. Raises RuntimeFailure when the engine does not answer."""
        ...
