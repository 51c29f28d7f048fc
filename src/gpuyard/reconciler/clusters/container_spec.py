"""The container a cluster's start creates: its image, command, environment (GPUs,
keys, opened secrets and the account secrets it refers to), ports, volume and limits,
read from the store."""

from __future__ import annotations

import shlex
from collections.abc import Callable

from sqlalchemy import select

from gpuyard.core.errors import GpuyardError, RuntimeFailure
from gpuyard.core.network.proxy import LOOPBACK, private_on_loopback, proxy_only_ports
from gpuyard.core.ownership import legacy_container_name
from gpuyard.reconciler.clusters.records import volume_of
from gpuyard.runtimes.base import LABEL_CLUSTER, ContainerSpec, PortBinding, Runtime
from gpuyard.services.access.ssh_keys import account_public_keys
from gpuyard.services.context import Context
from gpuyard.services.fleet.hosts import gpu_uuids
from gpuyard.services.tenancy.account_secrets import resolved_env
from gpuyard.services.tenancy.secrets import open_env, secret_box
from gpuyard.store.schema import Cluster, Host, NetworkVolume, PortAllocation, Project


def container_command(
    entrypoint: tuple[str, ...] | None, docker_args: str
) -> tuple[str, ...] | None:
    """The container's command (CMD) from ``docker_args`` (None: the image's own).
    The text is split as a shell would split words (``shlex``), except after an
    ENTRYPOINT that ends in a shell's ``-c`` (``["/bin/sh", "-c"]``): that shell reads
    its script from the one argument after ``-c``, so the whole text is that argument
    (``echo hi; sleep 600`` runs both). Raises GpuyardError when the text cannot be
    split (an unclosed quote)."""
    if not docker_args.strip():
        return None
    if entrypoint and entrypoint[-1] == "-c":
        return (docker_args,)
    try:
        return tuple(shlex.split(docker_args))
    except ValueError as exc:
        raise GpuyardError(f"docker_args cannot be parsed: {exc}") from exc


class ContainerSpecs:
    """Builds clusters' container specs; network volumes are made on the engine of the
    cluster's host (``runtime_of``) when missing."""

    def __init__(self, ctx: Context, runtime_of: Callable[[int | None], Runtime]) -> None:
        self.ctx = ctx
        self.runtime_of = runtime_of

    def _mounted_volume(self, c: Cluster) -> str | None:
        """The engine volume the container mounts: its network volume's when it names
        one (made here with our labels if missing: the first cluster to start with it
        makes it; idempotent, so several clusters may share it), else its own (None:
        it has none). Raises RuntimeFailure when the network volume is gone."""
        if c.network_volume_id is None:
            return volume_of(self.ctx, c) if c.volume_gb > 0 else None
        name, size_gb = self._network_volume(c)
        self.runtime_of(c.host_id).ensure_volume(name, c.network_volume_id, size_gb)
        return name

    def _network_volume(self, c: Cluster) -> tuple[str, int]:
        """The engine volume and size (GB) of ``c``'s network volume. Raises
        RuntimeFailure when it is gone."""
        with self.ctx.read() as session:
            nv = session.get(NetworkVolume, c.network_volume_id)
            if nv is not None and nv.deleted_at is None:
                return nv.volume_name, nv.size_gb
        raise RuntimeFailure(
            f"network volume {c.network_volume_id} no longer exists",
            {"network_volume_id": c.network_volume_id},
        )

    def _volume_gb(self, c: Cluster) -> int:
        """The size the container's volume is held to: its network volume's, or its own."""
        if c.network_volume_id is None:
            return c.volume_gb
        return self._network_volume(c)[1]

    def build(self, c: Cluster) -> ContainerSpec:
        """The container spec of ``c`` now. Raises RuntimeFailure (no account, a
        network volume gone), SecretMissing (a secret the env refers to is gone),
        SecretUnreadable or GpuyardError (docker_args)."""
        with self.ctx.read() as session:
            allocations = list(
                session.scalars(select(PortAllocation).where(PortAllocation.cluster_id == c.id))
            )
            uuids = gpu_uuids(session, c.host_id, list(c.gpu_indices)) if c.host_id else ()
            hosts, _ = self.ctx.references.get(session)
            host = hosts.get(c.host_id) if c.host_id is not None else None
            engine_url = (
                session.scalar(select(Host.engine_url).where(Host.id == c.host_id))
                if host is not None and not host.is_local
                else None
            )
            # The container joins its account's private network: no route to the
            # clusters of other accounts.
            account_id = session.scalar(
                select(Project.account_id).where(Project.id == c.project_id)
            )
            # Only the keys whose users may write to this project now: a removed
            # member's key is not baked into a new container's environment.
            public_keys = (
                account_public_keys(session, account_id, project_id=c.project_id)
                if account_id
                else ""
            )
        if account_id is None:
            # Never the engine's shared default network.
            raise RuntimeFailure(f"cluster {c.id} has no account to place its network in")
        # Secret values are opened here only, for the engine (SecretUnreadable fails the
        # start with a message naming the key file).
        env = open_env(secret_box(self.ctx.settings), c.env)
        # References to the account's secrets ({{ RUNPOD_SECRET_name }}) get their
        # values now, read and opened outside any transaction, for the engine only.
        env = resolved_env(self.ctx, account_id, env)
        indices = ",".join(str(i) for i in c.gpu_indices)
        if uuids:
            # Real GPUs are handed over as devices; inside they are numbered from 0.
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(uuids)))
        else:
            env["NVIDIA_VISIBLE_DEVICES"] = indices or "void"
            env["CUDA_VISIBLE_DEVICES"] = indices
        env["GPUYARD_CLUSTER_ID"] = c.id
        if public_keys:
            # RunPod's convention: images' start scripts put these in authorized_keys.
            env.setdefault("PUBLIC_KEY", public_keys)
        # A private http port is published on the host's loopback only: the proxy is
        # all that may reach it (this machine's loopback, or an ssh:// host's through
        # a forward; docs/decisions.md "Private ports").
        on_loopback = host is None or private_on_loopback(host.is_local, engine_url)
        loopback = proxy_only_ports(c.ports or []) if on_loopback else frozenset()
        entrypoint = tuple(c.docker_entrypoint) if c.docker_entrypoint is not None else None
        command = container_command(entrypoint, c.docker_args)
        return ContainerSpec(
            cluster_id=c.id,
            image=c.image,
            command=command,
            entrypoint=entrypoint,
            env=env,
            ports=tuple(
                PortBinding(
                    a.internal_port,
                    a.port,
                    "udp" if a.protocol == "udp" else "tcp",
                    host_ip=LOOPBACK
                    if a.internal_port in loopback and a.protocol != "udp"
                    else None,
                )
                for a in allocations
            ),
            volume_name=self._mounted_volume(c),
            volume_mount_path=c.volume_mount_path,
            volume_gb=self._volume_gb(c),
            container_disk_gb=c.container_disk_gb,
            cpu_cores=float(c.cpu_cores),
            memory_gb=float(c.memory_gb),
            gpu_indices=tuple(c.gpu_indices),
            gpu_uuids=uuids,
            labels={LABEL_CLUSTER: c.id},
            # A cluster older than installation ids may still run its old container.
            replaces=legacy_container_name(c.id) if c.volume_name is not None else None,
            account_id=account_id,
        )
