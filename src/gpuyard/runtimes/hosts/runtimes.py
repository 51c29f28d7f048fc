"""The runtime of each host added through the API, made from its engine URL.

- ``ssh://user@host[:port][/socket]``: the engine's unix socket forwarded over SSH
  (runtimes/hosts/ssh_tunnel.py); firewall rules and inventory commands go over SSH too;
- ``tcp://host:port``: Docker's TCP API, with the TLS client material of the host's
  ``engine_tls_dir`` (``ca.pem``, ``cert.pem``, ``key.pem``) unless on loopback;
- ``unix:///path``: another engine on this machine.
"""

from __future__ import annotations

from pathlib import Path

import docker.tls

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.network.engine_address import parse_engine_url
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.engines.exec_endpoint import engine_exec_endpoint
from gpuyard.runtimes.engines.inventory import discover_inventory
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.engines.url import is_local_engine
from gpuyard.runtimes.fleet import HostEngine, RuntimeFactory
from gpuyard.runtimes.hosts.firewall import Runner, subprocess_runner
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys, SshRunner, SshSocketTunnel
from gpuyard.runtimes.records import EngineInventory, ExecEndpoint
from gpuyard.runtimes.volumes.images import DEFAULT_DIRECTORY, VolumeImages

# Failed pings in a row through a running SSH tunnel before it is started afresh.
TUNNEL_RESTART_AFTER = 3


class HostEngineRuntime(DockerEngineRuntime):
    """A remote host's engine. ``runner`` runs commands on the host (None: none can be
    run there, e.g. a TCP engine); ``tunnel`` is restarted by a heartbeat that finds its
    ssh child gone."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float,
        *,
        policy: EnginePolicy,
        runner: Runner | None = None,
        tunnel: SshSocketTunnel | None = None,
        tls: docker.tls.TLSConfig | None = None,
        volume_images: VolumeImages | None = None,
    ) -> None:
        super().__init__(
            base_url,
            timeout_s,
            policy=policy,
            firewall_runner=runner,
            volume_images=volume_images,
        )
        self.runner = runner
        self.tunnel = tunnel
        # Heartbeats in a row whose ping failed through a running tunnel.
        self._failed_pings = 0
        self.engine.tls = tls

    def available(self) -> str | None:
        if self.tunnel is not None:
            try:
                self.tunnel.url()
            except RuntimeFailure as exc:
                return exc.message
        return super().available()

    def heartbeat(self, timeout_s: float) -> str | None:
        """The tunnel's liveness (restarted, within the heartbeat's time, when its ssh
        child is gone), then a ping with the heartbeat's own short timeout. A tunnel
        whose child lives on but lets no ping through for ``TUNNEL_RESTART_AFTER``
        heartbeats in a row is closed, for the next heartbeat to start afresh (a
        forward wedged in a way ssh does not notice)."""
        if self.tunnel is None:
            return super().heartbeat(timeout_s)
        try:
            self.tunnel.ensure(timeout_s)
        except RuntimeFailure as exc:
            return exc.message
        problem = super().heartbeat(timeout_s)
        self._failed_pings = 0 if problem is None else self._failed_pings + 1
        if self._failed_pings >= TUNNEL_RESTART_AFTER:
            self._failed_pings = 0
            self.tunnel.close()
        return problem

    def exec_endpoint(self) -> ExecEndpoint:
        """Through the SSH tunnel's socket when there is one (started if it is down)."""
        tunnel_url = self.tunnel.url() if self.tunnel is not None else None
        return engine_exec_endpoint(self.engine, tunnel_url)

    def inventory(self) -> EngineInventory:
        """What the host has (runtimes/engines/inventory.py)."""
        return discover_inventory(self.engine, self.runner)

    def close(self) -> None:
        if self.tunnel is not None:
            self.tunnel.close()


def local_volume_images(
    engine_url: str | None, volume_image_dir: str | None, spares: int = 0
) -> VolumeImages | None:
    """How this machine's engine at ``engine_url`` makes (and removes) sized volumes'
    images: by this machine's shell, in ``volume_image_dir``, keeping ``spares`` spare
    images per size in use; None when the engine is not on this machine or no
    directory is set (sizes then are not enforced)."""
    if not volume_image_dir or not is_local_engine(engine_url):
        return None
    return VolumeImages(subprocess_runner, volume_image_dir, spares=spares)


def host_runtime_factory(
    home: Path,
    policy: EnginePolicy,
    timeout_s: float,
    *,
    volume_image_dir: str | None = DEFAULT_DIRECTORY,
    volume_spares: int = 0,
) -> RuntimeFactory:
    """Makes the runtime of a host from its engine URL. Firewall rules are kept, and
    sized volumes' images made (in ``volume_image_dir``, ``volume_spares`` spare images
    kept per size in use), on every host we can run
    commands on (SSH, or a unix socket on this machine); a TCP engine's host keeps its
    engine's own isolation (``policy.allow_unisolated_networks`` decides for Podman)
    and cannot have sized volumes (``policy.allow_unenforced_disk`` decides; nor can
    any host when ``volume_image_dir`` is empty or None)."""

    def images(runner: Runner) -> VolumeImages | None:
        if not volume_image_dir:
            return None
        return VolumeImages(runner, volume_image_dir, spares=volume_spares)

    keys = SshKeys(home)
    sockets = Path(home) / "ssh" / "sockets"

    def make(host: HostEngine) -> HostEngineRuntime:
        url = host.engine_url or ""
        address = parse_engine_url(url)
        if address.scheme == "ssh":
            tunnel = SshSocketTunnel(url, keys, sockets, connect_timeout_s=min(timeout_s, 10))
            runner = SshRunner(url, keys, timeout_s)
            return HostEngineRuntime(
                tunnel.local_url,
                timeout_s,
                policy=EnginePolicy(
                    allow_unenforced_limits=policy.allow_unenforced_limits,
                    manage_host_firewall=True,
                    allow_unisolated_networks=policy.allow_unisolated_networks,
                    allow_unenforced_disk=policy.allow_unenforced_disk,
                ),
                runner=runner,
                tunnel=tunnel,
                volume_images=images(runner),
            )
        remote_policy = EnginePolicy(
            allow_unenforced_limits=policy.allow_unenforced_limits,
            manage_host_firewall=address.scheme == "unix" and policy.manage_host_firewall,
            allow_unisolated_networks=policy.allow_unisolated_networks,
            allow_unenforced_disk=policy.allow_unenforced_disk,
        )
        tls = None
        if address.scheme == "tcp" and host.tls_dir:
            tls_dir = Path(host.tls_dir)
            tls = docker.tls.TLSConfig(
                client_cert=(str(tls_dir / "cert.pem"), str(tls_dir / "key.pem")),
                ca_cert=str(tls_dir / "ca.pem"),
                verify=True,
            )
            url = url.replace("tcp://", "https://", 1)
        return HostEngineRuntime(
            url,
            timeout_s,
            policy=remote_policy,
            tls=tls,
            volume_images=images(subprocess_runner) if address.scheme == "unix" else None,
        )

    return make
