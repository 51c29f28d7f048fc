"""The docker-engine runtime: the Docker Engine API through the ``docker`` SDK.

It drives a Docker daemon or Podman's Docker-compatible service (``podman system
service``). Every public method turns engine and transport errors into
:class:`RuntimeFailure`; no docker, requests or JSON exception escapes.

Podman differences handled here (measured against Podman 4.3.1, API 1.41):

- ``stats`` ignores ``one-shot`` and always returns an empty ``precpu_stats``, and its
  ``system_cpu_usage`` does not grow at ``ncpus`` ns per ns, so Docker's CLI formula gives
  wrong numbers. CPU% is therefore computed from ``total_usage`` against wall-clock time
  between two samples (this runtime remembers the previous one), which is what Docker's
  formula approximates anyway.
- ``stats`` on a stopped container answers an empty body, hence the state check first.
- ``HostConfig.DeviceRequests`` is accepted and silently dropped, so GPUs are not attached
  through the API: :meth:`capabilities` reports ``real_gpus=False`` on Podman.
- an explicit host IP ``0.0.0.0`` in a port binding yields a port that never answers,
  so bindings carry no host IP (all interfaces on both engines).
- a failed pull answers 200 with the error inside the progress stream, so the stream is
  read to the end and checked.
- bridge networks are not dependably isolated from each other (netavark 1.4 drops its
  shared isolation rule whenever any isolated network empties), so the host rules of
  runtimes/hosts/firewall.py keep them apart (:meth:`Engine.ensure_network`).

Each cluster's container joins its account's private network (one per account, made on
demand), so clusters of different accounts have no route to each other.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import docker
import docker.errors
import docker.types

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.image_refs import parse_image_ref
from gpuyard.core.ownership import Ownership
from gpuyard.core.side_by_side import SideBySide
from gpuyard.runtimes.base import (
    GIB,
    LABEL_ACCOUNT,
    LABEL_CLUSTER,
    LABEL_SIZE,
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
from gpuyard.runtimes.engines import logs as engine_logs
from gpuyard.runtimes.engines import pull_errors
from gpuyard.runtimes.engines.container_create import create_container
from gpuyard.runtimes.engines.engine import DEFAULT_POLICY, Engine, EnginePolicy, reason
from gpuyard.runtimes.engines.exec_endpoint import engine_exec_endpoint
from gpuyard.runtimes.engines.inspect_data import observed_of, parse_engine_time, state_of
from gpuyard.runtimes.engines.inventory import discover_inventory
from gpuyard.runtimes.engines.volume_recheck import recheck_volume, remove_mount_made_volume
from gpuyard.runtimes.engines.volumes import EngineVolumeIO
from gpuyard.runtimes.hosts.firewall import Runner
from gpuyard.runtimes.hosts.ports import ports_in_use
from gpuyard.runtimes.records import EngineInventory, RegistryCredentials
from gpuyard.runtimes.volumes.images import VolumeImages

log = logging.getLogger(__name__)

IMAGE_PRESENT_TTL_S = 30.0
NETWORK_PRESENT_TTL_S = 30.0
VOLUME_SEEN_TTL_S = 3600.0
# How long the look start takes at a container it started answers the next observe:
# the readiness wait asks at once, so that look need not be taken twice.
JUST_STARTED_S = 1.0
# An account network a create used this recently is not removed as unused: Podman
# checks a network's users and removes it without holding off a create in between, so
# a container created meanwhile would find its network gone at start.
NETWORK_IN_USE_GRACE_S = 60.0


def _says_network_gone(engine_words: str) -> bool:
    """Whether the engine's error says a network the container names does not exist."""
    text = engine_words.lower()
    return "network" in text and "not found" in text


class _NameInUse(Exception):
    """The cluster's container name is taken by a previous container."""


class _NetworkGone(Exception):
    """The account network the container was to join no longer exists."""


class DockerEngineRuntime:
    """Runtime over a Docker Engine API URL (``unix://``, ``tcp://``, ``ssh://``), acting
    for one installation (``owner``, or bound later with :meth:`bind`).

    The SDK client is created on first use, so constructing this object never touches
    the engine and a server can start with no engine present. Thread-safe: the SDK's
    ``requests`` session is shared, and the little state kept here is behind a lock.
    Containers are named ``gy{installation}-{cluster id}`` and carry our labels; nothing
    without them is ever stopped or removed (runtimes/engines/engine.py).
    """

    name = "docker-engine"

    def __init__(
        self,
        base_url: str | None,
        timeout_s: float = 60.0,
        owner: Ownership | None = None,
        *,
        policy: EnginePolicy = DEFAULT_POLICY,
        firewall_runner: Runner | None = None,
        network_in_use_grace_s: float = NETWORK_IN_USE_GRACE_S,
        client: Any = None,
        volume_images: VolumeImages | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``client``: an SDK client to use instead of connecting to ``base_url``
        (tests inject a stand-in engine). ``volume_images``: how sized volumes are made
        on the engine's host (see Engine). ``clock``: monotonic seconds, for what this
        runtime remembers for a while (images and networks seen, networks in use)."""
        self.network_in_use_grace_s = network_in_use_grace_s
        self._clock = clock
        self.engine = Engine(
            base_url,
            timeout_s,
            owner,
            policy=policy,
            firewall_runner=firewall_runner,
            client=client,
            volume_images=volume_images,
        )
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        # The heartbeat's client (its own short timeout), made on the first heartbeat;
        # an injected client is pinged as it is.
        self._pinger: Engine | None = self.engine if client is not None else None
        # The last spec created per cluster, so start() can recreate without limits if
        # the OCI runtime only rejects them when the container starts.
        self._specs: dict[str, ContainerSpec] = {}
        # What start saw of each container just started, until when (see observe).
        self._just_started: dict[str, tuple[float, Observed]] = {}
        # Images known present, until the given monotonic time: an inspect per start
        # is a round trip on the start path. An image removed meanwhile makes create
        # fail with a clear error and is forgotten, so the next start pulls it.
        self._images_seen: dict[str, float] = {}
        # Account networks known present, until the given monotonic time (same reason).
        # One removed meanwhile makes the create fail; it is then made again, once.
        self._networks_seen: dict[str, float] = {}
        # Volumes this runtime made or found ours, until the given monotonic time: a
        # restart creates its container while the volume is checked (see create).
        self._volumes_seen: dict[str, float] = {}
        # When each account network was last asked for by a create (monotonic).
        self._networks_used: dict[str, float] = {}
        # Previous (container id, cpu total ns, wall ns) per (consumer, cluster) for
        # CPU% deltas. Each consumer has its own window, so how often an API client
        # polls never shortens the window idle detection measures. Dropped on stop.
        self._cpu_samples: dict[tuple[StatsConsumer, str], tuple[str, int, int]] = {}

    def bind(self, owner: Ownership) -> None:
        """Act for installation ``owner`` (see :meth:`Engine.bind`)."""
        self.engine.bind(owner)

    def _name(self, cluster_id: str) -> str:
        return self.engine.owner.container(cluster_id)

    # -- Runtime protocol -------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        """What this engine supports, as far as known. GPU support is reported False on
        Podman (its compat API drops DeviceRequests) or when the engine is unreachable;
        limits are False once the engine has refused them."""
        limits = self.engine.limits_problem is None
        try:
            podman = self.engine.is_podman()
        except RuntimeFailure:
            return Capabilities(
                real_gpus=False,
                cpu_limits=limits,
                memory_limits=limits,
                stats=False,
                limits_problem=self.engine.limits_problem,
                disk_problem=self.engine.disk.container_problem,
            )
        return Capabilities(
            real_gpus=not podman,
            cpu_limits=limits,
            memory_limits=limits,
            stats=True,
            limits_problem=self.engine.limits_problem,
            disk_problem=self.engine.disk.problem(),
        )

    def available(self) -> str | None:
        """None when the engine answers a ping, else a message saying what to do."""
        return self.engine.ping()

    def heartbeat(self, timeout_s: float) -> str | None:
        """A ping through a client of its own whose requests give up after
        ``timeout_s`` (the engine's own client waits the long-operation timeout)."""
        with self._lock:
            pinger = self._pinger
            if pinger is self.engine:
                pass  # a stand-in client: nothing to make
            elif pinger is None or pinger.timeout_s != timeout_s:
                pinger = self._pinger = self.engine.with_timeout(timeout_s)
        return pinger.ping()

    def _saw_image(self, image: str) -> None:
        with self._lock:
            self._images_seen[image] = self._clock() + IMAGE_PRESENT_TTL_S

    def local_images(self) -> list[str]:
        with self.engine.errors("listing images"):
            found = self.engine.api.images()
        tags = {t for img in found for t in (img.get("RepoTags") or ()) if t and "<none>" not in t}
        return sorted(tags)

    def ensure_image(
        self,
        image: str,
        on_pull: Callable[[], None] | None = None,
        credentials: RegistryCredentials | None = None,
        fresh: bool = False,
    ) -> None:
        """Make ``image`` present locally: no-op if it is (unless ``fresh``: then the
        registry is asked again), else pull it (``on_pull`` is called first), with
        ``credentials`` as the engine's ``auth_config``. A
        ``localhost/...`` image is never pulled (it is built or loaded on the host).

        Raises :class:`RuntimeFailure` when it is absent and cannot be pulled. Its
        message gives the reason as one of runtimes/engines/pull_errors.py's fixed messages,
        never the engine's text, which names addresses and tells closed, open and HTTP
        ports apart; that text is logged at debug level only.
        """
        api = self.engine.api
        # A localhost/ image is never pulled: there is no registry to ask again.
        with contextlib.suppress(ValueError):
            fresh = fresh and not parse_image_ref(image).local_only
        if not fresh:
            with self._lock:
                if self._images_seen.get(image, 0.0) > self._clock():
                    return
            with self.engine.errors(f"inspecting image {image}"):
                try:
                    api.inspect_image(image)
                    self._saw_image(image)
                    return
                except docker.errors.ImageNotFound:
                    pass
        if on_pull is not None:
            on_pull()
        problem, detail = self._pull(image, credentials)
        if problem is None:
            with self.engine.errors(f"inspecting image {image}"):
                try:
                    api.inspect_image(image)
                    self._saw_image(image)
                    return
                except docker.errors.ImageNotFound:
                    problem = pull_errors.FAILED
                    detail = "the engine reported success but the image is still missing"
        log.debug("image %s could not be pulled: %s", image, detail)
        if fresh:
            # A private image: its registry decides at every start, whatever the host has.
            raise RuntimeFailure(
                f"image {image} could not be pulled: {problem}. Check the registry name "
                "and credentials.",
                {"image": image, "reason": problem},
            )
        raise RuntimeFailure(
            f"image {image} is not present on the engine and could not be pulled: "
            f"{problem}. Pull or build it on the host, or check the registry name "
            "and credentials.",
            {"image": image, "reason": problem},
        )

    def _pull(
        self, image: str, credentials: RegistryCredentials | None = None
    ) -> tuple[str | None, str]:
        """Pull ``image``: (None, "") when the engine reported success, else (the
        fixed user message, the engine's own text for the debug log)."""
        try:
            local = parse_image_ref(image).local_only
        except ValueError:
            local = False
        if local:
            return pull_errors.NOT_FOUND, "localhost/ images are never pulled"
        repo, tag = _split_image(image)
        problem: str | None = None
        detail = ""
        try:
            with self.engine.errors(f"pulling image {image}"):
                auth = credentials.auth_config() if credentials is not None else None
                events = self.engine.api.pull(
                    repo, tag=tag, stream=True, decode=True, auth_config=auth
                )
                for event in events:
                    if isinstance(event, dict) and event.get("error"):
                        detail = str(event["error"])
                        problem = pull_errors.user_message(detail)
        except RuntimeFailure as e:
            detail = e.message
            problem = pull_errors.from_exception(e)
        return problem, detail

    def ensure_volume(
        self, name: str, cluster_id: str | None = None, size_gb: int | None = None
    ) -> None:
        """Create our volume ``name`` if it does not exist; with ``size_gb`` a sized
        one, or grow it (see Runtime.ensure_volume, Engine.ensure_volume). Idempotent."""
        self.engine.ensure_volume(name, _volume_labels(cluster_id, size_gb))

    def ensure_account_network(self, account_id: int, *, fresh: bool = False) -> str:
        """Create account ``account_id``'s private network if it does not exist (see
        :meth:`Engine.ensure_network`: closed to every other network, NAT to the
        outside) and check its isolation rules. Returns its name.
        Idempotent, also under concurrent calls; ``fresh`` skips the recent-sighting
        cache. Raises RuntimeFailure (NotOurs for a network of that name not ours)."""
        name = self.engine.owner.account_network(account_id)
        with self._lock:
            self._networks_used[name] = self._clock()
            if not fresh and self._networks_seen.get(name, 0.0) > self._clock():
                return name
        self.engine.ensure_network(name, {LABEL_ACCOUNT: str(account_id)})
        with self._lock:
            self._networks_seen[name] = self._clock() + NETWORK_PRESENT_TTL_S
        return name

    def create(self, spec: ContainerSpec) -> str:
        """Create (not start) the cluster's container, first removing any container of
        ours with the same name. If the engine refuses CPU/memory limits or the
        container disk size, the create fails with a clear error, unless running
        without them is allowed (then they are dropped and :meth:`capabilities` says
        so). Returns the container id."""
        name = self._name(spec.cluster_id)
        with self._lock:
            self._specs[spec.cluster_id] = spec
            # The container start looked at is about to be replaced.
            self._just_started.pop(spec.cluster_id, None)
        if spec.replaces:
            self.engine.stop_and_remove(spec.replaces, timeout_s=10, legacy=True)
        if not spec.volume_name:
            return self._create_replacing(spec)
        labels = _volume_labels(spec.cluster_id, spec.volume_gb or None)
        if self._volume_seen(spec.volume_name):
            made = self._create_beside_volume_check(spec, labels)
            if made is not None:
                return made
        # Created with our labels (the engine would make an unlabelled one on mount,
        # which our volume listing would not see), sized, or grown to size. A new sized
        # volume's image (mkfs on the host, the slowest part of a first start) is made
        # while the container is created: only the container's start mounts it.
        ready = self.engine.prepare_volume(spec.volume_name, labels)
        try:
            container_id = self._create_replacing(spec)
        except BaseException:
            ready.settle()
            raise
        try:
            ready.wait()
        except RuntimeFailure:
            # The image could not be made: nothing may mount the volume. The container
            # goes first (a volume in use cannot be removed), then the volume.
            with contextlib.suppress(RuntimeFailure):
                self.engine.remove_container(name)
            ready.undo()
            raise
        with self._lock:
            self._volumes_seen[spec.volume_name] = self._clock() + VOLUME_SEEN_TTL_S
        return container_id

    def _volume_seen(self, volume: str) -> bool:
        with self._lock:
            return self._volumes_seen.get(volume, 0.0) > self._clock()

    def _create_beside_volume_check(
        self, spec: ContainerSpec, labels: dict[str, str] | None
    ) -> str | None:
        """Create the container while its volume, seen before, is checked (and grown
        to size): a restart's container needs nothing of the check, and the start,
        which mounts the volume, comes after both. Returns the container id; None when
        the volume turned out gone or bare (removed behind gpuyard's back): the
        container and whatever volume the engine made for its mount are removed, and
        the caller makes both the first-time way."""
        volume = str(spec.volume_name)
        checked = SideBySide(lambda: recheck_volume(self.engine, volume, labels), name="volume")
        try:
            container_id = self._create_replacing(spec)
        except BaseException:
            checked.settle()
            raise
        if checked.result():
            return container_id
        log.warning("volume %s of cluster %s is gone; making it again", volume, spec.cluster_id)
        with self._lock:
            self._volumes_seen.pop(volume, None)
        self.engine.remove_container(self._name(spec.cluster_id))
        remove_mount_made_volume(self.engine, volume)
        return None

    def _create_replacing(self, spec: ContainerSpec) -> str:
        """Create the container, replacing one of ours of the same name, dropping what
        the engine refused where that is allowed (see :meth:`create`)."""
        self.engine.disk.refuse_known(spec.container_disk_gb > 0)
        name = self._name(spec.cluster_id)
        try:
            # Optimistic: most creates have no predecessor, and a remove that finds
            # nothing still costs an engine round trip.
            try:
                return self._create(spec)
            except _NameInUse:
                self.engine.remove_container(name)
                return self._create(spec)
        except RuntimeFailure as e:
            self._without_refused(e, spec)
        # Each retry drops what the engine refused (limits, then the disk size, or the
        # other way round): at most two.
        for _ in range(2):
            self.engine.remove_container(name)
            try:
                return self._create(spec)
            except RuntimeFailure as e:
                self._without_refused(e, spec)
        raise RuntimeFailure(f"creating container for cluster {spec.cluster_id} kept failing")

    def _without_refused(self, e: RuntimeFailure, spec: ContainerSpec) -> None:
        """Return when ``e`` is the engine refusing limits or a disk size the operator
        allows going without (the next create leaves them out); else raise."""
        # Whether this create asked for a size: another create may have learnt the
        # refusal (and dropped sizes) while this one was on its way.
        if self.engine.disk.refused(e, spec.container_disk_gb > 0):
            if not self.engine.disk.allow:
                raise self.engine.disk.error() from e
            return
        if not self.engine.limits_refused(e, self._uses_limits(spec)):
            raise e
        if self.engine.apply_limits:
            raise self.engine.limits_error() from e

    def _uses_limits(self, spec: ContainerSpec) -> bool:
        return self.engine.apply_limits and (spec.cpu_cores > 0 or spec.memory_gb > 0)

    def _uses_disk_size(self, spec: ContainerSpec) -> bool:
        return self.engine.disk.apply_container_size and spec.container_disk_gb > 0

    def _create(self, spec: ContainerSpec) -> str:
        if spec.account_id is None:
            return self._create_once(spec)
        self.ensure_account_network(spec.account_id)
        try:
            return self._create_once(spec)
        except _NetworkGone:
            # Removed since it was last seen (by an operator, a purge): make it again.
            self.ensure_account_network(spec.account_id, fresh=True)
            return self._create_once(spec)

    def _create_once(self, spec: ContainerSpec) -> str:
        kwargs = self._create_kwargs(spec)
        with self.engine.errors(f"creating container for cluster {spec.cluster_id}"):
            try:
                container_id = create_container(self.engine.api, **kwargs)
            except docker.errors.APIError as e:
                if e.status_code == 409 or "already in use" in str(e):
                    raise _NameInUse() from e
                network = kwargs.get("network")
                if network and _says_network_gone(reason(e)):
                    with self._lock:
                        self._networks_seen.pop(str(network), None)
                    raise _NetworkGone() from e
                if isinstance(e, docker.errors.ImageNotFound):
                    with self._lock:
                        self._images_seen.pop(spec.image, None)
                    raise RuntimeFailure(
                        f"image {spec.image} is not present on the engine: {reason(e)}",
                        {"image": spec.image},
                    ) from e
                raise
            return container_id

    def _create_kwargs(self, spec: ContainerSpec) -> dict[str, Any]:
        # No host IP: both engines then bind every interface (what 0.0.0.0 means).
        # Passing "0.0.0.0" explicitly breaks Podman 4.3's compat API: its DNAT rule
        # then matches destination 0.0.0.0 and the port never answers. A loopback host
        # IP is named (a private port): only the host's own processes reach it.
        ports: dict[str, list[int | tuple[str, int]]] = {}
        for p in spec.ports:
            bound: int | tuple[str, int] = (
                (p.host_ip, p.external_port) if p.host_ip else p.external_port
            )
            ports.setdefault(f"{p.internal_port}/{p.protocol}", []).append(bound)
        kwargs: dict[str, Any] = {
            "image": spec.image,
            "name": self._name(spec.cluster_id),
            "hostname": spec.cluster_id,
            "environment": dict(spec.env),
            "labels": self.engine.labels({**spec.labels, LABEL_CLUSTER: spec.cluster_id}),
            "ports": ports,
            "detach": True,
        }
        if spec.account_id is not None:
            # Only this network: not also the engine's default one, where every other
            # container on the engine could reach it.
            kwargs["network"] = self.engine.owner.account_network(spec.account_id)
        if spec.command:
            kwargs["command"] = list(spec.command)
        if spec.entrypoint is not None:
            # An empty ENTRYPOINT is sent as [""]: Docker and Podman both read that as
            # "none" (Podman 4.3 reads [] as "the image's own").
            kwargs["entrypoint"] = list(spec.entrypoint) or [""]
        if spec.volume_name:
            kwargs["volumes"] = {spec.volume_name: {"bind": spec.volume_mount_path, "mode": "rw"}}
        if self.engine.apply_limits and spec.cpu_cores > 0:
            kwargs["nano_cpus"] = int(spec.cpu_cores * 1e9)
        if self.engine.apply_limits and spec.memory_gb > 0:
            kwargs["mem_limit"] = int(spec.memory_gb * 1024**3)
        if self._uses_disk_size(spec):
            # The writable layer's size: overlay on XFS with project quotas (Podman,
            # Docker); elsewhere the engine refuses it (see create).
            kwargs["storage_opt"] = {"size": f"{spec.container_disk_gb}G"}
        if spec.gpu_uuids:
            kwargs["device_requests"] = [
                docker.types.DeviceRequest(
                    driver="nvidia", device_ids=list(spec.gpu_uuids), capabilities=[["gpu"]]
                )
            ]
        return kwargs

    def start(self, cluster_id: str) -> None:
        """Start the created container. Idempotent: starting a running one is a no-op.
        Raises :class:`RuntimeFailure` when the container does not exist."""
        name = self._name(cluster_id)
        try:
            self._start(cluster_id, name)
        except RuntimeFailure as e:
            with self._lock:
                spec = self._specs.get(cluster_id)
            if spec is None:
                raise
            if spec.account_id is not None and _says_network_gone(e.message):
                # Removed between the create and the start (by an operator, or by the
                # unused-network clean-up racing the create): recreate the container,
                # which makes the network again.
                network = self.engine.owner.account_network(spec.account_id)
                with self._lock:
                    self._networks_seen.pop(network, None)
            elif not self.engine.limits_refused(e, self._uses_limits(spec)):
                raise
            elif self.engine.apply_limits:
                raise self.engine.limits_error() from e
            # (Limits: the OCI runtime refused one at start, and that is allowed: the
            # container is made again without them.)
            self.engine.remove_container(name)
            self._create(spec)
            self._start(cluster_id, name)
        # The engine may just have put its own accepting jumps above ours; they are
        # put back below before this returns (nothing is reported running before).
        # Meanwhile the container is looked at once, for the caller's first observe.
        guard = SideBySide(self.engine.keep_isolation_first, name="isolation")
        try:
            seen = self.observe(cluster_id)
        finally:
            guard.result()
        with self._lock:
            self._just_started[cluster_id] = (self._clock() + JUST_STARTED_S, seen)

    def _start(self, cluster_id: str, name: str) -> None:
        with self.engine.errors(f"starting cluster {cluster_id}"):
            try:
                self.engine.api.start(name)
            except docker.errors.NotFound as e:
                raise RuntimeFailure(
                    f"cluster {cluster_id} has no container to start; create it first",
                    {"cluster_id": cluster_id},
                ) from e

    def host_ports_in_use(self, low: int, high: int, cluster_id: str) -> frozenset[tuple[int, str]]:
        """See :meth:`Runtime.host_ports_in_use` (runtimes/hosts/ports.py)."""
        return ports_in_use(self.engine, low, high, self._name(cluster_id))

    def stop(self, cluster_id: str, timeout_s: int = 10) -> None:
        """Stop (SIGTERM, SIGKILL after ``timeout_s``) and remove the container, wiping
        the container disk; named volumes survive. A missing container is fine."""
        self.engine.stop_and_remove(self._name(cluster_id), timeout_s)
        with self._lock:
            self._specs.pop(cluster_id, None)
            self._just_started.pop(cluster_id, None)
            for consumer in ("view", "idle"):
                self._cpu_samples.pop((consumer, cluster_id), None)

    def halt(self, cluster_id: str, timeout_s: int = 10) -> None:
        """Stop the container but keep it (and its logs) until it is started again or
        removed. A missing container is fine."""
        name = self._name(cluster_id)
        with self._lock:
            self._just_started.pop(cluster_id, None)
        if self.engine.inspect_container(name) is None:
            return
        self.engine.stop_container(name, timeout_s)

    def remove_volume(self, name: str, *, legacy: bool = False) -> None:
        """Delete our named volume. A missing volume is fine; one still in use by a
        container raises :class:`RuntimeFailure`; somebody else's raises NotOurs."""
        with self._lock:
            self._volumes_seen.pop(name, None)
        self.engine.remove_volume(name, legacy=legacy)

    def observe(self, cluster_id: str) -> Observed:
        """The container's current state; MISSING when there is none. The first call
        within JUST_STARTED_S of :meth:`start` answers what start saw right after the
        container started (its readiness wait's first look)."""
        with self._lock:
            until, seen = self._just_started.pop(cluster_id, (0.0, None))
        if seen is not None and self._clock() < until:
            return seen
        return observed_of(self.engine.inspect_container(self._name(cluster_id)))

    def list_managed(self) -> list[ManagedContainer]:
        """Every cluster container of this installation, running or not (one call)."""
        out: list[ManagedContainer] = []
        for row in self.engine.list_containers(LABEL_CLUSTER):
            cluster_id = (row.get("Labels") or {}).get(LABEL_CLUSTER)
            if cluster_id:
                state = state_of(str(row.get("State", "")))
                out.append(ManagedContainer(str(cluster_id), str(row.get("Id")), state))
        return out

    def guard_networks(self) -> None:
        """Remove our unused account networks and re-apply the host rules that close the
        others (see Engine.guard_networks); a network a create used within
        ``network_in_use_grace_s`` is kept (its container may not be on it yet)."""
        self.engine.guard_networks(keep=self._network_recently_used)

    def _network_recently_used(self, name: str) -> bool:
        with self._lock:
            used = self._networks_used.get(name)
            if used is not None and self._clock() - used >= self.network_in_use_grace_s:
                del self._networks_used[name]
                used = None
        return used is not None

    def list_volumes(self) -> list[ManagedVolume]:
        """Every volume of this installation, with its size where the engine says."""
        return [
            ManagedVolume(
                name=v.name,
                cluster_id=v.labels.get(LABEL_CLUSTER),
                size_bytes=v.size_bytes,
                created_at=v.created_at,
            )
            for v in self.engine.list_volumes()
        ]

    def volume_usage(self) -> dict[str, int]:
        """Bytes used by each of our volumes (see Engine.volume_usage)."""
        return self.engine.volume_usage()

    def stats(self, cluster_id: str, consumer: StatsConsumer = "view") -> ContainerStats | None:
        """One-shot CPU% (100 = one core) and memory% of the limit; None unless running.

        CPU% is averaged since the previous call by the same ``consumer`` for this
        container, or since the container started on its first call.
        """
        observed = self.observe(cluster_id)
        if observed.state is not ContainerState.RUNNING or observed.container_id is None:
            return None
        cid = observed.container_id
        with self.engine.errors(f"reading stats of cluster {cluster_id}"):
            raw = self.engine.api.stats(cid, stream=False, one_shot=True)
        if not isinstance(raw, dict):
            return None
        cpu_total = int(
            ((raw.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage") or 0
        )
        now = parse_engine_time(raw.get("read")) or time.time_ns()
        with self._lock:
            prev = self._cpu_samples.get((consumer, cluster_id))
            self._cpu_samples[(consumer, cluster_id)] = (cid, cpu_total, now)
        # A sample of a previous container of the same cluster is not comparable.
        if prev is not None and prev[0] == cid and now > prev[2] and cpu_total >= prev[1]:
            cpu_percent = (cpu_total - prev[1]) / (now - prev[2]) * 100.0
        else:
            started = parse_engine_time(observed.started_at)
            elapsed = now - started if started else 0
            cpu_percent = cpu_total / elapsed * 100.0 if elapsed > 0 else 0.0
        mem = raw.get("memory_stats") or {}
        usage = int(mem.get("usage") or 0)
        detail = mem.get("stats") or {}
        # Like `docker stats`: page cache the kernel can drop is not "used".
        cache = detail.get("inactive_file", detail.get("total_inactive_file", 0))
        used = max(usage - int(cache or 0), 0)
        limit = int(mem.get("limit") or 0)
        mem_percent = used / limit * 100.0 if limit > 0 else 0.0
        return ContainerStats(
            cpu_percent=round(cpu_percent, 2),
            memory_percent=round(mem_percent, 2),
            memory_bytes=used,
        )

    def logs(self, cluster_id: str, tail: int = 200) -> str:
        """The last ``tail`` lines of stdout+stderr; empty when there is no container."""
        with self.engine.errors(f"reading logs of cluster {cluster_id}"):
            try:
                data = self.engine.api.logs(
                    self._name(cluster_id), stdout=True, stderr=True, tail=tail
                )
            except docker.errors.NotFound:
                return ""
        if isinstance(data, bytes):
            return data.decode("utf-8", errors="replace")
        return str(data)

    def log_lines(
        self,
        cluster_id: str,
        *,
        tail: int | None = None,
        since_ns: int | None = None,
        head: int | None = None,
    ) -> list[LogLine]:
        """Timestamped output (see Runtime.log_lines; runtimes/engines/logs.py)."""
        return engine_logs.read_lines(
            self.engine, self._name(cluster_id), tail=tail, since_ns=since_ns, head=head
        )

    def follow_log(self, cluster_id: str, *, since_ns: int | None = None) -> LogFollow:
        """Output as it is written (see Runtime.follow_log; runtimes/engines/logs.py)."""
        return engine_logs.EngineLogFollow(self.engine, self._name(cluster_id), since_ns)

    # -- the engine behind it (see Runtime) ------------------------------------------

    def close(self) -> None:
        """Nothing held beyond the SDK's client, which lives as long as the runtime."""

    def volume_io(self) -> VolumeIO:
        """Tar streams through the engine's archive API (runtimes/engines/volumes.py)."""
        return EngineVolumeIO(self.engine, self.name)

    def exec_endpoint(self) -> ExecEndpoint:
        """The engine's own URL and TLS context (runtimes/engines/exec_endpoint.py)."""
        return engine_exec_endpoint(self.engine)

    def docker_engine(self) -> Engine:
        return self.engine

    def inventory(self) -> EngineInventory:
        """What this machine has, as far as the engine says (no host commands: this
        machine's GPUs and disk are found at start)."""
        return discover_inventory(self.engine, None)


def _volume_labels(cluster_id: str | None, size_gb: int | None) -> dict[str, str] | None:
    """The labels of a cluster's volume: its cluster, and its size when it has one."""
    labels = {LABEL_CLUSTER: cluster_id} if cluster_id else {}
    if size_gb:
        labels[LABEL_SIZE] = str(size_gb * GIB)
    return labels or None


def _split_image(image: str) -> tuple[str, str | None]:
    """``repo[:tag][@digest]`` -> (repo, tag or digest). A colon in a registry host
    (``host:5000/x``) is not a tag separator."""
    if "@" in image:
        repo, digest = image.split("@", 1)
        return repo, digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon + 1 :]
    return image, "latest"
