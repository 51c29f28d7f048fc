"""The API shape of an endpoint, with what its workers and jobs are doing now.

The counts of a whole page are read in one statement (``endpoint_counts``): workers by
state (starting; ready and holding a job: running; ready and holding none: idle) and
jobs waiting or running. Everything else is the row itself; secret env values show
masked."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import case, func, literal, select, union_all
from sqlalchemy.orm import Session

from gpuyard.core.secret_env import masked_env
from gpuyard.core.states import ClusterStatus
from gpuyard.services.access.resource_util import iso
from gpuyard.services.clusters import views as cluster_views
from gpuyard.services.context import Context
from gpuyard.store.schema import Cluster, Project
from gpuyard.store.schema.serverless import ServerlessEndpoint, ServerlessJob, ServerlessWorker


@dataclass
class EndpointCounts:
    """Workers starting, running (holding a job) and idle (ready, holding none); jobs
    in the queue and in progress."""

    workers: dict[str, int] = field(
        default_factory=lambda: {"running": 0, "idle": 0, "starting": 0}
    )
    jobs: dict[str, int] = field(default_factory=lambda: {"inQueue": 0, "inProgress": 0})


_JOB_KEYS = {"IN_QUEUE": "inQueue", "IN_PROGRESS": "inProgress"}


def endpoint_counts(session: Session, endpoint_ids: Iterable[str]) -> dict[str, EndpointCounts]:
    """The counts of each of ``endpoint_ids`` (every id answered, zeros when nothing
    runs), in one statement. Runs inside the caller's transaction."""
    ids = sorted(set(endpoint_ids))
    out = {i: EndpointCounts() for i in ids}
    if not ids:
        return out
    bucket = case(
        (ServerlessWorker.status == "starting", "starting"),
        (ServerlessWorker.jobs_in_progress > 0, "running"),
        else_="idle",
    )
    workers = (
        select(
            literal("w").label("kind"),
            ServerlessWorker.endpoint_id.label("endpoint_id"),
            bucket.label("bucket"),
            func.count().label("n"),
        )
        .where(
            ServerlessWorker.endpoint_id.in_(ids),
            ServerlessWorker.status.in_(("starting", "ready")),
        )
        .group_by(ServerlessWorker.endpoint_id, bucket)
    )
    jobs = (
        select(
            literal("j").label("kind"),
            ServerlessJob.endpoint_id.label("endpoint_id"),
            ServerlessJob.status.label("bucket"),
            func.count().label("n"),
        )
        .where(ServerlessJob.endpoint_id.in_(ids), ServerlessJob.status.in_(tuple(_JOB_KEYS)))
        .group_by(ServerlessJob.endpoint_id, ServerlessJob.status)
    )
    for kind, endpoint_id, name, n in session.execute(union_all(workers, jobs)):
        counts = out[endpoint_id]
        if kind == "w":
            counts.workers[name] = int(n)
        else:
            counts.jobs[_JOB_KEYS[name]] = int(n)
    return out


def endpoint_view(row: ServerlessEndpoint, counts: EndpointCounts | None = None) -> dict[str, Any]:
    """The API shape of an endpoint (``counts`` None: all zero)."""
    counts = counts or EndpointCounts()
    return {
        "id": row.id,
        "name": row.name,
        "project_id": row.project_id,
        "template_id": row.template_id,
        "image": row.image,
        "gpu_type_ids": list(row.gpu_type_ids),
        "gpu_count": row.gpu_count,
        "cpu_cores": row.cpu_cores,
        "memory_gb": row.memory_gb,
        "container_disk_gb": row.container_disk_gb,
        "volume_gb": row.volume_gb,
        "volume_mount_path": row.volume_mount_path,
        "workers_min": row.workers_min,
        "workers_max": row.workers_max,
        "idle_timeout_s": row.idle_timeout_s,
        "scaler_type": row.scaler_type,
        "scaler_value": row.scaler_value,
        "execution_timeout_ms": row.execution_timeout_ms,
        "env": masked_env(row.env),
        "network_volume_id": row.network_volume_id,
        "locations": list(row.locations),
        "flashboot": row.flashboot,
        "status": row.status,
        "capacity_problem": row.capacity_problem,
        "version": row.version,
        "workers": dict(counts.workers),
        "jobs": dict(counts.jobs),
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
    }


def worker_clusters(session: Session, account_id: int) -> list[Cluster]:
    """The account's serverless workers' clusters that still cost something (every
    status but terminated: a kept, stopped worker pays for its volume), oldest first.
    Users' lists leave them out; what the account spends counts them."""
    return list(
        session.scalars(
            select(Cluster)
            .join(Project, Project.id == Cluster.project_id)
            .where(
                Project.account_id == account_id,
                Cluster.serverless_endpoint_id.is_not(None),
                Cluster.status != ClusterStatus.TERMINATED,
            )
            .order_by(Cluster.created_at, Cluster.id)
        )
    )


def workers_spend_per_hr(ctx: Context, account_id: int) -> float:
    """What the account's serverless workers cost per hour now (USD), each at its
    cluster's rate."""
    with ctx.read() as session:
        clusters = worker_clusters(session, account_id)
        rates = [d.rate.total for d in cluster_views.details(ctx, clusters, session)]
    return round(sum(rates), 6)
