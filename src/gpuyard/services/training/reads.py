"""What the training API shows of its clusters, read outside any write.

Slurm's partition state is asked of the controller (``sinfo``, a runtime call)
between two reads, never while a database session is open (DESIGN.md rule 2); the
second read sees the cluster as it is after the call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from gpuyard.core import cursors
from gpuyard.core.training.clusters import TrainingStatus
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.training.autoterm import policy_view
from gpuyard.services.training.use_cases import (
    Scope,
    TrainingClusterNotFound,
    count_clusters,
    list_clusters,
    load_cluster,
)
from gpuyard.services.training.views import cluster_view

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
    if partition is not None and status not in _NO_CONTROLLER:
        state = partition(cluster_id)
    with ctx.read() as session:
        cluster = load_cluster(session, principal, scope, cluster_id)
        idle_since = ctx.training_idle_since.get(cluster_id)
        return cluster_view(
            session,
            cluster,
            prices=ctx.settings.prices,
            public_address=ctx.settings.public_address,
            partition=state,
            auto_terminate=policy_view(session, cluster, ctx.clock.now(), idle_since),
        )


# Statuses in which no controller runs to ask Slurm's state of (the view says
# ``slurm.available: false`` without trying).
_NO_CONTROLLER = frozenset(
    {
        TrainingStatus.CREATING,
        TrainingStatus.STOPPING,
        TrainingStatus.STOPPED,
        TrainingStatus.DELETING,
        TrainingStatus.DELETED,
    }
)

TRAINING_LIST = "training_clusters"
TRAINING_KEY: cursors.KeyShape = ("int",)


@dataclass(frozen=True)
class ClusterViewPage:
    """One page of seed 002 cluster objects, the total and the next page's cursor."""

    clusters: list[dict[str, Any]]
    total: int
    next_cursor: str | None


def show_clusters(
    ctx: Context,
    principal: Principal,
    scope: Scope,
    partition: PartitionProbe | None,
    *,
    per_page: int = 50,
    page: int = 1,
    cursor: str | None = None,
) -> ClusterViewPage:
    """A page of the live clusters of the scope's project and location, oldest first:
    after ``cursor`` (an earlier page's ``next_cursor`` for the same scope), else
    ``page`` by offset; one deleted while the page is read is left out. Raises
    ValidationFailed naming ``cursor`` for a bad one."""
    cursor = cursor or None
    cursors.check_page(page, cursor)
    bound: dict[str, cursors.FilterValue] = {
        "account": principal.account_id,
        "project_id": scope.project_id,
        "location": scope.location,
        "active_iam": scope.active_iam,
    }
    after = cursors.decode(cursor, TRAINING_LIST, bound, TRAINING_KEY) if cursor else None
    with ctx.read() as session:
        total = count_clusters(session, principal, scope)
        rows = list_clusters(
            session,
            principal,
            scope,
            after_id=cast(int, after[0]) if after is not None else None,
            limit=per_page + 1,  # one more tells whether a next page exists
            offset=0 if after is not None else (page - 1) * per_page,
        )
    ids = [c.id for c in rows[:per_page]]
    next_cursor = None
    if len(rows) > per_page:
        next_cursor = cursors.encode(TRAINING_LIST, bound, (ids[-1],))
    views = []
    # Each cluster is shown as GET shows it (its Slurm partition state is a runtime
    # call, made outside any session); a page bounds how many.
    for cluster_id in ids:
        try:
            views.append(show_cluster(ctx, principal, scope, cluster_id, partition))
        except TrainingClusterNotFound:
            continue  # deleted meanwhile
    return ClusterViewPage(views, total, next_cursor)
