"""The web terminal's use cases: which container of the caller's cluster a shell
opens in, and the cluster's event-log lines for each session (opened, closed)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from gpuyard.services.clusters.cluster_rows import load_cluster
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import ApiKey

EVENT_TERMINAL = "terminal"


@dataclass(frozen=True)
class TerminalTarget:
    cluster_id: str
    status: str
    host_id: int | None
    container: str
    key_name: str


def terminal_target(ctx: Context, principal: Principal, cluster_id: str) -> TerminalTarget:
    """The caller's cluster and the name of the API key a session is recorded under.
    A shell changes the cluster: needs the write permission. Raises Forbidden,
    ClusterNotFound (also for anyone else's cluster)."""
    principal.require_write()
    with ctx.read() as session:
        cluster = load_cluster(session, principal, cluster_id)
        name = session.scalar(select(ApiKey.name).where(ApiKey.id == principal.key_id))
        container = (cluster.runtime_handle or {}).get("container_id")
        return TerminalTarget(
            cluster_id=cluster.id,
            status=cluster.status,
            host_id=cluster.host_id,
            container=str(container) if container else ctx.ownership.container(cluster.id),
            key_name=name or f"#{principal.key_id}",
        )


def record_terminal_event(ctx: Context, cluster_id: str, message: str) -> None:
    """One line of the cluster's event log about a terminal session."""
    with ctx.transaction() as session:
        record_event(session, cluster_id, ctx.clock.now(), EVENT_TERMINAL, message)
