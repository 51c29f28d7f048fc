"""Auto-termination of training clusters: the policy given on create or changed by the
``update_auto_terminate`` action, the refusal of a policy spent before the nodes run,
what a run has cost, and what the detail shows (the policy, the next deadline and a
countdown).

The rules and their bounds are the clusters' (core/models.py ``PolicyRules``,
core/autoterm.py): a training cluster's policy differs only in its ``action``
(``stop`` or ``delete``), and idle means no running or pending Slurm job. The watcher
that fires them is reconciler/training/autoterm.py, run by the clusters' one.

A run begins at the create or at the start of a stopped cluster (``run_started_at``),
as its billing does. Its nodes may be added while it runs (``scale_cluster``), so its
rate is not constant: what the run has cost is read from its nodes' meters, and the
cost limit is reached at the rate billed now from there on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.autoterm import Deadline, deadlines, read_policy_as, shown_policy
from gpuyard.core.billing.ledger import MICRO, accrue
from gpuyard.core.models import TrainingAutoTerminatePolicy
from gpuyard.core.training import clusters as domain
from gpuyard.core.training.clusters import TrainingStatus
from gpuyard.services.billing.metering import load_intervals
from gpuyard.services.clusters.autoterm_policy import merge_policy
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.clusters.requests import TrainingAutoTerminateUpdate
from gpuyard.services.clusters.use_cases import refuse_spent_policy
from gpuyard.store.schema import Event, TrainingCluster, TrainingNode

EVENT = "auto_terminate"


def policy_of(cluster: TrainingCluster) -> TrainingAutoTerminatePolicy | None:
    """The enforced policy (None: none, disabled, no rule, or a stored one that does
    not validate; :func:`policy_view` says why)."""
    return read_policy_as(cluster.auto_terminate, TrainingAutoTerminatePolicy).policy


def run_start(cluster: TrainingCluster) -> datetime:
    """When the current run began: the latest start of a stopped cluster, else its
    creation."""
    return cluster.run_started_at or cluster.created_at


@dataclass(frozen=True)
class RunCost:
    """What the current run has cost by ``at`` (USD) and what it bills now (USD/h)."""

    at: datetime
    spent_usd: float
    rate_usd: float


def run_cost(session: Session, cluster: TrainingCluster, now: datetime) -> RunCost:
    """The run's cost from its nodes' meters (one query)."""
    node_ids = session.scalars(
        select(TrainingNode.id).where(TrainingNode.cluster_id == cluster.id)
    ).all()
    by_holder = load_intervals(session, [domain.node_owner(i) for i in node_ids])
    accrual = accrue([iv for ivs in by_holder.values() for iv in ivs], now, run_start(cluster))
    return RunCost(now, accrual.current_run_micro / MICRO, accrual.rate_micro / MICRO)


def plan(
    cluster: TrainingCluster,
    policy: TrainingAutoTerminatePolicy,
    cost: RunCost,
    idle_since: datetime | None,
) -> list[Deadline]:
    """Every rule's deadline for the current run, earliest first."""
    return deadlines(
        policy,
        run_started_at=run_start(cluster),
        hourly_rate=cost.rate_usd,
        idle_since=idle_since,
        spent=(cost.at, cost.spent_usd),
    )


def running_since(session: Session, cluster_id: int) -> datetime | None:
    """When the cluster last entered ``running`` (its latest such status event)."""
    return session.scalar(
        select(Event.created_at)
        .where(
            Event.cluster_id == domain.cluster_owner(cluster_id),
            Event.type == "status",
            Event.to_status == TrainingStatus.RUNNING.value,
        )
        .order_by(Event.id.desc())
        .limit(1)
    )


def refuse_spent(session: Session, cluster: TrainingCluster, now: datetime) -> None:
    """Inside a create's or a start's transaction, once the nodes' meters are open:
    refuse a run whose runtime or cost limit would be reached before the nodes run
    (the clusters' refusal, ValidationFailed on ``auto_terminate``)."""
    rate = run_cost(session, cluster, now).rate_usd
    refuse_spent_policy(session, cluster.auto_terminate, rate, now, TrainingAutoTerminatePolicy)


def update_policy(
    session: Session,
    cluster: TrainingCluster,
    update: TrainingAutoTerminateUpdate,
    now: datetime,
) -> None:
    """Merge ``update`` over the stored policy (the cluster locked by the caller),
    validated as a whole (ValidationFailed naming ``auto_terminate.<field>``; nothing
    changes then), and record it. On a running cluster it applies to the current run
    at once: a limit already passed fires on the watcher's next pass."""
    cluster.auto_terminate = merge_policy(
        cluster.auto_terminate, update, "auto_terminate.", TrainingAutoTerminatePolicy
    )
    # The watcher re-reads a running cluster whose version moved.
    cluster.version += 1
    cluster.updated_at = now
    record_event(
        session,
        domain.cluster_owner(cluster.id),
        now,
        EVENT,
        "policy updated: " + ", ".join(sorted(update.model_fields_set)),
    )


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat().replace("+00:00", "Z")


def policy_view(
    session: Session,
    cluster: TrainingCluster,
    now: datetime,
    idle_since: datetime | None,
) -> dict[str, Any]:
    """The detail's ``auto_terminate``: the stored policy; ``error`` (why a stored
    policy is not enforced, else null); and for a running cluster with a policy what
    fires next, when, and in how many seconds (null when nothing will), the run's
    start and since when it has been idle (null: a job runs or waits, or not sampled
    by this server yet)."""
    stored = read_policy_as(cluster.auto_terminate, TrainingAutoTerminatePolicy)
    nxt: Deadline | None = None
    running = cluster.status == TrainingStatus.RUNNING
    if stored.policy is not None and running:
        first = plan(cluster, stored.policy, run_cost(session, cluster, now), idle_since)
        nxt = first[0] if first else None
    return {
        **shown_policy(cluster.auto_terminate),
        "error": stored.error,
        "run_started_at": _iso(run_start(cluster)),
        "idle_since": _iso(idle_since) if running and stored.policy is not None else None,
        "next_deadline_at": _iso(nxt.at) if nxt else None,
        "next_rule": nxt.rule.value if nxt else None,
        "next_action": nxt.action if nxt else None,
        "seconds_left": round(max(0.0, (nxt.at - now).total_seconds()), 3) if nxt else None,
    }
