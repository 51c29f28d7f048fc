"""What the HTTP proxy should serve: one route per http port of every live cluster.

Read from the store in one indexed query (clusters not terminated), so the cost
follows live clusters, not history. Hosts' addresses come from the reference cache.
The proxy runs on this machine, so a port of this machine's host (or of an engine on a
local socket) is reached on loopback; a private port of an ssh:// host, published on
that host's loopback alone, through a forward over SSH (:class:`Forwards`); any other
port of a remote host at the host's address.
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import select

from gpuyard.core.network.proxy import (
    LOOPBACK,
    ProxyBase,
    ProxyRoute,
    Visibility,
    engine_scheme,
    proxy_only_ports,
)
from gpuyard.core.states import ClusterStatus
from gpuyard.services.context import Context
from gpuyard.services.tenancy.secrets import secret_box
from gpuyard.settings import Settings
from gpuyard.store.schema import Cluster, Host

# Statuses whose ports keep their address (and answer the "not running" page).
_SHOWN = (
    ClusterStatus.PENDING,
    ClusterStatus.STARTING,
    ClusterStatus.RUNNING,
    ClusterStatus.STOPPING,
    ClusterStatus.STOPPED,
    ClusterStatus.ERROR,
)


class Forwards(Protocol):
    """Reaches ``127.0.0.1:port`` of an ssh:// host from this machine
    (runtimes/hosts/ssh_forwards.py SshPortForwards)."""

    def upstream(self, url: str, port: int) -> str: ...

    def retain(self, wanted: set[tuple[str, int]]) -> None: ...


def proxy_base(settings: Settings) -> ProxyBase:
    """How this installation spells proxy URLs."""
    tls = settings.proxy_tls_cert_file is not None and settings.proxy_tls_key_file is not None
    return ProxyBase(
        scheme="https" if tls else "http",
        domain=settings.proxy_domain.strip(".").lower(),
        port=settings.proxy_public_port or settings.proxy_port,
    )


def proxy_api_secret(settings: Settings) -> str:
    """What the proxy sends the API with its own requests (the X-Gpuyard-Proxy header):
    for those alone the API takes the client's address from X-Forwarded-For."""
    return secret_box(settings).derive("proxy-to-api")


def load_routes(ctx: Context, forwards: Forwards | None = None) -> list[ProxyRoute]:
    """Every http port of every cluster that is not terminated and has a published
    port (one indexed query over live statuses). With ``forwards``, a private port of
    an ssh:// host is reached through a forward (set up here, outside any
    transaction; forwards no route needs are cancelled)."""
    with ctx.connect() as conn:
        hosts, _ = ctx.references.get(conn)
        rows = conn.execute(
            select(Cluster.id, Cluster.ports, Cluster.host_id).where(
                Cluster.status.in_([s.value for s in _SHOWN])
            )
        ).all()
        remote = {r.host_id for r in rows if r.host_id is not None}
        engines = (
            dict(conn.execute(select(Host.id, Host.engine_url).where(Host.id.in_(remote))).all())
            if remote
            else {}
        )
    routes: list[ProxyRoute] = []
    wanted: set[tuple[str, int]] = set()
    for r in rows:
        host = hosts.get(r.host_id) if r.host_id is not None else None
        private = proxy_only_ports(r.ports or [])
        url = engines.get(r.host_id) if host is not None and not host.is_local else None
        scheme = engine_scheme(url)
        for p in r.ports or []:
            published = int(p.get("host_port") or 0)
            if p.get("protocol") != "http" or host is None or not published:
                continue
            port = int(p["internal_port"])
            if host.is_local or scheme == "unix":
                upstream = f"{LOOPBACK}:{published}"
            elif scheme == "ssh" and port in private and forwards is not None and url:
                upstream = forwards.upstream(url, published)
                wanted.add((url, published))
            else:
                upstream = f"{host.address}:{published}"
            routes.append(
                ProxyRoute(
                    cluster_id=r.id,
                    internal_port=port,
                    visibility=Visibility(p.get("visibility", Visibility.PRIVATE)),
                    upstream=upstream,
                )
            )
    if forwards is not None:
        forwards.retain(wanted)
    return routes
