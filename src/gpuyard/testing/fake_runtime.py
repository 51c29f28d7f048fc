"""An in-memory runtime for unit tests and scale benchmarks.

It follows the :class:`~gpuyard.runtimes.base.Runtime` contracts exactly (idempotent on
the cluster id, RuntimeFailure on misuse; each capability of runtimes/capabilities.py,
which tests/contract checks beside the real runtime) with every state change immediate,
so tests need no waiting. Volumes carry a dict of "files" so a test can check that data survives
stop/start and disappears on terminate; the container disk (``FakeContainer.disk``) is
dropped with the container, as a real engine does on stop.

Networks follow the isolation contract of the real runtime: a cluster with an account
joins that account's network (created on its first create), and :meth:`FakeRuntime.can_reach`
answers whether one cluster's container could open a connection to another's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.base import (
    Capabilities,
    ContainerSpec,
    ContainerState,
    ContainerStats,
    ExecEndpoint,
    LogFollow,
    LogLine,
    ManagedContainer,
    ManagedVolume,
    Observed,
    StatsConsumer,
    VolumeIO,
)
from gpuyard.runtimes.engines.pull_errors import CREDENTIALS_NEEDED
from gpuyard.runtimes.records import RegistryCredentials
from gpuyard.testing.fake_logs import FakeLogFollow, LogStamps, select
from gpuyard.testing.fake_volumes import FakeVolumeIO


@dataclass
class FakeContainer:
    id: str
    spec: ContainerSpec
    state: ContainerState = ContainerState.CREATED
    exit_code: int | None = None
    error: str | None = None
    started_at: str | None = None
    disk: dict[str, str] = field(default_factory=dict)
    log_lines: list[str] = field(default_factory=list)
    # Each line's stamp, given when it is first read (testing/fake_logs.py).
    log_stamps: list[int] = field(default_factory=list)
    # The installation id it is labelled with (None: unlabelled, somebody else's).
    owner: str | None = None
    # Its address on its network (what an engine's inspect answers).
    address: str | None = None


@dataclass
class FakeNetwork:
    name: str
    owner: str
    account_id: int


@dataclass
class FakeVolume:
    name: str
    files: dict[str, str] = field(default_factory=dict)
    owner: str | None = None
    cluster_id: str | None = None
    # The size it was made with or grown to (0: unsized), as a real engine enforces it.
    size_gb: int = 0


def _grow(volume: FakeVolume, size_gb: int) -> None:
    """As a real engine does: a sized volume grows (never shrinks); one made unsized
    stays so (runtimes/engines/engine.py Engine.ensure_volume)."""
    if volume.size_gb > 0:
        volume.size_gb = max(volume.size_gb, size_gb)


class FakeRuntime:
    """Thread-safe in-memory runtime.

    Knobs for tests: ``images`` (present locally; ``pullable`` decides whether a missing
    one can be "pulled"), ``fail_images`` (``ensure_image`` raises for these),
    ``unavailable`` (``available()`` answers this message), ``fail_next`` (operation name ->
    message, or the failure itself, raised once by that operation), and :meth:`crash` to
    simulate an exit.
    ``calls`` counts every operation, for tests asserting how often the engine is hit.
    """

    name = "fake"

    def __init__(
        self,
        *,
        images: set[str] | None = None,
        pullable: bool = True,
        real_gpus: bool = False,
    ) -> None:
        self._lock = threading.Lock()
        self.containers: dict[str, FakeContainer] = {}
        self.volumes: dict[str, FakeVolume] = {}
        self.networks: dict[str, FakeNetwork] = {}
        self.images: set[str] = set(images or ())
        self.pullable = pullable
        self.fail_images: dict[str, str] = {}
        # Images of a private registry: pulled only with these credentials.
        self.private_images: dict[str, RegistryCredentials] = {}
        # The credentials each pull was given (None: anonymous), in order.
        self.pull_credentials: list[tuple[str, RegistryCredentials | None]] = []
        self.fail_next: dict[str, str | RuntimeFailure] = {}
        self.unavailable: str | None = None
        self.real_gpus = real_gpus
        self.calls: dict[str, int] = {}
        self.cpu_percent = 1.0
        self.memory_percent = 2.0
        self._seq = 0
        self._tick = 0
        self.owner: Ownership | None = None
        # Why the (fake) engine refuses CPU/memory limits; None: it applies them.
        self.limits_problem: str | None = None
        # Why the (fake) engine does not enforce disk sizes; None: it does.
        self.disk_problem: str | None = None
        # When set, pulling an image that is not present waits for this event.
        self.pull_gate: threading.Event | None = None
        # When set, a stop waits for this event (a container slow to stop).
        self.stop_gate: threading.Event | None = None
        # Stamps of output lines (resolution: one second, as Podman's).
        self.log_stamps = LogStamps()
        # Host ports other programs hold: ``listening`` the host's probe sees, ``hidden``
        # ones it does not (bound after the probe). Both refuse a start that publishes
        # them with "address already in use", as do other running containers' ports.
        self.listening: set[tuple[int, str]] = set()
        self.hidden: set[tuple[int, str]] = set()

    def sharing_engine(self) -> FakeRuntime:
        """Another runtime over the same (fake) engine: what a second installation on
        the same host sees. Bind it to its own owner."""
        other = FakeRuntime(pullable=self.pullable, real_gpus=self.real_gpus)
        other._lock = self._lock
        other.listening = self.listening
        other.hidden = self.hidden
        other.containers = self.containers
        other.volumes = self.volumes
        other.networks = self.networks
        other.images = self.images
        return other

    def _owner_id(self) -> str:
        if self.owner is None:
            raise RuntimeFailure("no installation id bound to the engine yet")
        return self.owner.installation_id

    def _mine(self, cluster_id: str) -> FakeContainer | None:
        c = self.containers.get(cluster_id)
        return c if c is not None and c.owner == self._owner_id() else None

    # -- test helpers ----------------------------------------------------------------

    def fail_image(self, image: str, reason: str = "manifest unknown") -> None:
        """Make ``ensure_image(image)`` raise RuntimeFailure with ``reason``."""
        with self._lock:
            self.fail_images[image] = reason

    def crash(self, cluster_id: str, exit_code: int = 1, error: str | None = None) -> None:
        """Simulate the container's process exiting on its own."""
        with self._lock:
            c = self.containers.get(cluster_id)
            if c is None:
                raise KeyError(cluster_id)
            c.state = ContainerState.EXITED
            c.exit_code = exit_code
            c.error = error

    def volume_files(self, name: str) -> dict[str, str]:
        """A copy of a volume's files (KeyError if the volume does not exist)."""
        with self._lock:
            return dict(self.volumes[name].files)

    def replace_volume_files(self, name: str, files: dict[str, str]) -> None:
        """Set a volume's files to exactly ``files`` (a copy arriving from another host)."""
        with self._lock:
            self.volumes[name].files = dict(files)

    def write_file(self, cluster_id: str, path: str, content: str) -> None:
        """Write ``path`` as the container would: under the volume mount it lands in
        the volume, elsewhere on the container disk."""
        with self._lock:
            c = self.containers[cluster_id]
            mount = c.spec.volume_mount_path.rstrip("/") + "/"
            if c.spec.volume_name and path.startswith(mount):
                self.volumes[c.spec.volume_name].files[path[len(mount) :]] = content
            else:
                c.disk[path] = content

    def network_of(self, cluster_id: str) -> str | None:
        """The network the cluster's container is on (None: the engine's default)."""
        with self._lock:
            c = self.containers[cluster_id]
            owner = Ownership(c.owner) if c.owner else None
            if owner is None or c.spec.account_id is None:
                return None
            return owner.account_network(c.spec.account_id)

    def can_reach(self, source: str, target: str) -> bool:
        """Whether cluster ``source``'s container could connect to ``target``'s: both
        running and on the same network (networks have no routes between them)."""
        with self._lock:
            a, b = self.containers.get(source), self.containers.get(target)
            if a is None or b is None:
                return False
            if ContainerState.RUNNING not in (a.state, b.state) or a.state != b.state:
                return False
        return self.network_of(source) == self.network_of(target)

    # -- internals -------------------------------------------------------------------

    def _enter(self, op: str) -> None:
        """Count the call and raise an injected failure. Caller holds the lock."""
        self.calls[op] = self.calls.get(op, 0) + 1
        if self.unavailable is not None and op != "available":
            raise RuntimeFailure(self.unavailable)
        failure = self.fail_next.pop(op, None)
        if isinstance(failure, RuntimeFailure):
            raise failure
        if failure is not None:
            raise RuntimeFailure(failure)

    def _ensure_network(self, account_id: int) -> None:
        """The account's network, made if missing. Caller holds the lock."""
        owner = self.owner
        assert owner is not None  # _owner_id() checked it
        name = owner.account_network(account_id)
        network = self.networks.setdefault(
            name, FakeNetwork(name, owner=owner.installation_id, account_id=account_id)
        )
        if network.owner != owner.installation_id:
            raise RuntimeFailure(
                f"network {name} exists but does not belong to this installation; left alone"
            )

    def _timestamp(self) -> str:
        self._tick += 1
        return f"2024-01-01T00:00:{self._tick % 60:02d}.{self._tick:09d}Z"

    # -- Runtime protocol ------------------------------------------------------------

    def bind(self, owner: Ownership) -> None:
        if self.owner is not None and self.owner != owner:
            raise ValueError("this engine is already bound to another installation")
        self.owner = owner

    def capabilities(self) -> Capabilities:
        limits = self.limits_problem is None
        return Capabilities(
            real_gpus=self.real_gpus,
            cpu_limits=limits,
            memory_limits=limits,
            stats=True,
            limits_problem=self.limits_problem,
            disk_problem=self.disk_problem,
        )

    def available(self) -> str | None:
        with self._lock:
            self._enter("available")
            return self.unavailable

    def heartbeat(self, timeout_s: float) -> str | None:
        return self.available()

    def local_images(self) -> list[str]:
        with self._lock:
            return sorted(self.images)

    def ensure_image(
        self,
        image: str,
        on_pull: Callable[[], None] | None = None,
        credentials: RegistryCredentials | None = None,
        fresh: bool = False,
    ) -> None:
        if on_pull is not None and (fresh or image not in self.images):
            on_pull()
        gate = self.pull_gate
        if gate is not None and image not in self.images:
            # A slow registry: the pull hangs until the test opens the gate.
            gate.wait()
        with self._lock:
            self._enter("ensure_image")
            missing = fresh or image not in self.images
            if missing:
                self.pull_credentials.append((image, credentials))
            reason = self.fail_images.get(image)
            needed = self.private_images.get(image)
            if reason is None and missing and needed is not None and credentials != needed:
                reason = CREDENTIALS_NEEDED
            if reason is None and image not in self.images and not self.pullable:
                reason = "pull access denied (fake runtime: pulling disabled)"
            if reason is not None:
                raise RuntimeFailure(
                    f"image {image} is not present on the engine and could not be pulled: {reason}",
                    {"image": image},
                )
            self.images.add(image)

    def ensure_volume(
        self, name: str, cluster_id: str | None = None, size_gb: int | None = None
    ) -> None:
        with self._lock:
            self._enter("ensure_volume")
            volume = self.volumes.get(name)
            if volume is None:
                self.volumes[name] = FakeVolume(
                    name, owner=self._owner_id(), cluster_id=cluster_id, size_gb=size_gb or 0
                )
            else:
                _grow(volume, size_gb or 0)

    def create(self, spec: ContainerSpec) -> str:
        with self._lock:
            self._enter("create")
            if spec.image not in self.images:
                raise RuntimeFailure(
                    f"image {spec.image} is not present on the engine", {"image": spec.image}
                )
            owner = self._owner_id()
            old = self.containers.get(spec.cluster_id)
            if old is not None and old.owner != owner:
                raise RuntimeFailure(f"container name of {spec.cluster_id} is taken")
            if spec.volume_name:
                volume = self.volumes.get(spec.volume_name)
                if volume is None:
                    self.volumes[spec.volume_name] = FakeVolume(
                        spec.volume_name,
                        owner=owner,
                        cluster_id=spec.cluster_id,
                        size_gb=spec.volume_gb,
                    )
                else:
                    _grow(volume, spec.volume_gb)
            if spec.account_id is not None:
                self._ensure_network(spec.account_id)
            self._seq += 1
            cid = f"fake{self._seq:060d}"
            # Replacing drops the old container and its disk, as a real engine does.
            self.containers[spec.cluster_id] = FakeContainer(
                id=cid,
                spec=spec,
                owner=owner,
                address=f"10.88.{self._seq // 250 % 250}.{self._seq % 250 + 2}",
            )
            return cid

    def start(self, cluster_id: str) -> None:
        with self._lock:
            self._enter("start")
            c = self._mine(cluster_id)
            if c is None:
                raise RuntimeFailure(
                    f"cluster {cluster_id} has no container to start; create it first"
                )
            if c.state is not ContainerState.RUNNING:
                taken = self.listening | self.hidden | self._published(cluster_id)
                for p in c.spec.ports:
                    if (p.external_port, p.protocol) in taken:
                        raise RuntimeFailure(
                            f"starting cluster {cluster_id}: rootlessport cannot listen on "
                            f"the TCP port: listen tcp4 :{p.external_port}: bind: address "
                            "already in use"
                        )
                c.state = ContainerState.RUNNING
                c.exit_code = None
                c.error = None
                c.started_at = self._timestamp()
                c.log_lines.append(f"started {cluster_id}")

    def _published(self, but: str) -> set[tuple[int, str]]:
        """The host ports running containers other than ``but``'s publish."""
        return {
            (p.external_port, p.protocol)
            for cid, other in self.containers.items()
            if cid != but and other.state is ContainerState.RUNNING
            for p in other.spec.ports
        }

    def host_ports_in_use(self, low: int, high: int, cluster_id: str) -> frozenset[tuple[int, str]]:
        with self._lock:
            self._enter("host_ports_in_use")
            seen = self.listening | self._published(cluster_id)
        return frozenset(p for p in seen if low <= p[0] <= high)

    def stop(self, cluster_id: str, timeout_s: int = 10) -> None:
        gate = self.stop_gate
        if gate is not None:
            gate.wait()
        with self._lock:
            self._enter("stop")
            if self._mine(cluster_id) is not None:
                del self.containers[cluster_id]

    def halt(self, cluster_id: str, timeout_s: int = 10) -> None:
        with self._lock:
            self._enter("halt")
            c = self._mine(cluster_id)
            if c is not None and c.state is not ContainerState.EXITED:
                c.state = ContainerState.EXITED
                c.exit_code = 143

    def remove_volume(self, name: str, *, legacy: bool = False) -> None:
        with self._lock:
            self._enter("remove_volume")
            volume = self.volumes.get(name)
            if volume is None:
                return
            if volume.owner != self._owner_id() and not (legacy and volume.owner is None):
                raise RuntimeFailure(f"volume {name} does not belong to this installation")
            for c in self.containers.values():
                if c.spec.volume_name == name:
                    raise RuntimeFailure(
                        f"volume {name} is in use by container {c.id[:12]}; stop it first"
                    )
            self.volumes.pop(name, None)

    def observe(self, cluster_id: str) -> Observed:
        with self._lock:
            self._enter("observe")
            c = self._mine(cluster_id)
            if c is None:
                return Observed(state=ContainerState.MISSING)
            return Observed(
                state=c.state,
                container_id=c.id,
                exit_code=c.exit_code,
                error=c.error,
                started_at=c.started_at,
                address=c.address,
            )

    def list_managed(self) -> list[ManagedContainer]:
        with self._lock:
            self._enter("list_managed")
            owner = self._owner_id()
            return [
                ManagedContainer(cluster_id, c.id, c.state)
                for cluster_id, c in self.containers.items()
                if c.owner == owner
            ]

    def guard_networks(self) -> None:
        """Nothing to re-apply: the fake's networks are isolated by construction."""
        with self._lock:
            self._enter("guard_networks")

    def list_volumes(self) -> list[ManagedVolume]:
        with self._lock:
            self._enter("list_volumes")
            owner = self._owner_id()
            return [
                ManagedVolume(v.name, v.cluster_id, sum(len(x) for x in v.files.values()))
                for v in self.volumes.values()
                if v.owner == owner
            ]

    def volume_usage(self) -> dict[str, int]:
        """Each of our volumes' "bytes": the summed length of its files' contents."""
        with self._lock:
            self._enter("volume_usage")
            owner = self._owner_id()
            return {
                v.name: sum(len(x) for x in v.files.values())
                for v in self.volumes.values()
                if v.owner == owner
            }

    def stats(self, cluster_id: str, consumer: StatsConsumer = "view") -> ContainerStats | None:
        with self._lock:
            self._enter("stats")
            c = self._mine(cluster_id)
            if c is None or c.state is not ContainerState.RUNNING:
                return None
            limit = int(c.spec.memory_gb * 1024**3)
            return ContainerStats(
                cpu_percent=self.cpu_percent,
                memory_percent=self.memory_percent,
                memory_bytes=int(limit * self.memory_percent / 100),
            )

    def logs(self, cluster_id: str, tail: int = 200) -> str:
        with self._lock:
            self._enter("logs")
            c = self._mine(cluster_id)
            if c is None:
                return ""
            lines = c.log_lines[-tail:] if tail > 0 else []
            return "".join(f"{line}\n" for line in lines)

    def log_lines(
        self,
        cluster_id: str,
        *,
        tail: int | None = None,
        since_ns: int | None = None,
        head: int | None = None,
    ) -> list[LogLine]:
        with self._lock:
            self._enter("log_lines")
            c = self._mine(cluster_id)
            if c is None:
                return []
            lines = select(self.log_stamps.stamp(c.log_lines, c.log_stamps), tail, since_ns)
            return lines if head is None else lines[:head]

    def follow_log(self, cluster_id: str, *, since_ns: int | None = None) -> LogFollow:
        with self._lock:
            self._enter("follow_log")
            followed = self._mine(cluster_id)

        def read(start: int) -> tuple[list[LogLine], bool]:
            with self._lock:
                assert followed is not None
                lines = self.log_stamps.stamp(followed.log_lines, followed.log_stamps)
                alive = self.containers.get(cluster_id) is followed
                return lines[start:], alive and followed.state is ContainerState.RUNNING

        return FakeLogFollow(read if followed is not None else None, since_ns)

    # -- the engine behind it (see Runtime) ------------------------------------------

    def close(self) -> None:
        """Nothing to release."""

    def volume_io(self) -> VolumeIO:
        """Volumes as tar streams of their files (fake_volumes.py)."""
        return FakeVolumeIO(self)

    def exec_endpoint(self) -> ExecEndpoint:
        """There is no engine to exec in: RuntimeFailure, as for any runtime without."""
        raise RuntimeFailure("this cluster's host runtime has no container engine to open a shell")

    def docker_engine(self) -> None:
        return None

    def inventory(self) -> None:
        return None
