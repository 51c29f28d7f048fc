"""Which engine URL reaches a cluster's host, for the gateway's exec calls.

- this machine (the host registered by ``serve``): the engine ``serve`` found or
  started (handed to the gateway as ``GPUYARD_ENGINE_URL``);
- ``unix://``: as is; ``tcp://`` with TLS material in the host's ``engine_tls_dir``:
  ``https://`` with that client certificate (loopback without it: plain);
- ``ssh://``: the host's engine socket forwarded over SSH, as the server does
  (runtimes/hosts/ssh_tunnel.py), through a tunnel of the gateway's own (its own local
  socket directory, so it never disturbs the server's).
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.network.engine_address import parse_engine_url
from gpuyard.edge.ssh_directory import ClusterTarget
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys, SshSocketTunnel


class EngineLocator:
    def __init__(self, home: Path, local_engine_url: str | None, timeout_s: float = 10.0) -> None:
        self.home = Path(home)
        self.local_engine_url = local_engine_url
        self.timeout_s = timeout_s
        self._tunnels: dict[str, SshSocketTunnel] = {}
        self._keys = SshKeys(self.home)

    async def engine_of(self, target: ClusterTarget) -> tuple[str, ssl.SSLContext | None]:
        """``(url, ssl context or None)`` of the engine running ``target``'s container.
        Raises RuntimeFailure saying why it cannot be reached."""
        if target.host_is_local or not target.engine_url:
            if not self.local_engine_url:
                raise RuntimeFailure("the gateway knows no container engine on this machine")
            return self.local_engine_url, None
        url = target.engine_url
        address = parse_engine_url(url)
        if address.scheme == "unix":
            return url, None
        if address.scheme == "tcp":
            if target.engine_tls_dir:
                tls_dir = Path(target.engine_tls_dir)
                context = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
                context.load_cert_chain(str(tls_dir / "cert.pem"), str(tls_dir / "key.pem"))
                return url.replace("tcp://", "https://", 1), context
            return url, None
        tunnel = self._tunnels.get(address.key)
        if tunnel is None:
            tunnel = SshSocketTunnel(
                url, self._keys, self.home / "ssh" / "gateway-sockets",
                connect_timeout_s=self.timeout_s,
            )  # fmt: skip
            self._tunnels[address.key] = tunnel
        return await asyncio.to_thread(tunnel.url), None

    def close(self) -> None:
        for tunnel in self._tunnels.values():
            tunnel.close()
        self._tunnels.clear()
