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
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import docker
import docker.errors
import docker.types
import requests

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.base import (
    LABEL_CLUSTER,
    LABEL_MANAGED,
    Capabilities,
    ContainerSpec,
    ContainerState,
    ContainerStats,
    ManagedContainer,
    Observed,
    container_name,
)

_ZERO_TIME_PREFIX = "0001-01-01"
_RUNNING_STATES = {"running", "paused", "restarting"}
_CREATED_STATES = {"created", "configured", "initialized"}
# Engine error texts that mean "this host cannot apply a CPU/memory limit" (cgroup
# controllers missing or not delegated, e.g. rootless on cgroup v1).
_LIMIT_ERROR_MARKERS = (
    "cgroup",
    "cpu.cfs",
    "cpu quota",
    "nanocpus",
    "memory limit",
    "memory.limit",
    "kernel does not support",
    "not supported",
)


def _now_ns() -> int:
    return time.time_ns()


def _parse_engine_time(value: str | None) -> int | None:
    """Engine timestamps (RFC 3339 with up to 9 fractional digits) as epoch ns."""
    if not value or value.startswith(_ZERO_TIME_PREFIX):
        return None
    text = value.strip().replace("Z", "+00:00")
    frac = ""
    if "." in text:
        head, rest = text.split(".", 1)
        digits = ""
        i = 0
        while i < len(rest) and rest[i].isdigit():
            digits += rest[i]
            i += 1
        tz = rest[i:]
        frac = digits[:9].ljust(9, "0")
        text = head + tz
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    return int(dt.timestamp()) * 1_000_000_000 + (int(frac) if frac else 0)


def _reason(e: BaseException) -> str:
    """The engine's own explanation when there is one, else the exception text."""
    if isinstance(e, docker.errors.APIError):
        explanation = getattr(e, "explanation", None)
        if explanation:
            return str(explanation)
    return str(e) or type(e).__name__


IMAGE_PRESENT_TTL_S = 30.0


class _NameInUse(Exception):
    """The cluster's container name is taken by a previous container."""


class DockerEngineRuntime:
    """Runtime over a Docker Engine API URL (``unix://``, ``tcp://``, ``ssh://``).

    The SDK client is created on first use, so constructing this object never touches
    the engine and a server can start with no engine present. Thread-safe: the SDK's
    ``requests`` session is shared, and the little state kept here is behind a lock.
    """

    name = "docker-engine"

    def __init__(self, base_url: str | None, timeout_s: float = 60.0) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        # Separate from _lock: creating the client talks to the engine (up to the
        # timeout), which must not stall calls that only touch local state.
        self._client_lock = threading.Lock()
        self._client_obj: Any = None
        self._is_podman: bool | None = None
        # Flipped off the first time the engine refuses a limit; never flipped back,
        # because the host's cgroup setup does not change under a running server.
        self._cpu_limits = True
        self._memory_limits = True
        # The last spec created per cluster, so start() can recreate without limits if
        # the OCI runtime only rejects them when the container starts.
        self._specs: dict[str, ContainerSpec] = {}
        # Images known present, until the given monotonic time: an inspect per start
        # is a round trip on the start path. An image removed meanwhile makes create
        # fail with a clear error and is forgotten, so the next start pulls it.
        self._images_seen: dict[str, float] = {}
        # Previous (container id, cpu total ns, wall ns) per cluster for CPU% deltas;
        # dropped on stop so the map stays as large as the set of live clusters.
        self._cpu_samples: dict[str, tuple[str, int, int]] = {}

    # -- plumbing -------------------------------------------------------------------

    @property
    def _where(self) -> str:
        return self.base_url or "the default Docker socket"

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Translate every engine/transport failure inside the block to RuntimeFailure."""
        try:
            yield
        except RuntimeFailure:
            raise
        except (requests.exceptions.ConnectionError, ConnectionError) as e:
            raise RuntimeFailure(self._unreachable(e), {"action": action}) from e
        except docker.errors.DockerException as e:
            text = _reason(e)
            if "Error while fetching server API version" in text:
                raise RuntimeFailure(self._unreachable(e), {"action": action}) from e
            raise RuntimeFailure(f"{action} failed: {text}", {"action": action}) from e
        except (requests.exceptions.RequestException, OSError, ValueError, KeyError) as e:
            # ValueError covers JSON decode errors from empty or garbled engine replies.
            raise RuntimeFailure(f"{action} failed: {_reason(e)}", {"action": action}) from e

    def _unreachable(self, e: BaseException) -> str:
        return (
            f"no container engine reachable at {self._where}: install podman "
            f"(apt-get install podman) or Docker and start it, or set the engine URL "
            f"({type(e).__name__}: {str(e)[:200]})"
        )

    def _client(self) -> Any:
        """The SDK client, created on first use. A failed creation is not cached, so an
        engine started later is picked up by the next call."""
        with self._client_lock:
            if self._client_obj is None:
                with self._errors("connecting to the container engine"):
                    # version="auto" negotiates with the engine: pinning would break on
                    # Docker releases that raised their minimum API version.
                    self._client_obj = docker.DockerClient(
                        base_url=self.base_url, version="auto", timeout=self.timeout_s
                    )
            return self._client_obj

    def _engine_is_podman(self) -> bool:
        if self._is_podman is None:
            with self._errors("querying the engine version"):
                version = self._client().version()
            components = version.get("Components") or []
            self._is_podman = any("podman" in str(c.get("Name", "")).lower() for c in components)
        return self._is_podman

    # -- Runtime protocol -------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        """What this engine supports, as far as known. GPU support is reported False on
        Podman (its compat API drops DeviceRequests) or when the engine is unreachable."""
        try:
            podman = self._engine_is_podman()
        except RuntimeFailure:
            return Capabilities(
                real_gpus=False,
                cpu_limits=self._cpu_limits,
                memory_limits=self._memory_limits,
                stats=False,
            )
        return Capabilities(
            real_gpus=not podman,
            cpu_limits=self._cpu_limits,
            memory_limits=self._memory_limits,
            stats=True,
        )

    def available(self) -> str | None:
        """None when the engine answers a ping, else a message saying what to do."""
        try:
            client = self._client()
            with self._errors("ping"):
                client.ping()
        except RuntimeFailure as e:
            return e.message
        return None

    def _saw_image(self, image: str) -> None:
        with self._lock:
            self._images_seen[image] = time.monotonic() + IMAGE_PRESENT_TTL_S

    def ensure_image(self, image: str) -> None:
        """Make ``image`` present locally: no-op if it is, else pull it.

        Raises :class:`RuntimeFailure` (with the engine's reason) when it is absent and
        cannot be pulled.
        """
        with self._lock:
            if self._images_seen.get(image, 0.0) > time.monotonic():
                return
        client = self._client()
        with self._errors(f"inspecting image {image}"):
            try:
                client.api.inspect_image(image)
                self._saw_image(image)
                return
            except docker.errors.ImageNotFound:
                pass
        repo, tag = _split_image(image)
        error: str | None = None
        try:
            with self._errors(f"pulling image {image}"):
                for event in client.api.pull(repo, tag=tag, stream=True, decode=True):
                    if isinstance(event, dict) and event.get("error"):
                        error = str(event["error"])
        except RuntimeFailure as e:
            error = e.message
        if error is None:
            with self._errors(f"inspecting image {image}"):
                try:
                    client.api.inspect_image(image)
                    self._saw_image(image)
                    return
                except docker.errors.ImageNotFound:
                    error = "the engine reported success but the image is still missing"
        raise RuntimeFailure(
            f"image {image} is not present on the engine and could not be pulled: "
            f"{error[:300]}. Pull or build it on the host, or check the registry name "
            "and credentials.",
            {"image": image},
        )

    def ensure_volume(self, name: str) -> None:
        """Create the named volume if it does not exist. Idempotent."""
        client = self._client()
        with self._errors(f"creating volume {name}"):
            try:
                client.api.inspect_volume(name)
            except docker.errors.NotFound:
                client.api.create_volume(name=name, labels={LABEL_MANAGED: "true"})

    def create(self, spec: ContainerSpec) -> str:
        """Create (not start) the cluster's container, first removing any container with
        the same name. Limits the engine refuses are dropped and reported through
        :meth:`capabilities`. Returns the container id."""
        client = self._client()
        name = container_name(spec.cluster_id)
        with self._lock:
            self._specs[spec.cluster_id] = spec
        try:
            # Optimistic: most creates have no predecessor, and a remove that finds
            # nothing still costs an engine round trip. The named volume is created
            # by the engine on mount if ensure_volume was not called.
            try:
                return self._create(client, spec)
            except _NameInUse:
                self._remove_container(name)
                return self._create(client, spec)
        except RuntimeFailure as e:
            if not self._degrade_limits(spec, e):
                raise
        self._remove_container(name)
        return self._create(client, spec)

    def _create(self, client: Any, spec: ContainerSpec) -> str:
        kwargs = self._create_kwargs(spec)
        with self._errors(f"creating container for cluster {spec.cluster_id}"):
            try:
                container = client.containers.create(**kwargs)
            except docker.errors.APIError as e:
                if e.status_code == 409 or "already in use" in str(e):
                    raise _NameInUse() from e
                if isinstance(e, docker.errors.ImageNotFound):
                    with self._lock:
                        self._images_seen.pop(spec.image, None)
                    raise RuntimeFailure(
                        f"image {spec.image} is not present on the engine: {_reason(e)}",
                        {"image": spec.image},
                    ) from e
                raise
            return str(container.id)

    def _create_kwargs(self, spec: ContainerSpec) -> dict[str, Any]:
        # No host IP: both engines then bind every interface (what 0.0.0.0 means).
        # Passing "0.0.0.0" explicitly breaks Podman 4.3's compat API: its DNAT rule
        # then matches destination 0.0.0.0 and the port never answers.
        ports: dict[str, list[int]] = {}
        for p in spec.ports:
            ports.setdefault(f"{p.internal_port}/{p.protocol}", []).append(p.external_port)
        labels = {**spec.labels, LABEL_CLUSTER: spec.cluster_id, LABEL_MANAGED: "true"}
        kwargs: dict[str, Any] = {
            "image": spec.image,
            "name": container_name(spec.cluster_id),
            "hostname": spec.cluster_id,
            "environment": dict(spec.env),
            "labels": labels,
            "ports": ports,
            "detach": True,
        }
        if spec.command:
            kwargs["command"] = list(spec.command)
        if spec.volume_name:
            kwargs["volumes"] = {spec.volume_name: {"bind": spec.volume_mount_path, "mode": "rw"}}
        if self._cpu_limits and spec.cpu_cores > 0:
            kwargs["nano_cpus"] = int(spec.cpu_cores * 1e9)
        if self._memory_limits and spec.memory_gb > 0:
            kwargs["mem_limit"] = int(spec.memory_gb * 1024**3)
        if spec.gpu_uuids:
            kwargs["device_requests"] = [
                docker.types.DeviceRequest(
                    driver="nvidia", device_ids=list(spec.gpu_uuids), capabilities=[["gpu"]]
                )
            ]
        return kwargs

    def _degrade_limits(self, spec: ContainerSpec, e: RuntimeFailure) -> bool:
        """Turn off the limit(s) an engine error blames; True if a retry makes sense."""
        uses_cpu = self._cpu_limits and spec.cpu_cores > 0
        uses_mem = self._memory_limits and spec.memory_gb > 0
        text = e.message.lower()
        if not (uses_cpu or uses_mem) or not any(m in text for m in _LIMIT_ERROR_MARKERS):
            return False
        blames_cpu = "cpu" in text
        blames_mem = "memory" in text or "mem" in text
        with self._lock:
            # If the message does not say which, drop both rather than retry forever.
            if blames_cpu or not blames_mem:
                self._cpu_limits = False
            if blames_mem or not blames_cpu:
                self._memory_limits = False
        return True

    def start(self, cluster_id: str) -> None:
        """Start the created container. Idempotent: starting a running one is a no-op.
        Raises :class:`RuntimeFailure` when the container does not exist."""
        client = self._client()
        name = container_name(cluster_id)
        try:
            self._start(client, cluster_id, name)
        except RuntimeFailure as e:
            with self._lock:
                spec = self._specs.get(cluster_id)
            if spec is None or not self._degrade_limits(spec, e):
                raise
            # The OCI runtime refused a limit at start: recreate without it.
            self._remove_container(name)
            self._create(client, spec)
            self._start(client, cluster_id, name)

    def _start(self, client: Any, cluster_id: str, name: str) -> None:
        with self._errors(f"starting cluster {cluster_id}"):
            try:
                client.api.start(name)
            except docker.errors.NotFound as e:
                raise RuntimeFailure(
                    f"cluster {cluster_id} has no container to start; create it first",
                    {"cluster_id": cluster_id},
                ) from e

    def stop(self, cluster_id: str, timeout_s: int = 10) -> None:
        """Stop (SIGTERM, SIGKILL after ``timeout_s``) and remove the container, wiping
        the container disk; named volumes survive. A missing container is fine."""
        client = self._client()
        name = container_name(cluster_id)
        with (
            self._errors(f"stopping cluster {cluster_id}"),
            contextlib.suppress(docker.errors.NotFound),
        ):
            client.api.stop(name, timeout=timeout_s)
        self._remove_container(name)
        with self._lock:
            self._specs.pop(cluster_id, None)
            self._cpu_samples.pop(cluster_id, None)

    def _remove_container(self, name: str) -> None:
        client = self._client()
        with self._errors(f"removing container {name}"):
            try:
                # v=True drops anonymous volumes an image declares; named ones stay.
                client.api.remove_container(name, v=True, force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                # Another caller is already removing it: the outcome is the same.
                if "already in progress" not in _reason(e):
                    raise

    def remove_volume(self, name: str) -> None:
        """Delete the named volume. A missing volume is fine; one still in use by a
        container raises :class:`RuntimeFailure`."""
        client = self._client()
        with self._errors(f"removing volume {name}"), contextlib.suppress(docker.errors.NotFound):
            client.api.remove_volume(name)

    def observe(self, cluster_id: str) -> Observed:
        """The container's current state; MISSING when there is none."""
        client = self._client()
        with self._errors(f"inspecting cluster {cluster_id}"):
            try:
                info = client.api.inspect_container(container_name(cluster_id))
            except docker.errors.NotFound:
                return Observed(state=ContainerState.MISSING)
        state = info.get("State") or {}
        status = str(state.get("Status", "")).lower()
        if status in _RUNNING_STATES:
            cstate = ContainerState.RUNNING
        elif status in _CREATED_STATES:
            cstate = ContainerState.CREATED
        else:
            cstate = ContainerState.EXITED
        error = state.get("Error") or None
        if state.get("OOMKilled"):
            error = "out of memory: the container was OOM-killed"
        started = state.get("StartedAt")
        started_at = str(started) if started and not str(started).startswith("0001") else None
        exit_code = state.get("ExitCode") if cstate is ContainerState.EXITED else None
        return Observed(
            state=cstate,
            container_id=info.get("Id"),
            exit_code=int(exit_code) if exit_code is not None else None,
            error=str(error) if error else None,
            started_at=started_at,
        )

    def list_managed(self) -> list[ManagedContainer]:
        """Every container labelled as managed by gpuyard, running or not (one call)."""
        client = self._client()
        with self._errors("listing managed containers"):
            rows = client.api.containers(all=True, filters={"label": LABEL_MANAGED})
        out: list[ManagedContainer] = []
        for row in rows:
            labels = row.get("Labels") or {}
            cluster_id = labels.get(LABEL_CLUSTER)
            if not cluster_id:
                continue
            status = str(row.get("State", "")).lower()
            if status in _RUNNING_STATES:
                cstate = ContainerState.RUNNING
            elif status in _CREATED_STATES:
                cstate = ContainerState.CREATED
            else:
                cstate = ContainerState.EXITED
            out.append(ManagedContainer(str(cluster_id), str(row.get("Id")), cstate))
        return out

    def stats(self, cluster_id: str) -> ContainerStats | None:
        """One-shot CPU% (100 = one core) and memory% of the limit; None unless running.

        CPU% is averaged since the previous call for this container, or since the
        container started on the first call.
        """
        observed = self.observe(cluster_id)
        if observed.state is not ContainerState.RUNNING or observed.container_id is None:
            return None
        client = self._client()
        cid = observed.container_id
        with self._errors(f"reading stats of cluster {cluster_id}"):
            raw = client.api.stats(cid, stream=False, one_shot=True)
        if not isinstance(raw, dict):
            return None
        cpu_total = int(
            ((raw.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage") or 0
        )
        now = _parse_engine_time(raw.get("read")) or _now_ns()
        with self._lock:
            prev = self._cpu_samples.get(cluster_id)
            self._cpu_samples[cluster_id] = (cid, cpu_total, now)
        # A sample of a previous container of the same cluster is not comparable.
        if prev is not None and prev[0] == cid and now > prev[2] and cpu_total >= prev[1]:
            cpu_percent = (cpu_total - prev[1]) / (now - prev[2]) * 100.0
        else:
            started = _parse_engine_time(observed.started_at)
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
        client = self._client()
        with self._errors(f"reading logs of cluster {cluster_id}"):
            try:
                data = client.api.logs(
                    container_name(cluster_id), stdout=True, stderr=True, tail=tail
                )
            except docker.errors.NotFound:
                return ""
        if isinstance(data, bytes):
            return data.decode("utf-8", errors="replace")
        return str(data)


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
