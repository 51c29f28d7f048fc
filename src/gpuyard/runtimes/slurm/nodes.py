"""Slurm node containers (controller and workers) over the Docker Engine API.

The building blocks a training-cluster service composes: one private bridge network per
cluster (with DNS, so nodes resolve each other by container name), one controller
container running ``slurmctld`` with its state on a named volume, and worker containers
that join as Slurm dynamic nodes. The image is
:data:`gpuyard.runtimes.slurm.image.SLURM_IMAGE`; the files each node needs are
rendered by :mod:`gpuyard.runtimes.slurm.config` and handed to :meth:`create_node`.

Every public method turns engine and transport errors into :class:`RuntimeFailure`.
Measured against Podman 4.3.1 (rootful, netavark + aardvark-dns):

- a restarted container gets a new IP on its network. Workers' IPs may change: the node
  entrypoint re-addresses its Slurm node before ``slurmd`` registers (Slurm 22.05 keeps
  a dynamic node's first address). The controller gets a fixed IP (the subnet's last
  host), pinned in every worker's /etc/hosts, so Slurm traffic never needs DNS;
- aardvark-dns, shared by all containers on the host, can stop answering for up to
  ~10 s while any container starts or stops; slurmd then stalled 20-40 s resolving the
  controller and jobs finished late, which the pin avoids;
- the compat API stores ``StopTimeout`` 0 unless given, so ``podman stop`` SIGKILLed
  slurmctld before it saved state (finished jobs came back running): it is set to 10 s;
- the host routes to container IPs on the cluster network, so :meth:`node_address`
  is directly reachable from the host (SSH on port 22);
- ``put_archive`` works on a created (not yet started) container.
"""

from __future__ import annotations

import dataclasses
import io
import ipaddress
import posixpath
import re
import secrets
import shlex
import socket
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import docker
import docker.errors

from gpuyard.core.errors import RuntimeFailure, ValidationFailed
from gpuyard.core.ownership import Ownership
from gpuyard.core.training import network as training_network
from gpuyard.core.training.clusters import LIFECYCLE_RC
from gpuyard.runtimes.engines.engine import DEFAULT_POLICY, Engine, EnginePolicy
from gpuyard.runtimes.engines.exec_output import run_keeping_output
from gpuyard.runtimes.engines.url import detect_engine_url
from gpuyard.runtimes.hosts.firewall import Runner
from gpuyard.runtimes.slurm.config import (
    CONFIG_DIR,
    STATE_DIR,
    valid_node_name,
    worker_conf_arg,
)
from gpuyard.runtimes.slurm.node_image_copy import Progress, ensure_node_image, forget_node_image
from gpuyard.runtimes.slurm.overlay import (
    OVERLAY_MTU,
    OverlaySpec,
    attach_script,
    detach_script,
    run_script,
)

LABEL_SLURM_ROLE = "gpuyard.slurm.role"
# On a controller created with a fixed address: that address (workers pin it).
LABEL_CONTROLLER_ADDRESS = "gpuyard.slurm.controller_address"
NodeRole = Literal["controller", "worker"]
NodeState = Literal["missing", "created", "running", "exited"]

_RUNNING_STATES = {"running", "paused", "restarting"}
_CREATED_STATES = {"created", "configured", "initialized"}
# sinfo %T states of a worker that is up: its slurmd has registered and answers. A
# drained (or draining) one is up too: someone chose to keep work off it, and it
# stays that way.
READY_STATES = frozenset(
    {"idle", "allocated", "mixed", "alloc", "mix", "drained", "draining", "drain"}
)
# Docker allows fixed IPs only on networks created with an explicit subnet.
_FIXED_IP_REFUSED_MARKERS = ("user configured subnets", "user specified ip address")
# How engines say a create named an image they do not hold (Docker, Podman).
_NO_IMAGE_MARKERS = ("no such image", "image not known", "not found")
STOP_TIMEOUT_S = 10
_SHM_MIN_BYTES = 64 * 1024**2
_SHM_MAX_BYTES = 16 * 1024**3


@dataclass(frozen=True)
class NodeSpec:
    """One Slurm node container.

    ``name`` is the container name, hostname, network alias and Slurm NodeName at once,
    so it must be DNS-safe (see :func:`slurm_config.valid_node_name`). ``state_volume``
    (controller only) is a named volume mounted at the Slurm state dir, so queued and
    running jobs survive a controller restart or re-creation.
    """

    name: str
    role: NodeRole
    image: str
    network: str
    cpus: int
    memory_gb: int
    gpu_count: int
    gpu_indices: tuple[int, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    state_volume: str | None = None
    # Its fixed IPv4 on ``network`` (None: chosen as before clusters spanned hosts), and
    # the /etc/hosts entries (name -> address) of the cluster's nodes it starts with.
    address: str | None = None
    hosts: dict[str, str] = field(default_factory=dict)


def _tar(files: Mapping[str, tuple[bytes, int]]) -> bytes:
    """An uncompressed tar of ``files`` (relative path -> (content, mode)), root-owned."""
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs: set[str] = set()
        for rel in sorted(files):
            parent = posixpath.dirname(rel)
            while parent and parent not in dirs:
                dirs.add(parent)
                parent = posixpath.dirname(parent)
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            info.mtime = now
            tar.addfile(info)
        for rel, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = mode
            info.mtime = now
            info.uid = info.gid = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _relative(path: str) -> str:
    """A file key for :meth:`SlurmNodeRuntime.put_files` as a path under CONFIG_DIR."""
    norm = posixpath.normpath(path)
    if norm.startswith(CONFIG_DIR + "/"):
        norm = norm[len(CONFIG_DIR) + 1 :]
    if norm.startswith("/") or norm == "." or norm.split("/")[0] == "..":
        raise ValidationFailed("files", f"{path!r} is not a path under {CONFIG_DIR}/")
    return norm


class SlurmNodeRuntime:
    """Creates, inspects and drives Slurm node containers on one engine.

    ``base_url`` None means: the engine found by
    :func:`gpuyard.runtimes.engines.url.detect_engine_url` (``DOCKER_HOST``, then the
    well-known Podman and Docker sockets). The SDK client is created on first use.
    Thread-safe. ``timeout_s`` bounds every engine request, so an :meth:`exec` must
    finish well within it.

    ``engine``: drive this engine instead (a fleet host's, runtimes/hosts/runtimes.py:
    its SSH tunnel or TLS, its firewall and the installation's labels come with it;
    reached with ``timeout_s`` when that is longer than the engine's own timeout);
    ``base_url`` and ``policy`` are then unused. ``image_source``: the engine the node
    image is built on (this machine's); a node image this runtime's engine lacks is
    copied from there before a node is created (runtimes/slurm/node_image_copy.py). None:
    the image must already be on the engine, as on this machine.
    """

    def __init__(
        self,
        base_url: str | None,
        timeout_s: float = 60.0,
        owner: Ownership | None = None,
        *,
        policy: EnginePolicy = DEFAULT_POLICY,
        engine: Engine | None = None,
        image_source: Engine | None = None,
    ) -> None:
        if engine is None:
            engine = Engine(detect_engine_url(base_url), timeout_s, owner, policy=policy)
        else:
            if engine.timeout_s < timeout_s:
                # A host's engine answers within its (short) remote timeout; a command
                # in a node may be silent longer (exec's timeout_s must stay below).
                engine = engine.with_timeout(timeout_s)
            if owner is not None:
                engine.bind(owner)
            base_url = engine.base_url
        self.base_url = base_url
        self.timeout_s = engine.timeout_s
        self.engine = engine
        self.image_source = image_source
        self._errors = self.engine.errors

    def bind(self, owner: Ownership) -> None:
        """Act for installation ``owner`` (see :meth:`Engine.bind`)."""
        self.engine.bind(owner)

    def _client(self) -> Any:
        return self.engine.client()

    def _inspect(self, name: str) -> dict[str, Any] | None:
        return self.engine.inspect_container(name, legacy=_legacy(name))

    # -- the node image ---------------------------------------------------------------

    def ensure_image(self, image: str, progress: Progress | None = None) -> bool:
        """Make sure the engine holds ``image``, copying it from :attr:`image_source`
        when it lacks it (once per engine and image version); True when it was copied
        now. ``progress`` is told how far a copy is. A no-op without an image source.
        Raises RuntimeFailure when the copy fails."""
        if self.image_source is None:
            return False
        return ensure_node_image(self.engine, self.image_source, image, progress)

    # -- networks and volumes ---------------------------------------------------------

    def ensure_network(self, name: str, subnet: str | None = None) -> None:
        """Create the cluster's bridge network (DNS on: nodes resolve each other by
        container name) if missing. Idempotent, also under concurrent calls.
        ``subnet``: the cluster's own subnet (core/training/network.py), with this
        host's gateway on its first address and room for the overlay's header in its
        MTU; None: the engine picks one (a cluster made before clusters spanned hosts)."""
        if subnet is None:
            self.engine.ensure_network(name, legacy=_legacy(name))
            return
        self.engine.ensure_network(
            name,
            legacy=_legacy(name),
            subnet=subnet,
            gateway=training_network.gateway(subnet),
            mtu=OVERLAY_MTU,
        )

    def attach_overlay(self, spec: OverlaySpec) -> None:
        """Join this host's copy of the cluster network to the other hosts' (see
        runtimes/slurm/overlay.py). Idempotent. Raises RuntimeFailure when no command can be
        run on the host (a tcp:// engine) or the host refuses."""
        resolved = dataclasses.replace(
            spec, local=_ipv4_of(spec.local), peers=tuple(_ipv4_of(p) for p in spec.peers)
        )
        run_script(
            self._host_runner(), attach_script(resolved), f"joining {spec.network} across hosts"
        )

    def detach_overlay(self, network: str) -> None:
        """Remove the cluster's overlay from this host. Idempotent; a host where no
        command can be run has none to remove."""
        runner = self.engine.host_runner
        if runner is not None:
            run_script(runner, detach_script(network), f"removing the overlay of {network}")

    def _host_runner(self) -> Runner:
        runner = self.engine.host_runner
        if runner is None:
            raise RuntimeFailure(
                "no command can be run on this host (its engine is reached over tcp://), "
                "so its nodes cannot join a network that spans hosts"
            )
        return runner

    def set_hosts(self, name: str, entries: Mapping[str, str]) -> None:
        """Make ``entries`` (node name -> address) the node's gpuyard block of
        /etc/hosts, so every node resolves every other by name wherever it runs (the
        engine's DNS answers only for containers on the same host). Idempotent; the
        rest of the file is kept. Raises RuntimeFailure when the node does not run."""
        for address in entries.values():
            ipaddress.ip_address(address)
        for host in entries:
            if not valid_node_name(host):
                raise ValidationFailed("name", f"node name {host!r} is not DNS-safe")
        block = "".join(f"{a} {n}\n" for n, a in sorted(entries.items()))
        script = (
            "set -e; f=/etc/hosts; t=$(mktemp); "
            f"sed '/^# gpuyard nodes$/,/^# gpuyard nodes end$/d' $f > $t; "
            f"printf '# gpuyard nodes\\n%s# gpuyard nodes end\\n' {shlex.quote(block)} >> $t; "
            "cat $t > $f; rm -f $t"
        )
        code, out = self.exec(name, ["sh", "-c", script])
        if code != 0:
            raise RuntimeFailure(
                f"writing /etc/hosts on node {name} failed (exit {code}): {out[-300:]}",
                {"node": name},
            )

    def remove_network(self, name: str) -> None:
        """Delete the network. Idempotent; raises RuntimeFailure while nodes use it."""
        self.engine.remove_network(name, legacy=_legacy(name))

    def remove_volume(self, name: str) -> None:
        """Delete a named volume. Idempotent; raises RuntimeFailure while one is using it."""
        self.engine.remove_volume(name, legacy=_legacy(name))

    # -- nodes ----------------------------------------------------------------------

    def create_node(self, spec: NodeSpec, files: Mapping[str, tuple[bytes, int]]) -> str:
        """Create and start the node's container; returns its id.

        Idempotent on ``spec.name`` by replacement: an existing container with that name
        is removed first (its Slurm state survives: the controller's is on
        ``state_volume``, and a worker re-registers under the same name). ``files``
        maps paths under ``/etc/gpuyard/`` to (content, mode); they are copied in before
        the container starts, and the entrypoint installs ``munge.key`` (required),
        ``slurm.conf`` (required), ``gres.conf``, ``authorized_keys`` and runs
        ``lifecycle.sh`` once. The network must exist (:meth:`ensure_network`). CPU and
        memory limits the engine refuses are dropped, as the docker-engine runtime does.

        A controller gets a fixed IPv4 (the subnet's last host; the same one when it is
        re-created). A worker pins the controller named in its ``slurm.conf`` to that
        address in /etc/hosts, so create the controller first: a worker created while
        no controller container exists falls back to DNS.

        Raises ValidationFailed for a name that is not DNS-safe, RuntimeFailure for
        engine failures (e.g. a missing image or network).
        """
        if not valid_node_name(spec.name):
            raise ValidationFailed(
                "name",
                f"node name {spec.name!r} must be lowercase letters, digits and inner "
                "hyphens, at most 63 characters",
            )
        archive = _tar({_relative(p): v for p, v in files.items()})
        self.ensure_image(spec.image)
        self.remove_node(spec.name)
        if spec.state_volume:
            # Made with our labels now (the engine would make an unlabelled one on mount).
            self.engine.ensure_volume(spec.state_volume)
        if spec.address is not None:
            fixed: str | None = spec.address
            pins = {n: a for n, a in spec.hosts.items() if n != spec.name}
        else:
            fixed = (
                self._fixed_controller_address(spec.network) if spec.role == "controller" else None
            )
            pins = self._controller_pin(spec, files) if spec.role == "worker" else {}
        for _ in range(3):
            try:
                return self._create_and_start(spec, archive, fixed, pins)
            except RuntimeFailure as e:
                # A container that was created but failed to start must not linger.
                self.remove_node(spec.name)
                text = e.message.lower()
                if self.image_source is not None and any(m in text for m in _NO_IMAGE_MARKERS):
                    # Removed from the host behind our back: the next create copies it.
                    forget_node_image(self.engine, spec.image)
                if fixed and any(m in text for m in _FIXED_IP_REFUSED_MARKERS):
                    fixed = None  # Docker: no fixed IPs on auto-subnet networks; use DNS.
                    continue
                uses_limits = self.engine.apply_limits and (spec.cpus > 0 or spec.memory_gb > 0)
                if not self.engine.limits_refused(e, uses_limits):
                    raise
                if self.engine.apply_limits:
                    raise self.engine.limits_error() from e
        raise RuntimeFailure(f"creating node {spec.name} failed repeatedly", {"node": spec.name})

    def _fixed_controller_address(self, network: str) -> str | None:
        """The controller's fixed IPv4 on ``network``: the subnet's last usable host
        (the gateway is usually the first). Far from where sequential IP allocation
        starts, so no worker holds it in practice. None when the network has no IPv4
        subnet the engine reports."""
        with self._errors(f"inspecting network {network}"):
            try:
                info = self._client().api.inspect_network(network)
            except docker.errors.NotFound as e:
                raise RuntimeFailure(
                    f"network {network} does not exist; call ensure_network first",
                    {"network": network},
                ) from e
        for cfg in (info.get("IPAM") or {}).get("Config") or []:
            try:
                subnet = ipaddress.ip_network(str(cfg.get("Subnet")), strict=False)
            except ValueError:
                continue
            if subnet.version != 4 or subnet.num_addresses < 8:
                continue
            candidate = subnet.broadcast_address - 1
            if str(candidate) == cfg.get("Gateway"):
                candidate -= 1
            return str(candidate)
        return None

    def _controller_pin(
        self, spec: NodeSpec, files: Mapping[str, tuple[bytes, int]]
    ) -> dict[str, str]:
        """``{controller name: fixed address}`` for a worker's /etc/hosts, when the
        controller named in its slurm.conf exists with a fixed address; else empty
        (the worker then finds the controller through the network's DNS)."""
        conf = files.get("slurm.conf") or files.get(f"{CONFIG_DIR}/slurm.conf")
        if conf is None:
            return {}
        match = re.search(rb"^SlurmctldHost=([a-z0-9-]+)", conf[0], re.MULTILINE)
        if match is None:
            return {}
        controller = match.group(1).decode()
        info = self._inspect(controller)
        labels = ((info or {}).get("Config") or {}).get("Labels") or {}
        address = labels.get(LABEL_CONTROLLER_ADDRESS)
        return {controller: str(address)} if address else {}

    def _create_and_start(
        self, spec: NodeSpec, archive: bytes, fixed: str | None, pins: dict[str, str]
    ) -> str:
        api = self._client().api
        with self._errors(f"creating node {spec.name}"):
            created = api.create_container(**self._create_args(spec, fixed, pins))
        cid = str(created["Id"])
        with self._errors(f"copying configuration into node {spec.name}"):
            if not api.put_archive(cid, CONFIG_DIR, archive):
                raise RuntimeFailure(f"the engine refused the files for node {spec.name}")
        with self._errors(f"starting node {spec.name}"):
            api.start(cid)
        self.engine.keep_isolation_first()
        return cid

    def _create_args(
        self, spec: NodeSpec, fixed: str | None, pins: dict[str, str]
    ) -> dict[str, Any]:
        """Low-level ``create_container`` arguments: the SDK's high-level ``create``
        cannot set ``StopTimeout``. ``fixed``: the controller's fixed IPv4; ``pins``:
        /etc/hosts entries (the controller's name on workers)."""
        api = self._client().api
        indices = ",".join(str(i) for i in spec.gpu_indices)
        memory_mb = spec.memory_gb * 1024
        env = {
            "GPUYARD_ROLE": spec.role,
            "GPUYARD_NODE_NAME": spec.name,
            "GPUYARD_CPUS": str(spec.cpus),
            "GPUYARD_MEMORY_MB": str(memory_mb),
            "GPUYARD_GPUS": str(spec.gpu_count),
            # Same convention as the docker-engine runtime's clusters without real GPUs.
            "NVIDIA_VISIBLE_DEVICES": indices or "void",
            "CUDA_VISIBLE_DEVICES": indices,
        }
        if spec.role == "worker":
            env["GPUYARD_SLURMD_CONF"] = worker_conf_arg(
                max(spec.cpus, 1), max(memory_mb, 1), spec.gpu_count
            )
        host: dict[str, Any] = {
            "network_mode": spec.network,
            # catatonit/tini as PID 1 reaps the slurmstepd and sshd session processes
            # that get re-parented to PID 1, and forwards SIGTERM to the entrypoint.
            "init": True,
            # aardvark-dns can go silent for seconds while any container on the host
            # starts or stops; glibc's defaults (5 s, 2 tries, 2 servers) turned that
            # into 20-40 s stalls. Slurm's own traffic avoids DNS (see pins), this
            # bounds the stall for everything else.
            "dns_opt": ["timeout:1", "attempts:2"],
        }
        if pins:
            host["extra_hosts"] = dict(pins)
        if spec.state_volume:
            host["binds"] = {spec.state_volume: {"bind": STATE_DIR, "mode": "rw"}}
        if self.engine.apply_limits and spec.cpus > 0:
            host["nano_cpus"] = int(spec.cpus * 1e9)
        if self.engine.apply_limits and spec.memory_gb > 0:
            host["mem_limit"] = int(spec.memory_gb * 1024**3)
        if spec.memory_gb > 0:
            # NCCL and PyTorch data loaders use /dev/shm heavily; the engines' 64 MB
            # default fails multi-GPU training, so give half the memory, within bounds.
            shm = min(max(spec.memory_gb * 1024**3 // 2, _SHM_MIN_BYTES), _SHM_MAX_BYTES)
            host["shm_size"] = int(shm)
        labels = self.engine.labels({**spec.labels, LABEL_SLURM_ROLE: spec.role})
        endpoint: dict[str, str] = {}
        if fixed:
            endpoint["ipv4_address"] = fixed
            if spec.role == "controller":
                labels[LABEL_CONTROLLER_ADDRESS] = fixed
        return {
            "image": spec.image,
            "name": spec.name,
            "hostname": spec.name,
            "environment": env,
            "labels": labels,
            "detach": True,
            "volumes": [STATE_DIR] if spec.state_volume else None,
            "host_config": api.create_host_config(**host),
            "networking_config": api.create_networking_config(
                {spec.network: api.create_endpoint_config(aliases=[spec.name], **endpoint)}
            ),
            "stop_signal": "SIGTERM",
            # Podman's compat API stores a stop timeout of 0 when none is given, so a
            # plain `podman stop` or `podman restart` SIGKILLed slurmctld before it could
            # save its state, and finished jobs came back as running after a restart.
            "stop_timeout": STOP_TIMEOUT_S,
        }

    def put_files(self, name: str, files: Mapping[str, tuple[bytes, int]]) -> None:
        """Write ``files`` (paths under ``/etc/gpuyard/`` -> (content, mode)) into the
        node, created or running. Each file is replaced whole but not atomically; the
        entrypoint installs them on the next (re)start. Raises RuntimeFailure when the
        node does not exist."""
        archive = _tar({_relative(p): v for p, v in files.items()})
        with self._errors(f"copying files into node {name}"):
            try:
                ok = self._client().api.put_archive(name, CONFIG_DIR, archive)
            except docker.errors.NotFound as e:
                raise RuntimeFailure(f"node {name} does not exist", {"node": name}) from e
            if not ok:
                raise RuntimeFailure(f"the engine refused the files for node {name}")

    def install_authorized_keys(self, name: str, keys_text: str) -> None:
        """Replace root's ``authorized_keys`` on a running node, atomically (rename),
        0600 root. Also updates ``/etc/gpuyard/authorized_keys`` so a restart keeps the
        new keys. Raises RuntimeFailure when the node is not running or the swap fails."""
        text = keys_text if keys_text.endswith("\n") or not keys_text else keys_text + "\n"
        # Names of this call's own: two installs at once (an update_ssh_keys and the key
        # watcher's pass) must not move each other's files away mid-install. The staged
        # file gone means this very install already ran: exec may run a command again
        # when the engine lost its output (runtimes/engines/exec_output.py).
        tag = secrets.token_hex(4)
        staged = f"authorized_keys.new.{tag}"
        self.put_files(name, {staged: (text.encode(), 0o600)})
        new = f"{CONFIG_DIR}/{staged}"
        tmp = f"/root/.ssh/.authorized_keys.{tag}"
        script = (
            f"set -e; [ -e {new} ] || exit 0; install -d -m 0700 -o root -g root /root/.ssh; "
            f"install -m 0600 -o root -g root {new} {tmp}; "
            f"mv -f {tmp} /root/.ssh/authorized_keys; "
            f"mv -f {new} {CONFIG_DIR}/authorized_keys"
        )
        code, out = self.exec(name, ["sh", "-c", script])
        if code != 0:
            raise RuntimeFailure(
                f"installing authorized_keys on node {name} failed (exit {code}): {out[-300:]}",
                {"node": name},
            )

    def exec(self, name: str, argv: list[str], timeout_s: float = 30) -> tuple[int, str]:
        """Run ``argv`` as root in the running node; (exit code, stdout+stderr).

        The command is killed after ``timeout_s`` (exit code 124, coreutils ``timeout``
        inside the container); ``timeout_s`` must be below the runtime's ``timeout_s``.
        Raises RuntimeFailure when the node is missing or not running. The command
        must be safe to repeat: it is run again when the engine lost its output
        (runtimes/engines/exec_output.py).
        """
        if not argv:
            raise ValueError("argv must not be empty")
        if timeout_s <= 0 or timeout_s >= self.timeout_s:
            raise ValueError(
                f"timeout_s must be in (0, {self.timeout_s}) (the engine request timeout)"
            )
        with self._errors(f"running {shlex.join(argv)[:80]} on node {name}"):
            try:
                container = self._client().containers.get(name)
            except docker.errors.NotFound as e:
                raise RuntimeFailure(f"node {name} does not exist", {"node": name}) from e

            def once(line: list[str]) -> tuple[int, str]:
                result = container.exec_run(line, stdout=True, stderr=True, user="root")
                output = result.output
                text = output.decode("utf-8", errors="replace") if isinstance(output, bytes) else ""
                code = result.exit_code
                return (int(code) if code is not None else -1), text

            # The timeout is inside the marking shell: a command cut off still ends
            # with the marker, and is not run again.
            return run_keeping_output(once, ["timeout", "-k", "2", f"{timeout_s:g}", *argv])

    def restart_node(self, name: str) -> None:
        """Restart the node's container (SIGTERM, SIGKILL after 10 s, start). The node's
        files and Slurm state are kept. Raises RuntimeFailure when it does not exist."""
        with self._errors(f"restarting node {name}"):
            try:
                self._client().api.restart(name, timeout=STOP_TIMEOUT_S)
            except docker.errors.NotFound as e:
                raise RuntimeFailure(f"node {name} does not exist", {"node": name}) from e

    def remove_node(self, name: str) -> None:
        """Stop (SIGTERM, SIGKILL after 10 s) and delete the node's container.
        Idempotent. The stop is graceful so slurmctld saves its state first. Named
        volumes are kept (:meth:`remove_volume`); the controller still lists a removed
        worker until :meth:`delete_slurm_node`."""
        self.engine.stop_and_remove(name, STOP_TIMEOUT_S, legacy=_legacy(name))

    def node_state(self, name: str) -> NodeState:
        """The container's state; ``missing`` when there is none."""
        info = self._inspect(name)
        if info is None:
            return "missing"
        status = str((info.get("State") or {}).get("Status", "")).lower()
        if status in _RUNNING_STATES:
            return "running"
        if status in _CREATED_STATES:
            return "created"
        return "exited"

    def node_address(self, name: str, network: str) -> str | None:
        """The node's IPv4 address on ``network``, or None when it has none (missing or
        stopped). The address changes when the container restarts: read it again."""
        info = self._inspect(name)
        if info is None:
            return None
        networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
        ip = (networks.get(network) or {}).get("IPAddress")
        return str(ip) if ip else None

    def list_nodes(self, label: str, value: str) -> list[str]:
        """Names of our node containers (any state) labelled ``label=value``, sorted."""
        rows = self.engine.list_containers(f"{label}={value}")
        names: list[str] = []
        for row in rows:
            for n in row.get("Names") or []:
                names.append(str(n).lstrip("/"))
                break
        return sorted(names)

    # -- Slurm ------------------------------------------------------------------------

    def sinfo(self, controller: str) -> list[tuple[str, str]]:
        """(node, state) for every node the controller knows, e.g. ("w-1", "idle").
        A trailing ``*`` on the state means not responding. Raises RuntimeFailure when
        sinfo fails (e.g. slurmctld not up yet)."""
        code, out = self.exec(controller, ["sinfo", "-h", "-N", "-o", "%N %T"], timeout_s=15)
        if code != 0:
            raise RuntimeFailure(
                f"sinfo on {controller} failed (exit {code}): {out.strip()[-300:]}",
                {"node": controller},
            )
        seen: dict[str, str] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:
                seen.setdefault(parts[0], parts[1])
        return list(seen.items())

    def lifecycle_result(self, name: str) -> int | None:
        """The exit code of the node's lifecycle script once it has finished; None
        while it runs. Raises RuntimeFailure when the node is missing or not running."""
        code, out = self.exec(name, ["cat", LIFECYCLE_RC], timeout_s=10)
        text = out.strip()
        if code != 0 or not text.lstrip("-").isdigit():
            return None
        return int(text)

    def wait_slurm_ready(
        self, controller: str, expected_nodes: list[str], timeout_s: float
    ) -> None:
        """Block until every expected node is idle, allocated or mixed in ``sinfo``.
        Raises RuntimeFailure with the last sinfo output (or error) on timeout."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while True:
            try:
                states = dict(self.sinfo(controller))
                last = " ".join(f"{n}={s}" for n, s in sorted(states.items())) or "no nodes"
                if all(states.get(n) in READY_STATES for n in expected_nodes):
                    return
            except RuntimeFailure as e:
                last = e.message
            if time.monotonic() >= deadline:
                raise RuntimeFailure(
                    f"Slurm on {controller} not ready within {timeout_s:.0f} s; waiting for "
                    f"{', '.join(expected_nodes)}; last sinfo: {last[:500]}",
                    {"node": controller},
                )
            time.sleep(0.25)

    def slurm_pid(self, name: str, process: str) -> int | None:
        """The pid (in the node's PID namespace) of ``process`` (e.g. ``slurmd``), or
        None when it is not running or the node is not running."""
        if self.node_state(name) != "running":
            return None
        code, out = self.exec(name, ["pidof", "-s", process], timeout_s=10)
        if code != 0:
            return None
        try:
            return int(out.split()[0])
        except (IndexError, ValueError):
            return None

    def delete_slurm_node(self, controller: str, node: str) -> None:
        """Make the controller forget a (removed) dynamic worker. Idempotent; raises
        RuntimeFailure when Slurm refuses, e.g. while the node still has jobs."""
        code, out = self.exec(controller, ["scontrol", "delete", f"NodeName={node}"])
        if code != 0 and "Invalid node name" not in out:
            raise RuntimeFailure(
                f"scontrol delete {node} on {controller} failed (exit {code}): "
                f"{out.strip()[-300:]}",
                {"node": node},
            )


def _ipv4_of(address: str) -> str:
    """A host's address as an IPv4 address (a name is resolved here, as the engine URL's
    is). Raises RuntimeFailure for a name that does not resolve."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(address)
    except OSError as exc:
        raise RuntimeFailure(f"host address {address!r} does not resolve: {exc}") from exc


def _legacy(name: str) -> bool:
    """Names of training clusters made before installation ids (``gy-tc{id}...``): an
    upgraded store still knows them, so they stay ours although unlabelled."""
    return name.startswith("gy-tc")
