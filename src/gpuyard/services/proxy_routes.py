"""What the HTTP proxy should serve: one route per http port of every live cluster.

Read from the store in two indexed queries (clusters not terminated, open sessions),
so the cost follows live clusters, not history. Hosts' addresses come from the
reference cache: the proxy runs on this machine, so a port of this machine's host is
reached on loopback and a remote host's at its address.
"""

from __future__ import annotations

from sqlalchemy import select

from gpuyard.core.proxy import ProxyBase, ProxyRoute, RouteState, Visibility
from gpuyard.core.states import ClusterStatus
from gpuyard.services.context import Context
from gpuyard.settings import Settings
from gpuyard.store.schema import Cluster, Project, ProxySession

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


def load_routes(ctx: Context) -> list[ProxyRoute]:
    """Every http port of every cluster that is not terminated (or terminating)."""
    now = ctx.clock.now()
    with ctx.connect() as conn:
        hosts, _ = ctx.references.get(conn)
        rows = conn.execute(
            select(
                Cluster.id,
                Cluster.status,
                Cluster.ports,
                Cluster.host_id,
                Project.account_id,
            )
            .join(Project, Project.id == Cluster.project_id)
            .where(Cluster.status.in_([s.value for s in _SHOWN]))
        ).all()
        secrets: dict[tuple[str, int], list[str]] = {}
        for s in conn.execute(
            select(ProxySession.cluster_id, ProxySession.internal_port, ProxySession.secret).where(
                ProxySession.expires_at > now, ProxySession.used_at.is_not(None)
            )
        ):
            secrets.setdefault((s.cluster_id, s.internal_port), []).append(s.secret)
    routes: list[ProxyRoute] = []
    for r in rows:
        host = hosts.get(r.host_id) if r.host_id is not None else None
        for p in r.ports or []:
            if p.get("protocol") != "http":
                continue
            port = int(p["internal_port"])
            published = int(p.get("host_port") or 0)
            address = None
            if host is not None and published:
                address = (
                    f"127.0.0.1:{published}" if host.is_local else f"{host.address}:{published}"
                )
            running = r.status == ClusterStatus.RUNNING
            routes.append(
                ProxyRoute(
                    cluster_id=r.id,
                    internal_port=port,
                    account_id=r.account_id,
                    visibility=Visibility(p.get("visibility", Visibility.PRIVATE)),
                    state=RouteState.FORWARD if running and address else RouteState.STOPPED,
                    status=r.status,
                    upstream=address,
                    session_secrets=tuple(sorted(secrets.get((r.id, port), ()))),
                )
            )
    return routes
