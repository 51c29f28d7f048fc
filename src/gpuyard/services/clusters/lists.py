"""The cluster list: keyset pages of an account's clusters, newest first.

Order: ``created_at`` descending, then ``id`` descending (ties are rare: times have
microseconds). Both directions descend so that a backward scan of a
``(project_id, created_at, id)`` index yields the order itself: a page reads its
rows and stops, however many rows lie behind it.

Which index answers (store/schema/clusters.py, migration 0012):

- default list (not terminated): ``ix_clusters_live_created``, partial on
  ``status != 'terminated'`` — terminated clusters are not in it, so neither the page
  nor its ``total`` touches them however many there are;
- ``status=X``: ``ix_clusters_project_status_created`` (project, status, created_at, id);
- ``search``: a filter on the rows of one of the above (a ``%...%`` match cannot
  use a b-tree index; it narrows within the project's live or status rows).

An account's clusters lie in its projects; the list reads the visible project ids
first (one indexed query) and then each project's index range, at most ``n`` rows of
each (``UNION ALL`` of per-project ranges, merged): the database never sorts more
than ``projects * n`` rows. Past ``MAX_MERGED_PROJECTS`` projects, one ``IN`` query
sorts instead. A page costs three statements, whatever its size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import ColumnElement, Select, func, literal_column, or_, select, tuple_, union_all
from sqlalchemy.orm import Session

from gpuyard.core import cursors
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.states import ClusterStatus
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, Host, Project

LIST_NAME = "clusters"
KEY_SHAPE: cursors.KeyShape = ("time", "str")
# Beyond this many visible projects, one IN query with a sort replaces the merge of
# per-project ranges (whose statement grows with the project count).
MAX_MERGED_PROJECTS = 32
# Matches the partial index's predicate word for word: SQLite and PostgreSQL use a
# partial index only when the query's WHERE implies it, which a bound parameter
# cannot show. A literal can.
LIVE = literal_column("clusters.status") != literal_column("'terminated'")
LIVE_STATUSES = sorted(s.value for s in ClusterStatus if s is not ClusterStatus.TERMINATED)


@dataclass(frozen=True)
class ClusterPage:
    """One page: its rows, the total matching rows, the page/per_page asked for and
    the cursor of the next page (None on the last)."""

    clusters: list[Cluster]
    total: int
    page: int
    per_page: int
    next_cursor: str | None = None


@dataclass(frozen=True)
class ClusterFilters:
    """Narrowing filters of the list (RunPod v2's ``GET /v2/pods``): each given one
    must hold. ``statuses`` replaces ``status`` (any of them); the others are exact."""

    name: str | None = None
    statuses: tuple[ClusterStatus, ...] | None = None
    gpu_type: str | None = None
    location: str | None = None
    template_id: str | None = None
    network_volume_id: str | None = None
    image: str | None = None

    def bound(self) -> dict[str, cursors.FilterValue]:
        """What a cursor made under these filters is bound to (none: nothing)."""
        out: dict[str, cursors.FilterValue] = {
            "name": self.name,
            "statuses": ",".join(sorted(s.value for s in self.statuses))
            if self.statuses is not None
            else None,
            "gpu_type": self.gpu_type,
            "location": self.location,
            "template_id": self.template_id,
            "network_volume_id": self.network_volume_id,
            "image": self.image,
        }
        return {f"x_{k}": v for k, v in out.items() if v is not None}

    def conditions(self) -> list[ColumnElement[bool]]:
        conds: list[ColumnElement[bool]] = []
        if self.name is not None:
            conds.append(Cluster.name == self.name)
        if self.gpu_type is not None:
            conds.append(Cluster.gpu_type == self.gpu_type)
        if self.location is not None:
            here = select(Host.id).where(Host.location == self.location)
            conds.append(Cluster.host_id.in_(here.scalar_subquery()))
        if self.template_id is not None:
            conds.append(Cluster.template_id == self.template_id)
        if self.network_volume_id is not None:
            conds.append(Cluster.network_volume_id == self.network_volume_id)
        if self.image is not None:
            conds.append(Cluster.image == self.image)
        return conds


def _status_filter(
    status: str | None, statuses: tuple[ClusterStatus, ...] | None = None
) -> ColumnElement[bool]:
    if statuses is not None:
        return Cluster.status.in_(sorted(s.value for s in statuses))
    if not status:
        return LIVE
    try:
        return Cluster.status == ClusterStatus(status.lower()).value
    except ValueError as exc:
        raise ValidationFailed(
            "status", f"unknown status {status!r}", {"allowed": [s.value for s in ClusterStatus]}
        ) from exc


def _filters(
    principal: Principal, project_id: int | None, status: str | None, search: str | None
) -> dict[str, cursors.FilterValue]:
    """What a cursor is bound to: the account and every filter of the request."""
    return {
        "account": principal.account_id,
        "project_id": project_id,
        "status": status.lower() if status else None,
        "search": search.lower() if search else None,
    }


def _project_ids(session: Session, principal: Principal, project_id: int | None) -> list[int]:
    """The projects whose clusters the caller may list (one of them with ``project_id``)."""
    q = select(Project.id).where(Project.account_id == principal.account_id)
    if principal.project_ids is not None:
        q = q.where(Project.id.in_(sorted(principal.project_ids)))
    if project_id is not None:
        q = q.where(Project.id == project_id)
    return list(session.scalars(q.order_by(Project.id)))


def _where(
    projects: list[int],
    status: ColumnElement[bool],
    search: str | None,
) -> list[ColumnElement[bool]]:
    one = len(projects) == 1
    conds: list[ColumnElement[bool]] = [
        Cluster.project_id == projects[0] if one else Cluster.project_id.in_(projects),
        status,
        # A serverless endpoint's workers are the endpoint's, not the user's pods.
        Cluster.serverless_endpoint_id.is_(None),
    ]
    if search:
        like = f"%{search.lower()}%"
        conds.append(or_(func.lower(Cluster.name).like(like), Cluster.id.like(like)))
    return conds


ORDER = (Cluster.created_at.desc(), Cluster.id.desc())


def _rows(
    projects: list[int],
    conds: list[ColumnElement[bool]],
    after: tuple[Any, ...] | None,
    limit: int,
    offset: int,
) -> Select[Any]:
    """Rows ``offset .. offset+limit`` of the order (after the key ``after``, when given)."""
    if after is not None:
        conds = [*conds, tuple_(Cluster.created_at, Cluster.id) < tuple_(*after)]
    columns = Cluster.__table__.columns
    if len(projects) == 1 or len(projects) > MAX_MERGED_PROJECTS:
        return select(*columns).where(*conds).order_by(*ORDER).offset(offset).limit(limit)
    # Each project's range, at most offset+limit rows of it, merged: no project's
    # rows beyond what the page can need are read. The arms are subqueries because
    # SQLite allows no ORDER BY/LIMIT on an arm of a compound select.
    arms = [
        select(*columns)
        .where(Cluster.project_id == p, *conds[1:])
        .order_by(*ORDER)
        .limit(offset + limit)
        .subquery()
        .select()
        for p in projects
    ]
    merged = union_all(*arms).subquery()
    return (
        select(*merged.c)
        .order_by(merged.c.created_at.desc(), merged.c.id.desc())
        .offset(offset)
        .limit(limit)
    )


def list_clusters(
    ctx: Context,
    principal: Principal,
    *,
    project_id: int | None = None,
    search: str | None = None,
    status: str | None = None,
    page: int = 1,
    per_page: int = 50,
    cursor: str | None = None,
    filters: ClusterFilters | None = None,
) -> ClusterPage:
    """The account's clusters, newest first; terminated ones only when asked for
    (``status=terminated``); never a serverless endpoint's workers. A caller
    restricted to some projects sees only theirs (another ``project_id`` lists
    nothing).

    With ``cursor`` (a ``next_cursor`` of an earlier page with the same filters) the
    page is the ``per_page`` rows after that cursor's row: stable while clusters are
    created (they sort before it). Without, ``page`` pages by offset (the seed's
    clients). ``filters`` narrow it further (their ``statuses`` may name terminated).
    Raises ValidationFailed naming ``status`` or ``cursor``."""
    cursor = cursor or None
    cursors.check_page(page, cursor)
    statuses = filters.statuses if filters is not None else None
    status_cond = _status_filter(status, statuses)
    bound = _filters(principal, project_id, status, search)
    if filters is not None:
        bound.update(filters.bound())
    after = cursors.decode(cursor, LIST_NAME, bound, KEY_SHAPE) if cursor else None
    offset = 0 if after is not None else (page - 1) * per_page
    with ctx.read() as session:
        projects = _project_ids(session, principal, project_id)
        if not projects:
            return ClusterPage([], 0, page, per_page)
        conds = _where(projects, status_cond, search)
        if filters is not None:
            conds += filters.conditions()
        # The live count names the live statuses too: without statistics, SQLite would
        # rather count through the (project, status) index from the project's first
        # entry, terminated ones included; with them, it reads only live ranges.
        explicit = status or statuses is not None
        counted = [*conds, Cluster.status.in_(LIVE_STATUSES)] if not explicit else conds
        total = session.scalar(select(func.count()).select_from(Cluster).where(*counted)) or 0
        # One row more than the page tells whether a next page exists.
        rows = list(session.execute(_rows(projects, conds, after, per_page + 1, offset)))
    clusters = [cast(Cluster, row) for row in rows[:per_page]]
    next_cursor = None
    if len(rows) > per_page:
        last = clusters[-1]
        next_cursor = cursors.encode(LIST_NAME, bound, (last.created_at, last.id))
    return ClusterPage(clusters, int(total), page, per_page, next_cursor)
