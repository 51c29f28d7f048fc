"""What the HTTP proxy should serve: one route per http port of every live cluster.

Read from the store in one indexed query (clusters not terminated), so the cost
follows live clusters, not history. Hosts' addresses come from the
reference cache: the proxy runs on this machine, so a port of this machine's host is
reached on loopback and a remote host's at its address.
"""

from __future__ import annotations

from sqlalchemy import select

from gpuyard.core.proxy import ProxyBase, ProxyRoute, Visibility
from gpuyard.core.states import ClusterStatus
from gpuyard.services.context import Context
from gpuyard.services.secrets import secret_box
from gpuyard.settings import Settings
from gpuyard.store.schema import Cluster

# Statuses whose ports keep their address (and answer the "not running" page).
_SHOWN = (
    ClusterStatus.PENDING,
    ClusterStatus.STARTING,
    ClusterStatus.RUNNING,
    ClusterStatus.STOPPING,
    ClusterStatus.STOPPED,
    ClusterStatus.ERROR,
)


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


def load_routes(ctx: Context) -> list[ProxyRoute]:
    """Every http port of every cluster that is not terminated and has a published
    port (one indexed query over live statuses)."""
    with ctx.connect() as conn:
        hosts, _ = ctx.references.get(conn)
        rows = conn.execute(
            select(Cluster.id, Cluster.ports, Cluster.host_id).where(
                Cluster.status.in_([s.value for s in _SHOWN])
            )
        ).all()
    routes: list[ProxyRoute] = []
    for r in rows:
        host = hosts.get(r.host_id) if r.host_id is not None else None
        for p in r.ports or []:
            published = int(p.get("host_port") or 0)
            if p.get("protocol") != "http" or host is None or not published:
                continue
            port = int(p["internal_port"])
            # The proxy runs on this machine: its own host's ports are on loopback.
            reach = "127.0.0.1" if host.is_local else host.address
            routes.append(
                ProxyRoute(
                    cluster_id=r.id,
                    internal_port=port,
                    visibility=Visibility(p.get("visibility", Visibility.PRIVATE)),
                    upstream=f"{reach}:{published}",
                )
            )
    return routes
