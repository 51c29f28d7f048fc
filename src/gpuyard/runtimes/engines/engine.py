"""One way to reach a container engine: the Docker Engine API through the ``docker`` SDK,
restricted to one installation's objects.

Both the cluster runtime (engines/runtime.py) and the Slurm node runtime (slurm/nodes.py)
work through an :class:`Engine`. It owns the SDK client, the translation of every
engine and transport error to :class:`RuntimeFailure`, the ownership labels, and the
operations that touch objects by name (remove a container, a volume, a network; list
them). Those refuse objects that do not carry this installation's id (DESIGN.md rule 8):
whatever else is on the engine — another installation's objects, a developer's own
containers — is never stopped, removed or renamed.

It also decides how CPU and memory limits are treated: if the engine refuses them, the
refusal is remembered (:attr:`Engine.limits_problem`) and the create fails with a clear
error, unless the operator allowed running without limits. Disk sizes are treated the
same way: a volume labelled with a size (``LABEL_SIZE``) is made as a loop-mounted
image of that size (runtimes/volumes/images.py) where the host allows, and a container
disk size the engine refuses (``storage_opt``: overlay on XFS with project quotas) is
remembered (runtimes/engines/disk.py, :attr:`Engine.disk`); either fails with a clear
error unless the operator allowed unenforced disk sizes.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
import docker.types
import requests

from gpuyard.core.errors import RuntimeFailure, ValidationFailed
from gpuyard.core.ownership import LABEL_ACCOUNT, LABEL_INSTALLATION, LABEL_MANAGED, Ownership
from gpuyard.runtimes.engines.disk import READY, DiskSizes, VolumeReady, size_label
from gpuyard.runtimes.hosts.edge import IptablesEdge
from gpuyard.runtimes.hosts.firewall import (
    IptablesIsolation,
    IsolationUnavailable,
    Runner,
    bridge_name,
    subprocess_runner,
)
from gpuyard.runtimes.volumes.images import VolumeImages

# How long a failed probe of the host firewall is believed before it is asked again.
FIREWALL_RETRY_S = 60.0
# How long a container Podman says is being removed is asked about again before the
# answer counts as a failure (a removal takes well under a second).
VANISH_CONFIRM_S = 2.0
# How long a removal waits for another caller's removal of the same container to end.
REMOVAL_WAIT_S = 60.0

# The Docker network option that names a bridge network's interface (Podman's compat
# API honours it too).
BRIDGE_NAME_OPTION = "com.docker.network.bridge.name"
MTU_OPTION = "com.docker.network.driver.mtu"

# Engine error texts that mean "this host cannot apply a CPU/memory limit" (cgroup
# controllers missing or not delegated, e.g. rootless on cgroup v1).
LIMIT_ERROR_MARKERS = (
    "cgroup",
    "cpu.cfs",
    "cpu quota",
    "nanocpus",
    "memory limit",
    "memory.limit",
    "kernel does not support",
    "not supported",
)


def reason(e: BaseException) -> str:
    """The engine's own explanation when there is one, else the exception text."""
    if isinstance(e, docker.errors.APIError):
        explanation = getattr(e, "explanation", None)
        if explanation:
            return str(explanation)
    return str(e) or type(e).__name__


def lost_creation_race(e: docker.errors.APIError) -> bool:
    """True when a create failed because a concurrent caller made the same object
    between our inspect and create (Docker answers 409; Podman's compat API a 500
    saying "already exists" or "name … is in use")."""
    text = reason(e)
    return e.status_code == 409 or "already exists" in text or "is in use" in text


def vanished_mid_removal(e: docker.errors.APIError) -> bool:
    """True when the engine says the container is gone: a 404, or the 500 Podman's
    compat API answers for a container another caller is removing at that moment
    ("... does not exist in database: no such container"). A Podman name left behind
    by an unclean shutdown answers the same 500 for good; :meth:`Engine.inspect_container`
    therefore asks again until a 404 confirms it."""
    return isinstance(e, docker.errors.NotFound) or "no such container" in reason(e)


@dataclass(frozen=True)
class EngineVolume:
    """A volume of ours: its name, labels, size when the engine reports it, creation."""

    name: str
    labels: dict[str, str]
    size_bytes: int | None
    created_at: str | None


@dataclass(frozen=True)
class EngineNetwork:
    """A network of ours: its name, labels and driver options."""

    name: str
    labels: dict[str, str]
    options: dict[str, str]


@dataclass(frozen=True)
class EnginePolicy:
    """What the operator allows an engine and what gpuyard manages beside it; one
    value for the cluster runtime and the Slurm node runtime alike."""

    # Run without CPU/memory limits on an engine that cannot apply them.
    allow_unenforced_limits: bool = False
    # Keep the host firewall rules that close our networks (a local engine only: the
    # rules must be on the engine's host).
    manage_host_firewall: bool = False
    # Run without those rules where they cannot be kept (single-tenant installations).
    allow_unisolated_networks: bool = False
    # Run with volume and container disk sizes unenforced where the host cannot
    # enforce them.
    allow_unenforced_disk: bool = False


DEFAULT_POLICY = EnginePolicy()


class NotOurs(RuntimeFailure):
    """The named engine object exists but belongs to somebody else; it was left alone."""


class Engine:
    """A container engine at ``base_url`` (``unix://``, ``tcp://``, ``ssh://``; None: the
    SDK's default, ``DOCKER_HOST``), acting for the installation ``owner``.

    The SDK client is created on first use, so constructing this never touches the
    engine. ``owner`` may be bound later (:meth:`bind`), once the store is open; every
    operation that needs it raises :class:`RuntimeFailure` until then. Thread-safe.
    """

    def __init__(
        self,
        base_url: str | None,
        timeout_s: float = 60.0,
        owner: Ownership | None = None,
        *,
        policy: EnginePolicy = DEFAULT_POLICY,
        firewall_runner: Runner | None = None,
        client: Any = None,
        volume_images: VolumeImages | None = None,
    ) -> None:
        """``client``: an SDK client to use instead of connecting to ``base_url`` on
        first use (tests pass a fake one). ``volume_images``: how sized volumes' image
        files are made on the engine's host (None: no commands can be run there, so
        volume sizes are not enforced)."""
        self.base_url = base_url
        manage_host_firewall = policy.manage_host_firewall
        # How firewall commands reach the engine's host: this machine's shell, or SSH
        # to a remote host (runtimes/hosts/ssh_tunnel.py SshRunner).
        self._firewall_runner = firewall_runner
        # TLS client material of a tcp:// engine (runtimes/hosts/runtimes.py); None: none.
        self.tls: Any = None
        # The host rules that keep our networks apart (runtimes/hosts/firewall.py), made when the
        # owner is known (its chain is named after the installation); None: none
        # managed (a remote engine, a caller without networks).
        self.manage_host_firewall = manage_host_firewall
        self.firewall: IptablesIsolation | None = (
            self._isolation(owner.short) if manage_host_firewall and owner else None
        )
        self._host_edge: IptablesEdge | None = None
        self.allow_unisolated_networks = policy.allow_unisolated_networks
        self._firewall_checked = False
        self._firewall_problem: str | None = None
        self._firewall_retry_at = 0.0
        self.timeout_s = timeout_s
        self._owner = owner
        self.allow_unenforced_limits = policy.allow_unenforced_limits
        self._client_lock = threading.Lock()
        self._client_obj: Any = client
        self.vanish_confirm_s = VANISH_CONFIRM_S
        self.removal_wait_s = REMOVAL_WAIT_S
        self._is_podman: bool | None = None
        self._lock = threading.Lock()
        # Why the engine cannot apply limits (None: it can, as far as known). Kept for
        # the life of the process: a host's cgroup setup does not change under it.
        self.limits_problem: str | None = None
        # Volume and container disk sizes (runtimes/engines/disk.py).
        self.disk = DiskSizes(self, volume_images, policy.allow_unenforced_disk)

    # -- ownership ------------------------------------------------------------------

    def bind(self, owner: Ownership) -> None:
        """Act for ``owner`` from now on. Binding the same owner again is a no-op;
        a different one raises ValueError (one engine object, one installation)."""
        with self._lock:
            if self._owner is not None and self._owner != owner:
                raise ValueError("this engine is already bound to another installation")
            self._owner = owner
            if self.manage_host_firewall and self.firewall is None:
                self.firewall = self._isolation(owner.short)

    def with_timeout(self, timeout_s: float) -> Engine:
        """The same engine reached with another request timeout: same URL, TLS, policy,
        firewall and owner, its own client (the SDK's timeout is per client). For work
        whose requests may be silent longer than this engine's timeout allows (commands
        run in a container, an image load)."""
        twin = Engine(
            self.base_url,
            timeout_s,
            self._owner,
            policy=EnginePolicy(
                allow_unenforced_limits=self.allow_unenforced_limits,
                manage_host_firewall=self.manage_host_firewall,
                allow_unisolated_networks=self.allow_unisolated_networks,
            ),
            firewall_runner=self._firewall_runner,
        )
        twin.tls = self.tls
        return twin

    @property
    def host_runner(self) -> Runner | None:
        """How commands run on the engine's host: over SSH for a remote host, this
        machine's shell for the local engine whose firewall we keep; None where no
        command can be run there (a tcp:// engine)."""
        if self._firewall_runner is not None:
            return self._firewall_runner
        return subprocess_runner if self.manage_host_firewall else None

    def _isolation(self, short: str) -> IptablesIsolation:
        if self._firewall_runner is None:
            return IptablesIsolation(short)
        return IptablesIsolation(short, runner=self._firewall_runner, iptables="iptables")

    def host_edge(self) -> IptablesEdge | None:
        """The training clusters' SSH endpoints on this engine's host (runtimes/hosts/edge.py),
        kept through the isolation chain's runner; None where this engine's host
        firewall is not managed (a tcp:// engine). Raises RuntimeFailure before
        :meth:`bind`."""
        if not self.manage_host_firewall:
            return None
        short = self.owner.short
        with self._lock:
            if self._host_edge is None:
                if self._firewall_runner is None:
                    self._host_edge = IptablesEdge(
                        short, iptables=shutil.which("iptables") or "iptables"
                    )
                else:
                    self._host_edge = IptablesEdge(short, runner=self._firewall_runner)
            return self._host_edge

    @property
    def owner(self) -> Ownership:
        owner = self._owner
        if owner is None:
            raise RuntimeFailure("no installation id bound to the engine yet")
        return owner

    def claims(self, labels: Mapping[str, str] | None, *, legacy: bool = False) -> bool:
        """True for an object labelled with our id; with ``legacy`` also for one made
        before installation ids (labelled only ``gpuyard.managed``), which the caller
        knows from its store to be ours."""
        if self.owner.owns(labels):
            return True
        found = labels or {}
        return legacy and LABEL_MANAGED in found and LABEL_INSTALLATION not in found

    def labels(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """``extra`` plus the labels that mark an object as ours (those win)."""
        return {**(extra or {}), **self.owner.labels()}

    # -- plumbing -------------------------------------------------------------------

    @property
    def where(self) -> str:
        return self.base_url or "the default Docker socket"

    def unreachable(self, e: BaseException) -> str:
        return (
            f"no container engine reachable at {self.where}: install podman "
            f"(apt-get install podman) or Docker and start it, or set the engine URL "
            f"({type(e).__name__}: {str(e)[:200]})"
        )

    @contextlib.contextmanager
    def errors(self, action: str) -> Iterator[None]:
        """Translate every engine/transport failure inside the block to RuntimeFailure."""
        try:
            yield
        except (RuntimeFailure, ValidationFailed):
            raise
        except (requests.exceptions.ConnectionError, ConnectionError) as e:
            raise RuntimeFailure(self.unreachable(e), {"action": action}) from e
        except docker.errors.DockerException as e:
            text = reason(e)
            if "Error while fetching server API version" in text:
                raise RuntimeFailure(self.unreachable(e), {"action": action}) from e
            raise RuntimeFailure(f"{action} failed: {text}", {"action": action}) from e
        except (requests.exceptions.RequestException, OSError, ValueError, KeyError) as e:
            # ValueError covers JSON decode errors from empty or garbled engine replies.
            raise RuntimeFailure(f"{action} failed: {reason(e)}", {"action": action}) from e

    def client(self) -> Any:
        """The SDK client, created on first use. A failed creation is not cached, so an
        engine started later is picked up by the next call."""
        with self._client_lock:
            if self._client_obj is None:
                with self.errors("connecting to the container engine"):
                    # version="auto" negotiates with the engine: pinning would break on
                    # Docker releases that raised their minimum API version.
                    self._client_obj = docker.DockerClient(
                        base_url=self.base_url,
                        version="auto",
                        timeout=self.timeout_s,
                        tls=self.tls or False,
                    )
            return self._client_obj

    @property
    def api(self) -> Any:
        return self.client().api

    def is_podman(self) -> bool:
        if self._is_podman is None:
            with self.errors("querying the engine version"):
                version = self.client().version()
            components = version.get("Components") or []
            self._is_podman = any("podman" in str(c.get("Name", "")).lower() for c in components)
        return self._is_podman

    def ping(self) -> str | None:
        """None when the engine answers a ping, else a message saying what to do."""
        try:
            with self.errors("ping"):
                self.client().ping()
        except RuntimeFailure as e:
            return e.message
        return None

    # -- limits ---------------------------------------------------------------------

    def limits_refused(self, e: RuntimeFailure, uses_limits: bool) -> bool:
        """Whether ``e`` is the engine refusing CPU/memory limits. If so, remember why;
        True means: retry without limits (the operator allowed that). Otherwise the
        caller raises :meth:`limits_error`."""
        text = e.message.lower()
        if not uses_limits or not any(m in text for m in LIMIT_ERROR_MARKERS):
            return False
        with self._lock:
            self.limits_problem = e.message[:500]
        return True

    @property
    def apply_limits(self) -> bool:
        """False only when the engine refused limits and the operator allowed that."""
        return self.limits_problem is None or not self.allow_unenforced_limits

    def limits_error(self) -> RuntimeFailure:
        return RuntimeFailure(
            "this host's container engine cannot enforce CPU/memory limits "
            f"({self.limits_problem}); fix its cgroup setup, or allow running without "
            "limits with GPUYARD_ALLOW_UNENFORCED_LIMITS=true",
            {"enforces_limits": False},
        )

    # -- containers -----------------------------------------------------------------

    def inspect_container(self, name: str, *, legacy: bool = False) -> dict[str, Any] | None:
        """The container's inspect data if it exists and is ours; None when missing.
        Raises :class:`NotOurs` for a container of that name that is not ours
        (``legacy``: see :meth:`claims`)."""
        with self.errors(f"inspecting container {name}"):
            info = self._inspect_settled(name)
            if info is None:
                return None
        labels = (info.get("Config") or {}).get("Labels") or {}
        if not self.claims(labels, legacy=legacy):
            raise NotOurs(
                f"container {name} exists but does not belong to this installation; left alone",
                {"container": name},
            )
        return info

    def _inspect_settled(self, name: str) -> dict[str, Any] | None:
        """The engine's inspect data of ``name``; None once a 404 says it is gone. A
        container being removed (Podman's 500, :func:`vanished_mid_removal`) is asked
        about again for up to ``vanish_confirm_s``; still so, the error is raised."""
        deadline = time.monotonic() + self.vanish_confirm_s
        while True:
            try:
                info: dict[str, Any] = self.api.inspect_container(name)
                return info
            except docker.errors.NotFound:
                return None
            except docker.errors.APIError as e:
                if not vanished_mid_removal(e) or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def stop_container(self, name: str, timeout_s: int) -> None:
        """Stop (SIGTERM, SIGKILL after ``timeout_s``) the container ``name``, which the
        caller has just found to be ours; one that is gone (or going) is fine."""
        with self.errors(f"stopping container {name}"):
            try:
                self.api.stop(name, timeout=timeout_s)
            except docker.errors.APIError as e:
                if not vanished_mid_removal(e):
                    raise

    def stop_and_remove(self, name: str, timeout_s: int, *, legacy: bool = False) -> None:
        """Stop (SIGTERM, SIGKILL after ``timeout_s``) and delete our container ``name``.
        Idempotent; a container that is not ours raises :class:`NotOurs`."""
        if self.inspect_container(name, legacy=legacy) is None:
            return
        self.stop_container(name, timeout_s)
        self.remove_container(name, checked=True)

    def remove_container(self, name: str, *, checked: bool = False) -> None:
        """Delete our container ``name`` (forcefully). ``checked``: the caller has just
        verified it is ours. Idempotent."""
        if not checked and self.inspect_container(name) is None:
            return
        deadline = time.monotonic() + self.removal_wait_s
        with self.errors(f"removing container {name}"):
            while True:
                try:
                    # v=True drops anonymous volumes an image declares; named ones stay.
                    self.api.remove_container(name, v=True, force=True)
                    return
                except docker.errors.APIError as e:
                    if vanished_mid_removal(e):
                        return
                    # Another caller is removing it. Gone only once the engine says so:
                    # a caller releases the container's GPUs when this returns, and
                    # that other removal may yet fail. Asked again until it is over.
                    if "already in progress" not in reason(e) or time.monotonic() > deadline:
                        raise
                time.sleep(0.1)

    def list_containers(self, *label_filters: str) -> list[dict[str, Any]]:
        """Our containers (any state) that also match every ``label_filters`` entry
        (``key`` or ``key=value``). Rows as the engine's list endpoint answers them."""
        filters = [self.owner.label_filter(), *label_filters]
        with self.errors("listing containers"):
            rows: list[dict[str, Any]] = self.api.containers(all=True, filters={"label": filters})
        # Engines apply label filters; checking again costs nothing and guards against
        # one that ignores a filter.
        return [r for r in rows if self.owner.owns(r.get("Labels"))]

    # -- volumes --------------------------------------------------------------------

    def ensure_volume(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Create our volume ``name`` if it does not exist. Idempotent.

        Labels with a size (``LABEL_SIZE``) make a sized volume (a loop-mounted image
        of that size, runtimes/volumes/images.py); an existing one smaller than the size
        is grown. Where sizes cannot be enforced this raises RuntimeFailure, unless the
        operator allowed that (then the volume is made unsized)."""
        ready = self.prepare_volume(name, labels)
        try:
            ready.wait()
        except RuntimeFailure:
            ready.undo()
            raise

    def prepare_volume(self, name: str, labels: Mapping[str, str] | None = None) -> VolumeReady:
        """:meth:`ensure_volume` for a container about to be created: a new sized
        volume's image is made on a thread of its own while the caller goes on (the
        volume itself is recorded at once; the engine mounts the image only when a
        container using it starts). The caller waits on the answer before that start;
        if the wait fails, it removes what uses the volume and calls ``undo``."""
        size = size_label(labels)
        with self.errors(f"creating volume {name}"):
            try:
                info = self.api.inspect_volume(name)
            except docker.errors.NotFound:
                return self._new_volume(name, labels, size)
            if size:
                self.disk.grow(name, info, size)
        return READY

    def _new_volume(
        self, name: str, labels: Mapping[str, str] | None, size: int | None
    ) -> VolumeReady:
        options, making = self.disk.begin_volume(name, size) if size else (None, None)
        try:
            made = self.api.create_volume(
                name=name, labels=self.labels(labels), driver_opts=options
            )
        except docker.errors.APIError as e:
            if not lost_creation_race(e):
                if making is not None:
                    making.settle()
                    self.disk.drop_image(name)
                raise
            # Whoever won the race, the volume must exist now; this call's own making
            # of the image (the same file, made under a name of its own and renamed
            # only if still missing) is still waited for.
            self.api.inspect_volume(name)
            return VolumeReady(making)
        except BaseException:
            if making is not None:
                making.settle()
                self.disk.drop_image(name)
            raise

        def image_made() -> None:
            if size and isinstance(made, dict):
                self.disk.made(name, made, size)

        return VolumeReady(making, made=image_made, undo=lambda: self.remove_volume(name))

    def remove_volume(self, name: str, *, legacy: bool = False) -> None:
        """Delete our volume ``name``. Idempotent; one in use raises RuntimeFailure.

        ``legacy``: the volume predates installation ids (named by the store, labelled
        only ``gpuyard.managed``); it is removed if no installation claims it."""
        with self.errors(f"removing volume {name}"):
            try:
                info = self.api.inspect_volume(name)
            except docker.errors.NotFound:
                return
            if not self.claims(info.get("Labels"), legacy=legacy):
                raise NotOurs(
                    f"volume {name} does not belong to this installation; left alone",
                    {"volume": name},
                )
            with contextlib.suppress(docker.errors.NotFound):
                self.api.remove_volume(name)
        self.disk.removed(name, info)

    def list_volumes(self) -> list[EngineVolume]:
        """Our volumes, with their sizes where the engine reports them (one ``df``)."""
        with self.errors("listing volumes"):
            answer = self.api.volumes(filters={"label": self.owner.label_filter()}) or {}
        rows = [v for v in answer.get("Volumes") or [] if self.owner.owns(v.get("Labels"))]
        sizes = self._volume_sizes() if rows else {}
        return [
            EngineVolume(
                name=str(v.get("Name")),
                labels=dict(v.get("Labels") or {}),
                size_bytes=sizes.get(str(v.get("Name"))),
                created_at=v.get("CreatedAt"),
            )
            for v in rows
        ]

    def volume_usage(self) -> dict[str, int]:
        """Bytes used by each of our volumes. A sized volume (an image file): the
        blocks its image holds on the host's disk (sparse files count by their blocks).
        Others: the engine's ``/system/df`` (``UsageData.Size``; Podman 4.3 sums its
        files' apparent sizes, sparse files at full length, directories not counted);
        volumes the engine reports no size for (Docker's -1) are left out. Raises
        RuntimeFailure when the engine or the host does not answer."""
        with self.errors("listing volumes"):
            answer = self.api.volumes(filters={"label": self.owner.label_filter()}) or {}
        rows = [v for v in answer.get("Volumes") or [] if self.owner.owns(v.get("Labels"))]
        out, plain = self.disk.usage(rows)
        if plain:
            with self.errors("reading disk usage"):
                df = self.api.df() or {}
            out.update({n: size for n, size in self._df_sizes(df).items() if n in plain})
        return out

    def _volume_sizes(self) -> dict[str, int]:
        try:
            with self.errors("reading disk usage"):
                df = self.api.df() or {}
        except RuntimeFailure:
            return {}  # sizes are informative; a listing never fails for them
        return self._df_sizes(df)

    @staticmethod
    def _df_sizes(df: dict[str, Any]) -> dict[str, int]:
        """Volume sizes by name from a ``/system/df`` answer (unknown sizes left out)."""
        out: dict[str, int] = {}
        for v in df.get("Volumes") or []:
            size = (v.get("UsageData") or {}).get("Size")
            if isinstance(size, int) and size >= 0:
                out[str(v.get("Name"))] = size
        return out

    # -- networks -------------------------------------------------------------------

    def ensure_network(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        *,
        legacy: bool = False,
        subnet: str | None = None,
        gateway: str | None = None,
        mtu: int | None = None,
    ) -> None:
        """Create our bridge network ``name`` if it does not exist, then close it to
        every other network (runtimes/hosts/firewall.py): its containers reach the outside world
        through NAT and each other, nothing else on the host reaches them except through
        published ports. The bridge interface is named by ``bridge_name(name)`` so the
        host rules can name it.

        Idempotent, also under concurrent calls: two creates at once both succeed and
        leave one network. A network of that name that is not ours raises
        :class:`NotOurs` and is not used (``legacy``: see :meth:`claims`). Raises
        RuntimeFailure when the isolation cannot be applied (see :meth:`isolate`).

        ``subnet`` and ``gateway``: the network's IPv4 subnet and this host's gateway on
        it, chosen by the caller (None: the engine picks); ``mtu``: its interfaces' MTU
        (None: the engine's default). They apply when the network is created; an
        existing network keeps what it has."""
        options = {BRIDGE_NAME_OPTION: bridge_name(name)}
        if mtu is not None:
            options[MTU_OPTION] = str(mtu)
        ipam = None
        if subnet is not None:
            ipam = docker.types.IPAMConfig(
                pool_configs=[docker.types.IPAMPool(subnet=subnet, gateway=gateway)]
            )
        with self.errors(f"creating network {name}"):
            if self.inspect_network(name, legacy=legacy) is None:
                try:
                    self.api.create_network(
                        name,
                        driver="bridge",
                        labels=self.labels(labels),
                        options=options,
                        ipam=ipam,
                        check_duplicate=True,
                    )
                except docker.errors.APIError as e:
                    if not lost_creation_race(e):
                        raise
                # Whoever won the race, the network must be ours.
                if self.inspect_network(name, legacy=legacy) is None:
                    raise RuntimeFailure(
                        f"network {name} vanished right after it was created", {"network": name}
                    )
        self.isolate([bridge_name(name)])

    def isolate(self, bridges: Iterable[str]) -> None:
        """Apply the host rules that close ``bridges`` (runtimes/hosts/firewall.py).

        Without a host firewall we can change (``firewall`` None, or not root): on
        Docker its own isolation of bridge networks holds and this is a no-op; on Podman
        (netavark's isolation is not dependable, see runtimes/hosts/firewall.py) it raises
        RuntimeFailure unless the operator allowed shared networks."""
        if self.allow_unisolated_networks:
            return
        problem = self.firewall_problem()
        if problem is None and self.firewall is not None:
            try:
                self.firewall.protect(bridges)
                return
            except IsolationUnavailable as exc:
                problem = str(exc)
        if not self.is_podman():
            return
        raise RuntimeFailure(
            "cannot isolate this account's network from other accounts on this host: "
            f"{problem}. Run gpuyard as root, or set GPUYARD_ALLOW_UNISOLATED_NETWORKS=true "
            "to let clusters of different accounts reach each other.",
            {"reason": "network_isolation_unavailable"},
        )

    def firewall_problem(self) -> str | None:
        """Why the host firewall cannot be managed here (None: it can). A success is
        kept; a failure is asked again after a minute (a lock held at start-up must not
        refuse creates until the next restart)."""
        if self.firewall is None:
            return "no host firewall is managed for this engine"
        with self._lock:
            if self._firewall_checked and (
                self._firewall_problem is None or time.monotonic() < self._firewall_retry_at
            ):
                return self._firewall_problem
        problem = self.firewall.available()
        with self._lock:
            self._firewall_problem, self._firewall_checked = problem, True
            self._firewall_retry_at = time.monotonic() + FIREWALL_RETRY_S
        return problem

    def keep_isolation_first(self) -> None:
        """After a container start: the engine may just have inserted its own accepting
        jumps above ours (runtimes/hosts/firewall.py ``keep_first``)."""
        if self.allow_unisolated_networks or self.firewall is None:
            return
        if self.firewall_problem() is None:
            with contextlib.suppress(IsolationUnavailable):
                self.firewall.keep_first()

    def guard_networks(self, keep: Callable[[str], bool] = lambda _name: False) -> None:
        """The periodic pass over our networks: account networks no container uses are
        removed (each holds one of the engine's address pools, which run out: Docker's
        defaults give about 30) unless ``keep`` (asked just before) says a container may
        be about to join, and the host rules are re-applied for the networks left
        (a firewall reload removed them, say). A network made before bridges were named keeps the
        engine's bridge, which these rules do not name: it is closed once it is made
        again (an account network at its next use after it empties)."""
        live: list[str] = []
        for network in self.list_networks():
            if (
                LABEL_ACCOUNT in network.labels
                and not keep(network.name)
                and self._remove_if_unused(network.name)
            ):
                continue
            live.append(bridge_name(network.name))
        if self.allow_unisolated_networks or self.firewall is None:
            return
        if self.firewall_problem() is None:
            with self.errors("re-applying network isolation"):
                try:
                    self.firewall.protect(live)
                except IsolationUnavailable as exc:
                    raise RuntimeFailure(str(exc)) from exc

    def _remove_if_unused(self, name: str) -> bool:
        """Remove our network ``name`` unless a container is on it; True if removed.
        The engine refuses to remove a network in use, so a container joining it
        meanwhile wins (and one that finds it gone makes it again)."""
        try:
            self.remove_network(name)
        except RuntimeFailure:
            return False
        return True

    def inspect_network(self, name: str, *, legacy: bool = False) -> dict[str, Any] | None:
        """The network's inspect data if it exists and is ours; None when missing.
        Raises :class:`NotOurs` for a network of that name that is not ours."""
        with self.errors(f"inspecting network {name}"):
            try:
                info: dict[str, Any] = self.api.inspect_network(name)
            except docker.errors.NotFound:
                return None
        if not self.claims(info.get("Labels"), legacy=legacy):
            raise NotOurs(
                f"network {name} exists but does not belong to this installation; left alone",
                {"network": name},
            )
        return info

    def list_networks(self, *label_filters: str) -> list[EngineNetwork]:
        """Our networks that also match every ``label_filters`` entry (``key`` or
        ``key=value``)."""
        filters = [self.owner.label_filter(), *label_filters]
        with self.errors("listing networks"):
            rows: list[dict[str, Any]] = self.api.networks(filters={"label": filters}) or []
        return [
            EngineNetwork(
                name=str(r.get("Name")),
                labels=dict(r.get("Labels") or {}),
                options=dict(r.get("Options") or {}),
            )
            for r in rows
            if self.owner.owns(r.get("Labels"))
        ]

    def remove_network(self, name: str, *, legacy: bool = False) -> None:
        """Delete our network. Idempotent; raises RuntimeFailure while in use, and
        :class:`NotOurs` for somebody else's (``legacy``: see :meth:`claims`)."""
        with self.errors(f"removing network {name}"):
            try:
                info = self.api.inspect_network(name)
            except docker.errors.NotFound:
                return
            if not self.claims(info.get("Labels"), legacy=legacy):
                raise NotOurs(
                    f"network {name} does not belong to this installation; left alone",
                    {"network": name},
                )
            with contextlib.suppress(docker.errors.NotFound):
                self.api.remove_network(name)
