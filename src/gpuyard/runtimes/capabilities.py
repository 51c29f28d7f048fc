"""The capabilities a runtime offers, each a small protocol with its own contract, so
that a caller asks for what it needs and never for a driver's class:

- :class:`ContainerLifecycle`: images, volumes and the cluster's container (create,
  start, stop, observe, list), the engine's own life (bind, ping, heartbeat);
- :class:`ContainerLogs`: a container's output, read or followed;
- :class:`VolumeIO`: a volume as a tar stream (read out, written in) and copied to
  another runtime's engine;
- :class:`ExecAccess`: where processes in a container are started through the engine's
  exec API (the console's terminal opens its PTY there);
- :class:`ImageListing`: the images an engine holds (not every driver offers it).

:class:`gpuyard.runtimes.base.Runtime` is the sum a driver implements; the real driver
(runtimes/engines/runtime.py) and the in-memory one (gpuyard.testing) answer each of
them alike, which tests/contract checks on both.

Contracts shared by all methods: idempotent on the cluster id; quick (nothing waits
for readiness beyond the engine's own call); failures raise
:class:`gpuyard.core.errors.RuntimeFailure` with a message a user can act on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gpuyard.core.log_lines import LogLine
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.records import (
    Capabilities,
    Chunk,
    ContainerSpec,
    ContainerStats,
    ExecEndpoint,
    ManagedContainer,
    ManagedVolume,
    Observed,
    RegistryCredentials,
    StatsConsumer,
)

if TYPE_CHECKING:
    from gpuyard.runtimes.engines.engine import Engine

# Called with the running byte count of a copy or a write.
Progress = Callable[[int], None]


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


class ContainerLifecycle(Protocol):
    """The engine's life and the cluster containers' and volumes' on it."""

    def bind(self, owner: Ownership) -> None:
        """Act for installation ``owner``: name and label everything with its id, and
        list, observe and remove only objects carrying it. Called once, at start."""
        ...

    def capabilities(self) -> Capabilities: ...

    def close(self) -> None:
        """Release what the runtime holds (an SSH tunnel); its engine's objects are
        left as they are. Idempotent; a no-op where nothing is held."""
        ...

    def available(self) -> str | None:
        """None when the engine answers, else a message saying what to install or start."""
        ...

    def heartbeat(self, timeout_s: float) -> str | None:
        """Like :meth:`available`, answered within about ``timeout_s`` whatever the
        engine's timeout for other operations: a hung engine is a miss, not a wait."""
        ...

    def ensure_image(
        self,
        image: str,
        on_pull: Callable[[], None] | None = None,
        credentials: RegistryCredentials | None = None,
        fresh: bool = False,
    ) -> None:
        """Make ``image`` present locally, pulling it if needed (with ``credentials``
        when given: a private registry's); ``on_pull`` is called just before a pull
        begins (never when the image is already there). With ``fresh`` it is pulled
        even when present, so the registry decides again whether these credentials
        (or none) may have it: a private image one account pulled is not another's
        because it is on the host."""
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
        (runtimes/hosts/ports.py); the cluster's own container is not counted.
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


class ContainerLogs(Protocol):
    """A cluster container's output (stdout and stderr as written)."""

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


class ExecAccess(Protocol):
    """Processes started in a runtime's containers through the engine's exec API."""

    def exec_endpoint(self) -> ExecEndpoint:
        """The engine's exec endpoint (URL and TLS context). Blocking: an SSH host's
        tunnel is started if it is down. Raises RuntimeFailure when the runtime has no
        engine to exec in."""
        ...


class VolumeIO(Protocol):
    """Our volumes on one runtime's engine as tar streams: what snapshots save and
    restore, and what moves a volume to another host. The user's container is never
    entered (a real engine reads and writes through short-lived helpers of ours)."""

    # The runtime's name, for messages ("docker-engine", "fake").
    name: str

    def read(self, volume: str) -> AbstractContextManager[Iterator[Chunk]]:
        """The tar stream of our volume ``volume`` (entries named ``./...``, the root
        as ``.``), open while the context is. The iterator raises RuntimeFailure after
        its last chunk when the stream was cut short or tar failed, so a consumer never
        takes a partial stream for a whole one. Raises RuntimeFailure when the volume
        is missing or the engine does not answer."""
        ...

    def write(
        self,
        volume: str,
        cluster_id: str | None,
        chunks: Iterable[Chunk],
        *,
        like: str | None = None,
        on_progress: Progress | None = None,
        size_gb: int = 0,
    ) -> int:
        """Make ``volume`` anew (an existing one of ours is removed first) and unpack
        the tar stream ``chunks`` into it, byte for byte: contents, owners, modes,
        mtimes, symlinks, hard links, empty directories and the root's own metadata.
        Its labels are those of our volume ``like`` (the volume it replaces), or ours
        for ``cluster_id``. Returns the stream's length. An exception raised by
        ``chunks`` is raised again as it was; an engine failure raises RuntimeFailure;
        the volume may then be partial (callers write into a volume nobody uses yet).
        ``size_gb``: the size it is held to (at least; a larger one ``like`` has is
        kept)."""
        ...

    def remove_readers(self, volume: str) -> None:
        """Remove what an interrupted :meth:`read` of ``volume`` left behind (a real
        engine's helper containers, including those of earlier versions); a no-op
        where nothing is left. Raises RuntimeFailure when the engine does not answer."""
        ...

    def copy_to(
        self,
        volume: str,
        target: VolumeIO,
        target_volume: str,
        cluster_id: str,
        on_progress: Progress | None = None,
    ) -> int:
        """Copy our ``volume`` here to ``target_volume`` on ``target`` (made there,
        labelled for ``cluster_id``; emptied first, so a retried copy converges).
        Returns the bytes copied. Raises RuntimeFailure, also when ``target`` is an
        engine of another kind. Dispatches to the target's ``accept_*`` method of this
        side's kind."""
        ...

    def accept_engine_copy(
        self,
        source_name: str,
        source: Engine,
        source_volume: str,
        volume: str,
        cluster_id: str,
        on_progress: Progress | None = None,
    ) -> int:
        """The target side of :meth:`copy_to` from a Docker-API engine (of the runtime
        named ``source_name``): ``source``'s ``source_volume`` copied here as ``volume``
        (runtimes/volumes/copy.py). Raises RuntimeFailure where this engine cannot
        receive it."""
        ...

    def accept_file_copy(
        self,
        source_name: str,
        files: Mapping[str, str],
        volume: str,
        cluster_id: str,
        on_progress: Progress | None = None,
    ) -> int:
        """The target side of :meth:`copy_to` from an in-memory engine named
        ``source_name``: its volume's ``files`` (path to text) become ``volume`` here.
        Raises RuntimeFailure where this engine cannot receive it."""
        ...
