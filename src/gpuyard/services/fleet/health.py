"""What heartbeats say about hosts: reachable, unreachable, back again.

A host is ``unreachable`` after the heartbeat setting's worth of misses in a row.
Nothing new is placed there (placement takes only healthy hosts), its clusters and
training nodes keep their GPUs (never given twice: the engine may still run them) and
show ``host_status: unreachable`` with an event, and their billing pauses from the
last answered heartbeat until the host answers again (docs/decisions.md "Unreachable
hosts"). A training node follows its own host: the other nodes of its cluster bill on.
The reconciler converges the host's clusters once it answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from gpuyard.core.billing.ledger import boundary
from gpuyard.core.models import GpuSource
from gpuyard.core.states import ClusterStatus
from gpuyard.core.training.clusters import cluster_owner, node_owner
from gpuyard.runtimes.records import EngineInventory
from gpuyard.services.billing.ledger_totals import rebuild
from gpuyard.services.clusters.lifecycle import meter_status, record_event
from gpuyard.services.context import Context
from gpuyard.services.fleet.hosts import sync_host_gpus
from gpuyard.services.training.nodes import billed_nodes_on, meter_node
from gpuyard.store.schema import Cluster, Host, TrainingCluster, TrainingNode, UsageInterval

# Engine messages can be long (a whole exception text); the host keeps the start.
_ERROR_CHARS = 500


def record_heartbeat(
    ctx: Context, host_ids: Sequence[int], problem: str | None, *, misses_allowed: int
) -> list[int]:
    """Record one heartbeat of the engine serving ``host_ids``: answered (``problem``
    None) or not (the message). Returns the hosts whose reachability changed."""
    now = ctx.clock.now()
    changed: list[int] = []
    with ctx.transaction() as session:
        for host in session.scalars(select(Host).where(Host.id.in_(host_ids))):
            if problem is None:
                if _answered(session, host, now):
                    changed.append(host.id)
            elif _missed(session, host, problem, now, misses_allowed):
                changed.append(host.id)
    if changed:
        ctx.notifier.notify()
    return changed


def _answered(session: Session, host: Host, now: datetime) -> bool:
    was_away = host.unreachable_since is not None
    first = not host.healthy and not was_away
    host.last_heartbeat_at = now
    host.missed_heartbeats = 0
    host.heartbeat_error = None
    host.healthy = True
    if not was_away:
        return first
    away = (now - host.unreachable_since).total_seconds() if host.unreachable_since else 0.0
    host.unreachable_since = None
    session.flush()
    back = f"host {host.name} answers again (unreachable for {away:.0f} s); billing resumed"
    for cluster in _clusters_on(session, host.id):
        record_event(session, cluster.id, now, "host", back)
        meter_status(session, cluster, ClusterStatus(cluster.status), now)
    nodes = billed_nodes_on(session, host.id)
    for training, names in _by_cluster(nodes).items():
        record_event(session, cluster_owner(training.id), now, "host", f"{names}: {back}")
    for training, node in nodes:
        # Every node of a cluster that holds its place is billed as running.
        meter_node(session, training, node, ClusterStatus.RUNNING, now)
    return True


def _by_cluster(
    nodes: Sequence[tuple[TrainingCluster, TrainingNode]],
) -> dict[TrainingCluster, str]:
    """The node names of each training cluster, as an event names them."""
    out: dict[TrainingCluster, list[str]] = {}
    for training, node in nodes:
        out.setdefault(training, []).append(node.name)
    return {training: "node(s) " + ", ".join(names) for training, names in out.items()}


def _missed(session: Session, host: Host, problem: str, now: datetime, misses_allowed: int) -> bool:
    host.missed_heartbeats += 1
    host.heartbeat_error = problem[:_ERROR_CHARS]
    if host.unreachable_since is not None or host.missed_heartbeats < misses_allowed:
        return False
    if host.last_heartbeat_at is None and not host.healthy:
        return False  # never answered yet: it has nothing to pause
    host.healthy = False
    host.unreachable_since = now
    since = host.last_heartbeat_at or now
    clusters = _clusters_on(session, host.id)
    nodes = billed_nodes_on(session, host.id)
    pause_billing(session, [c.id for c in clusters] + [node_owner(n.id) for _, n in nodes], since)
    away = (
        f"host {host.name} is unreachable ({host.missed_heartbeats} missed heartbeats: "
        f"{host.heartbeat_error}); its GPUs stay held and billing is paused from the "
        f"last answered heartbeat at {since.isoformat()}"
    )
    for cluster in clusters:
        record_event(session, cluster.id, now, "host", away)
    for training, names in _by_cluster(nodes).items():
        record_event(session, cluster_owner(training.id), now, "host", f"{names}: {away}")
    return True


# Every status but terminated, spelled out: with ix_clusters_host_status an IN list
# reads only the host's live clusters, where ``!= terminated`` walks its history.
_LIVE = [s.value for s in ClusterStatus if s is not ClusterStatus.TERMINATED]


def _clusters_on(session: Session, host_id: int) -> list[Cluster]:
    """Every cluster with something on the host (not terminated)."""
    return list(
        session.scalars(
            select(Cluster).where(Cluster.host_id == host_id, Cluster.status.in_(_LIVE))
        )
    )


def pause_billing(session: Session, cluster_ids: Sequence[int | str], since: datetime) -> None:
    """Bill nothing for ``cluster_ids`` (clusters, or any holder of usage intervals:
    training nodes' ``tn-`` ids) from ``since`` (truncated to the second) on:
    intervals that began since then are dropped, those running past it end there.
    The status funnel opens no new ones while the host is away
    (services/clusters/lifecycle.billing_paused)."""
    if not cluster_ids:
        return
    at = boundary(since)
    ids = [str(c) for c in cluster_ids]
    session.execute(
        delete(UsageInterval)
        .where(UsageInterval.cluster_id.in_(ids), UsageInterval.started_at >= at)
        .execution_options(synchronize_session=False)
    )
    session.execute(
        update(UsageInterval)
        .where(
            UsageInterval.cluster_id.in_(ids),
            or_(UsageInterval.ended_at.is_(None), UsageInterval.ended_at > at),
        )
        .values(ended_at=at)
        .execution_options(synchronize_session=False)
    )
    rebuild(session, ids)


def record_inventory(ctx: Context, host_id: int, found: EngineInventory) -> None:
    """Keep what the host's engine says it has: engine name and version always; CPUs,
    memory, disk and GPUs unless the operator declared them (declared wins)."""
    with ctx.transaction() as session:
        host = session.get(Host, host_id)
        if host is None:
            return
        host.engine_name, host.engine_version = found.engine_name, found.engine_version
        declared = set(host.declared or ())
        for field, value in (
            ("vcpus", found.vcpus),
            ("memory_gb", found.memory_gb),
            ("disk_gb", found.disk_gb),
        ):
            if value is not None and field not in declared:
                setattr(host, field, value)
        if found.gpus is not None and host.gpu_source != GpuSource.DECLARED.value:
            sync_host_gpus(session, host, found.gpus)
        if found.cuda_version is not None and "cuda_version" not in declared:
            host.cuda_version = found.cuda_version
    # Placement and views read hosts through caches; they should see this now.
    ctx.references.invalidate()
