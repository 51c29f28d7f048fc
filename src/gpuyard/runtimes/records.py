"""The records runtimes take and answer: what to run (:class:`ContainerSpec`), what
was seen (:class:`Observed`, :class:`ManagedContainer`, :class:`ManagedVolume`,
:class:`ContainerStats`), what the engine supports (:class:`Capabilities`), and the
pieces the capability protocols pass around (a tar stream's :data:`Chunk`, a shell's
:class:`ExecEndpoint`). Plain values with no behaviour, shared by every driver and by
the callers of runtimes/capabilities.py.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from gpuyard.core.models import HostGpu

GIB = 1024**3


@dataclass(frozen=True)
class RegistryCredentials:
    """A private registry's username and password for one pull (the Docker Engine
    API's ``auth_config``). Opened from the sealed value just before the pull; its repr
    hides the password, so a log line or traceback never shows it."""

    username: str
    password: str = field(repr=False)

    def auth_config(self) -> dict[str, str]:
        return {"username": self.username, "password": self.password}


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
    # The ENTRYPOINT in place of the image's (None: the image's own; (): none at all,
    # so ``command`` is run as it is).
    entrypoint: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Observed:
    state: ContainerState
    container_id: str | None = None
    exit_code: int | None = None
    error: str | None = None
    started_at: str | None = None
    # The container's address on its network (where other containers there reach
    # it); None when the engine does not say.
    address: str | None = None


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


# A piece of a volume's tar stream (readers hand on their own buffers, no copy).
Chunk = bytes | bytearray


@dataclass(frozen=True)
class ExecEndpoint:
    """Where processes in a runtime's containers are started through the engine's exec
    API (a login shell with a PTY): the engine's URL (``unix://``, ``http(s)://``) and
    the TLS context its client material asks for (None: plain)."""

    url: str
    ssl: ssl.SSLContext | None


@dataclass(frozen=True)
class EngineInventory:
    """What a host has, as its engine (and the host itself) answered
    (runtimes/engines/inventory.py asks)."""

    engine_name: str  # "podman" or "docker"
    engine_version: str
    vcpus: int | None
    memory_gb: int | None
    # Size of the filesystem holding the engine's storage; None: not asked (no runner).
    disk_gb: int | None
    # None: not known (no runner to ask); empty: asked, none found.
    gpus: tuple[HostGpu, ...] | None
    # The CUDA driver version nvidia-smi reports ("12.4"); None: not known.
    cuda_version: str | None = None
