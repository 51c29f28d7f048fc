"""The cluster list's keyset pages on every backend: order, cursors, a constant number
of statements per page, and query plans that read the live index (terminated
clusters, however many, are not in it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, insert, text
from sqlalchemy.engine import Connection

from gpuyard.api.rest.schemas.cluster_json import cluster_v1
from gpuyard.core.errors import InvalidState, ValidationFailed
from gpuyard.core.states import ClusterStatus
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters import views as cluster_views
from gpuyard.services.clusters.lists import ClusterFilters
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import create_project
from gpuyard.store.schema import Cluster
from tests.cluster_rows import T0, cluster_row, first_project, seed_clusters


def _engine(ctx: Context) -> Engine:
    bind = ctx.sessions.kw["bind"]
    assert isinstance(bind, Engine)
    return bind


def seed(
    ctx: Context, project_id: int, n: int, status: str = "stopped", *, start: datetime = T0
) -> list[str]:
    return seed_clusters(ctx, project_id, n, status, start=start)


def project_of(ctx: Context, p: Principal) -> int:
    return first_project(ctx, p.account_id)


@contextmanager
def statements(ctx: Context) -> Iterator[list[tuple[str, Any]]]:
    """Every SQL statement the engine runs meanwhile, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def record(conn: Connection, cursor: Any, sql: str, params: Any, *rest: Any) -> None:
        seen.append((sql, params))

    engine = _engine(ctx)
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def walk(ctx: Context, p: Principal, per_page: int, **filters: Any) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        page = uc.list_clusters(ctx, p, per_page=per_page, cursor=cursor, **filters)
        ids += [c.id for c in page.clusters]
        cursor = page.next_cursor
        if cursor is None:
            return ids


def test_cursor_walk_gives_each_cluster_once_newest_first(ctx: Context, alice: Principal) -> None:
    pid = project_of(ctx, alice)
    live = seed(ctx, pid, 23, "running")
    seed(ctx, pid, 7, "terminated", start=T0 + timedelta(seconds=5))
    assert walk(ctx, alice, 5) == list(reversed(live))
    # Offset pages (the seed's clients) agree with the cursor walk.
    offset = [
        c.id for n in (1, 2, 3) for c in uc.list_clusters(ctx, alice, per_page=10, page=n).clusters
    ]
    assert offset == list(reversed(live))
    assert uc.list_clusters(ctx, alice, per_page=5).total == 23
    assert len(walk(ctx, alice, 4, status="terminated")) == 7


def test_walk_merges_projects_in_one_order(ctx: Context, alice: Principal) -> None:
    first = project_of(ctx, alice)
    second = create_project(ctx, alice, None, "second").id
    a = seed(ctx, first, 9, "running")
    b = seed(ctx, second, 9, "running", start=T0 + timedelta(milliseconds=500))
    expected = [x for pair in zip(reversed(b), reversed(a), strict=True) for x in pair]
    assert walk(ctx, alice, 4) == expected
    assert walk(ctx, alice, 4, project_id=second) == list(reversed(b))


def test_equal_times_are_ordered_by_id(ctx: Context, alice: Principal) -> None:
    pid = project_of(ctx, alice)
    rows = [cluster_row(pid, "running", T0, f"same{i}") for i in range(6)]
    with ctx.transaction() as session:
        session.execute(insert(Cluster), rows)
    assert walk(ctx, alice, 4) == sorted((r["id"] for r in rows), reverse=True)


def test_cursor_is_bound_to_its_filters_and_account(
    ctx: Context, alice: Principal, bob: Principal
) -> None:
    seed(ctx, project_of(ctx, alice), 3, "running")
    cursor = uc.list_clusters(ctx, alice, per_page=1).next_cursor
    assert cursor is not None
    for status, search in (("running", None), (None, "c")):
        with pytest.raises(ValidationFailed) as err:
            uc.list_clusters(ctx, alice, per_page=1, cursor=cursor, status=status, search=search)
        assert err.value.field == "cursor"
    with pytest.raises(ValidationFailed):
        uc.list_clusters(ctx, bob, per_page=1, cursor=cursor)
    with pytest.raises(ValidationFailed) as err:
        uc.list_clusters(ctx, alice, per_page=1, cursor=cursor, page=2)
    assert err.value.field == "cursor"


def _page_statements(ctx: Context, p: Principal) -> int:
    """Statements of one REST page: the list and the views of its clusters."""
    with statements(ctx) as seen:
        page = uc.list_clusters(ctx, p, per_page=50)
        with ctx.read() as session:
            views = [cluster_v1(d) for d in cluster_views.details(ctx, page.clusters, session)]
    assert len(views) == len(page.clusters)
    return len(seen)


def test_a_page_costs_the_same_statements_for_5_or_50(ctx: Context, alice: Principal) -> None:
    pid = project_of(ctx, alice)
    ctx.references.ttl_s = 3600.0  # cached through the test, however slow the machine
    seed(ctx, pid, 5, "stopped")
    _page_statements(ctx, alice)  # warms what is cached (the host and GPU references)
    few = _page_statements(ctx, alice)
    seed(ctx, pid, 45, "stopped", start=T0 + timedelta(hours=1))
    many = _page_statements(ctx, alice)
    assert uc.list_clusters(ctx, alice, per_page=50).total == 50
    assert few == many


def _plans(ctx: Context, seen: list[tuple[str, Any]]) -> list[str]:
    """The plan of each recorded statement that reads the clusters table."""
    postgres = _engine(ctx).dialect.name == "postgresql"
    plans = []
    with _engine(ctx).connect() as conn:
        if postgres:
            # Statistics as autovacuum keeps them. A tiny table is cheaper to scan, or
            # to sort, than to walk in index order: ask whether an index CAN serve
            # (a Sort left in the plan means none gives the order).
            conn.exec_driver_sql("ANALYZE clusters")
            for method in ("seqscan", "bitmapscan", "sort"):
                conn.exec_driver_sql(f"SET enable_{method} = off")
        for sql, params in seen:
            if "FROM clusters" not in sql:
                continue
            prefix = "EXPLAIN " if postgres else "EXPLAIN QUERY PLAN "
            rows = conn.exec_driver_sql(prefix + sql, params).all()
            plans.append("\n".join(" ".join(str(v) for v in r) for r in rows))
    return plans


def _status_in_index(plan: str) -> bool:
    """Whether the status is part of an index condition (SQLite's ``status=?`` of a
    SEARCH, PostgreSQL's ``Index Cond``): a range of that status, not a filter."""
    if "status=?" in plan:
        return True
    conds = [line for line in plan.splitlines() if "Index Cond:" in line]
    return any("status" in line for line in conds)


def _reads_only_live(plan: str) -> bool:
    """Whether a plan reads the live partial index, or the status index by status (so
    no terminated entry is read either way)."""
    if "ix_clusters_live_created" in plan:
        return True
    return "ix_clusters_project_status" in plan and _status_in_index(plan)


def test_live_pages_and_counts_read_the_live_index(ctx: Context, alice: Principal) -> None:
    pid = project_of(ctx, alice)
    seed(ctx, pid, 300, "terminated")
    seed(ctx, pid, 60, "running", start=T0 + timedelta(days=1))
    with statements(ctx) as seen:
        first = uc.list_clusters(ctx, alice, per_page=50)
        uc.list_clusters(ctx, alice, per_page=50, cursor=first.next_cursor)
    plans = _plans(ctx, seen)
    assert len(plans) == 4  # two counts, two pages
    for plan in plans:
        assert _reads_only_live(plan), plan
        # The index gives the order: no sort (SQLite's temp b-tree, PostgreSQL's Sort).
        assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan
    with statements(ctx) as seen:
        uc.list_clusters(ctx, alice, per_page=50, status="terminated")
    for plan in _plans(ctx, seen):
        # An index range of the status (which index the count takes is the planner's:
        # on this data the status alone is as selective as project and status).
        assert _status_in_index(plan), plan
        assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan
    with ctx.read() as session:
        assert session.execute(text("SELECT count(*) FROM clusters")).scalar() == 360


def test_filters_narrow_the_walk_and_bind_the_cursor(ctx: Context, alice: Principal) -> None:
    """RunPod v2's list filters (services/clusters/lists.py ``ClusterFilters``): each
    one narrows the pages, a cursor walk under them gives each match once, and a
    cursor made under some filters is refused under others."""
    pid = project_of(ctx, alice)
    running = seed(ctx, pid, 9, "running")
    stopped = seed(ctx, pid, 4, "stopped", start=T0 + timedelta(seconds=20))
    gone = seed(ctx, pid, 3, "terminated", start=T0 + timedelta(seconds=40))
    with ctx.transaction() as session:
        session.get_one(Cluster, running[2]).image = "other"
        session.get_one(Cluster, running[4]).name = "special"
    exited = ClusterFilters(statuses=(ClusterStatus.STOPPING, ClusterStatus.STOPPED))
    assert walk(ctx, alice, 3, filters=exited) == list(reversed(stopped))
    assert uc.list_clusters(ctx, alice, per_page=2, filters=exited).total == 4
    ended = ClusterFilters(statuses=(ClusterStatus.TERMINATING, ClusterStatus.TERMINATED))
    assert walk(ctx, alice, 2, filters=ended) == list(reversed(gone))
    assert walk(ctx, alice, 2, filters=ClusterFilters(image="other")) == [running[2]]
    assert walk(ctx, alice, 2, filters=ClusterFilters(name="special")) == [running[4]]
    # Clusters on no host are in no location.
    assert walk(ctx, alice, 2, filters=ClusterFilters(location="local")) == []
    assert walk(ctx, alice, 2, filters=ClusterFilters(gpu_type="NVIDIA RTX A6000")) == []
    cursor = uc.list_clusters(ctx, alice, per_page=2, filters=exited).next_cursor
    assert cursor is not None
    with pytest.raises(ValidationFailed) as caught:
        uc.list_clusters(ctx, alice, per_page=2, cursor=cursor)
    assert caught.value.field == "cursor"


def test_rename_changes_only_the_name(ctx: Context, alice: Principal) -> None:
    pid = project_of(ctx, alice)
    (cid,) = seed(ctx, pid, 1, "running")
    (ended,) = seed(ctx, pid, 1, "terminated")
    before = uc.get_cluster(ctx, alice, cid)
    renamed = uc.rename_cluster(ctx, alice, cid, "new name")
    after = uc.get_cluster(ctx, alice, cid)
    assert renamed.name == after.name == "new name"
    assert (after.status, after.image) == (before.status, before.image)
    assert after.version == before.version + 1
    assert any(e.type == "renamed" for e in uc.list_events(ctx, alice, cid))
    for bad in ("", "x" * 201, "tab\u0007bell"):
        with pytest.raises(ValidationFailed):
            uc.rename_cluster(ctx, alice, cid, bad)
    with pytest.raises(InvalidState):
        uc.rename_cluster(ctx, alice, ended, "late")
