"""Reading clusters for the caller: one cluster, the details of many at once (a
GraphQL batch), its event log and its utilisation samples (ClusterNotFound for a
cluster it may not see)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import select

from gpuyard.core import cursors
from gpuyard.core.errors import ClusterNotFound
from gpuyard.services.clusters import views as cluster_views
from gpuyard.services.clusters.cluster_rows import load_cluster
from gpuyard.services.clusters.event_pages import EventPage, check_cursor, read_page
from gpuyard.services.clusters.views import ClusterDetails
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, Event, Project, UtilizationSample


def get_cluster(ctx: Context, principal: Principal, cluster_id: str) -> Cluster:
    with ctx.read() as session:
        return load_cluster(session, principal, cluster_id)


EVENTS_LIST = "cluster_events"


def list_events(ctx: Context, principal: Principal, cluster_id: str) -> list[Event]:
    """Every event of the cluster, oldest first (``event_page`` pages them)."""
    with ctx.read() as session:
        load_cluster(session, principal, cluster_id)
        return list(
            session.scalars(select(Event).where(Event.cluster_id == cluster_id).order_by(Event.id))
        )


def event_page(
    ctx: Context,
    principal: Principal,
    cluster_id: str,
    *,
    page: int = 1,
    per_page: int = 50,
    cursor: str | None = None,
) -> EventPage:
    """The cluster's events, oldest first (by id, through the ``cluster_id`` index).
    With ``cursor`` (an earlier page's ``next_cursor`` for this cluster), the events
    after that page; else ``page`` by offset. Raises ClusterNotFound for a cluster the
    caller may not see, ValidationFailed naming ``cursor`` for a bad one."""
    bound: dict[str, cursors.FilterValue] = {
        "account": principal.account_id,
        "cluster": cluster_id,
    }
    after_id = check_cursor(EVENTS_LIST, bound, page, cursor)
    with ctx.read() as session:
        load_cluster(session, principal, cluster_id)
        return read_page(
            session,
            cluster_id,
            EVENTS_LIST,
            bound,
            after_id=after_id,
            page=page,
            per_page=per_page,
        )


def utilization_samples(
    ctx: Context, principal: Principal, cluster_id: str, span: timedelta
) -> list[UtilizationSample]:
    """The cluster's utilisation samples of the last ``span``, oldest first (the
    reconciler keeps an hour: reconciler/duties/utilization.py)."""
    since = ctx.clock.now() - span
    with ctx.read() as session:
        load_cluster(session, principal, cluster_id)
        return list(
            session.scalars(
                select(UtilizationSample)
                .where(UtilizationSample.cluster_id == cluster_id, UtilizationSample.at >= since)
                .order_by(UtilizationSample.at, UtilizationSample.id)
            )
        )


def visible_details(
    ctx: Context, principal: Principal, cluster_ids: Sequence[str]
) -> dict[str, ClusterDetails]:
    """The details of those of ``cluster_ids`` the caller may see (its account, its
    projects; terminated ones included), by id: one query for the clusters plus
    cluster_views.details' few. A single id takes the single-cluster read path."""
    if len(cluster_ids) == 1:
        try:
            d = cluster_views.load_visible(
                ctx, principal.account_id, cluster_ids[0], principal.project_ids
            )
        except ClusterNotFound:
            return {}
        return {d.cluster.id: d}
    q = (
        select(*Cluster.__table__.columns)
        .join(Project, Project.id == Cluster.project_id)
        .where(Cluster.id.in_(sorted(set(cluster_ids))), Project.account_id == principal.account_id)
    )
    if principal.project_ids is not None:
        q = q.where(Cluster.project_id.in_(sorted(principal.project_ids)))
    with ctx.read() as session:
        # Plain rows carry the Cluster's column names (as services.clusters' list).
        rows: list[Cluster] = list(session.execute(q))  # type: ignore[arg-type]
        found = cluster_views.details(ctx, rows, session)
    return {d.cluster.id: d for d in found}
