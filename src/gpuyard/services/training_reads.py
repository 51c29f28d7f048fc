"""What the training API shows of its clusters, read outside any write.

Slurm's partition state is asked of the controller (``sinfo``, a runtime call)
between two reads, never while a database session is open (DESIGN.md rule 2); the
second read sees the cluster as it is after the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuyard.services.auth import Principal
from gpuyard.services.context import Context
from gpuyard.services.training import (
    Scope,
    TrainingClusterNotFound,
    list_clusters,
    load_cluster,
)
from gpuyard.services.training_views import cluster_view

# The training operator's partition_state: Slurm's (node, state) pairs of a cluster,
# None when the controller does not answer.
PartitionProbe = Callable[[int], list[tuple[str, str]] | None]


def show_cluster(
    ctx: Context,
    principal: Principal,
    scope: Scope,
    cluster_id: int,
    partition: PartitionProbe | None,
) -> dict[str, Any]:
    """Seed 002's cluster object, with Slurm's partition state when ``partition`` is
    given and the cluster is past creating. Raises TrainingClusterNotFound (also for
    another account's), ProjectNotFound / Forbidden."""
    with ctx.read() as session:
        status = load_cluster(session, principal, scope, cluster_id).status
    state = None
    if partition is not None and status != "creating":
        state = partition(cluster_id)
    with ctx.read() as session:
        cluster = load_cluster(session, principal, scope, cluster_id)
        return cluster_view(
            session,
            cluster,
            prices=ctx.settings.prices,
            public_address=ctx.settings.public_address,
            partition=state,
        )


def show_clusters(
    ctx: Context, principal: Principal, scope: Scope, partition: PartitionProbe | None
) -> list[dict[str, Any]]:
    """Every live cluster of the scope's project and location, oldest first; one
    deleted while the list is read is left out."""
    with ctx.read() as session:
        ids = [c.id for c in list_clusters(session, principal, scope)]
    views = []
    for cluster_id in ids:
        try:
            views.append(show_cluster(ctx, principal, scope, cluster_id, partition))
        except TrainingClusterNotFound:
            continue  # deleted meanwhile
    return views
