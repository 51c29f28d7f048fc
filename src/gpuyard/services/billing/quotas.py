"""Quotas of accounts and projects (store/schema/tenancy.py Quota; core/billing/quotas.py says what
they mean): what is in use, the checks of creates, starts and scales, and setting them.

Usage is read from the store in the transaction of the request being checked, after
the request's own rows are flushed, and under the placement lock
(services/capacity/placement.py): every create, start, scale and storage claim takes that lock
before its check, so two requests of one account are checked one after the other and
never pass a quota together, on SQLite and PostgreSQL alike (READ COMMITTED reads
what the previous holder committed once the lock is ours).

What counts:

- clusters in a status that holds compute (core/states.py HOLDS_COMPUTE): their GPUs
  by type, their vCPUs, and one running cluster each;
- the nodes of training clusters not yet deleted: a worker's GPUs and vCPUs, the
  controller's vCPUs, and one running cluster per training cluster;
- volumes: every cluster's own volume until it is terminating, and every network
  volume not deleted;
- snapshots not deleted: their stored bytes once taken, and per source volume at
  least its largest snapshot's data (what deleting the earlier snapshots leaves the
  later ones holding); while being taken, what the source volume was last measured to
  hold (else its size, and at least a byte); failed ones nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpuyard.core.billing.quotas import (
    GIB,
    Breach,
    LimitChange,
    Limits,
    Usage,
    above_account,
    apply_change,
    check_value,
    first_breach,
    gb_of,
)
from gpuyard.core.errors import Forbidden, NotFound, QuotaExceeded, ValidationFailed
from gpuyard.core.roles import Permission
from gpuyard.core.snapshots import SnapshotStatus
from gpuyard.core.states import HOLDS_COMPUTE, ClusterStatus
from gpuyard.core.training import clusters as training_domain
from gpuyard.services.capacity.placement import lock_placement
from gpuyard.services.catalog.gpu_types import find_gpu_type
from gpuyard.services.context import Context
from gpuyard.services.owned_rows import owned_row
from gpuyard.services.tenancy.audit import record_audit
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import ProjectNotFound
from gpuyard.store.schema import (
    Account,
    Cluster,
    NetworkVolume,
    Project,
    Quota,
    Snapshot,
    TrainingCluster,
    TrainingNode,
)

# Project id of an account-wide quota row.
ACCOUNT_WIDE = 0

_HOLDING = tuple(s.value for s in HOLDS_COMPUTE)
# A cluster's own volume counts until it is being deleted.
_VOLUME_GONE = (ClusterStatus.TERMINATING.value, ClusterStatus.TERMINATED.value)


# ---------------------------------------------------------------- reading


def limits_of(session: Session, account_id: int, project_id: int = ACCOUNT_WIDE) -> Limits:
    """The limits of the account (``project_id`` 0) or of one of its projects."""
    rows = session.execute(
        select(Quota.resource, Quota.gpu_type, Quota.limit_value).where(
            Quota.account_id == account_id, Quota.project_id == project_id
        )
    )
    return Limits.from_rows((r, t, int(v)) for r, t, v in rows)


def account_and_project_limits(
    session: Session, account_id: int, project_id: int
) -> tuple[Limits, Limits]:
    """The account's limits and project ``project_id``'s, in one read (a create's and
    a start's check needs both)."""
    rows: dict[int, list[tuple[str, str, int]]] = {ACCOUNT_WIDE: [], project_id: []}
    for pid, resource, gpu_type, value in session.execute(
        select(Quota.project_id, Quota.resource, Quota.gpu_type, Quota.limit_value).where(
            Quota.account_id == account_id, Quota.project_id.in_({ACCOUNT_WIDE, project_id})
        )
    ):
        rows[pid].append((resource, gpu_type, int(value)))
    return Limits.from_rows(rows[ACCOUNT_WIDE]), Limits.from_rows(rows[project_id])


def _project_filter(project_id: int | None) -> list[Any]:
    return [] if project_id is None else [Project.id == project_id]


def usage_of(session: Session, account_id: int, project_id: int | None = None) -> Usage:
    """What the account (``project_id`` None) or one of its projects holds now."""
    gpus: dict[str, int] = defaultdict(int)
    vcpus = running = 0
    scope = [Project.account_id == account_id, *_project_filter(project_id)]
    for gpu_type, n_gpus, n_cpus, n_clusters in session.execute(
        select(
            Cluster.gpu_type,
            func.coalesce(func.sum(Cluster.gpu_count), 0),
            func.coalesce(func.sum(Cluster.cpu_cores), 0),
            func.count(),
        )
        .join(Project, Project.id == Cluster.project_id)
        .where(*scope, Cluster.status.in_(_HOLDING))
        .group_by(Cluster.gpu_type)
    ):
        if gpu_type and n_gpus:
            gpus[gpu_type] += int(n_gpus)
        vcpus += int(n_cpus)
        running += int(n_clusters)
    volume = int(
        session.scalar(
            select(func.coalesce(func.sum(Cluster.volume_gb), 0))
            .join(Project, Project.id == Cluster.project_id)
            .where(*scope, Cluster.status.not_in(_VOLUME_GONE))
        )
        or 0
    )
    nv_scope = [NetworkVolume.account_id == account_id, NetworkVolume.deleted_at.is_(None)]
    if project_id is not None:
        nv_scope.append(NetworkVolume.project_id == project_id)
    volume += int(
        session.scalar(select(func.coalesce(func.sum(NetworkVolume.size_gb), 0)).where(*nv_scope))
        or 0
    )
    training = _training_usage(session, account_id, project_id)
    own = Usage(
        gpus_by_type=dict(gpus),
        vcpus=vcpus,
        volume_gb=volume,
        snapshot_gb=gb_of(_snapshot_bytes(session, account_id, project_id)),
        running_clusters=running,
    )
    return own.plus(training)


# What a training node holds: its cluster, role and the cluster's per-node size.
_NODE_SIZES = (
    TrainingCluster.id,
    TrainingNode.role,
    TrainingCluster.gpu_type,
    TrainingCluster.gpus_per_node,
    TrainingCluster.cpus_per_node,
)


def _node_usage(rows: Iterable[Any], *, clusters_with_controller: bool) -> Usage:
    """GPUs and vCPUs of training nodes (``_NODE_SIZES`` rows), and their clusters as
    running clusters: every one seen, or only those whose controller is among the rows
    (a create; a scale adds workers to a cluster already counted)."""
    gpus: dict[str, int] = defaultdict(int)
    vcpus = 0
    clusters: set[int] = set()
    for cluster_id, role, gpu_type, per_node, cpus in rows:
        if role == training_domain.NodeRole.WORKER.value:
            gpus[gpu_type] += per_node
            vcpus += cpus
        else:
            vcpus += training_domain.CONTROLLER_VCPUS
        if role != training_domain.NodeRole.WORKER.value or not clusters_with_controller:
            clusters.add(cluster_id)
    return Usage(
        gpus_by_type={t: n for t, n in gpus.items() if n},
        vcpus=vcpus,
        running_clusters=len(clusters),
    )


def _training_usage(session: Session, account_id: int, project_id: int | None) -> Usage:
    where = [
        TrainingCluster.account_id == account_id,
        TrainingCluster.deleted_at.is_(None),
        # A stopped cluster's nodes hold nothing until it starts again.
        TrainingCluster.status.not_in([s.value for s in training_domain.AT_REST]),
    ]
    if project_id is not None:
        where.append(TrainingCluster.project_id == project_id)
    rows = session.execute(
        select(*_NODE_SIZES)
        .join(TrainingNode, TrainingNode.cluster_id == TrainingCluster.id)
        .where(*where)
    )
    return _node_usage(rows, clusters_with_controller=False)


def _snapshot_bytes(session: Session, account_id: int, project_id: int | None) -> int:
    """The snapshot storage held: per source volume, the stored bytes of its ready
    snapshots, but never less than the largest one's data (``size_bytes``). restic
    de-duplicates, so a snapshot stores only what the repository lacked
    (``stored_bytes``); when an earlier snapshot of the volume is deleted, the data it
    stored stays in the repository for the later ones, which still count it this way.
    Snapshots being taken count their estimate (``snapshot_estimate``)."""
    where = [Snapshot.account_id == account_id, Snapshot.deleted_at.is_(None)]
    if project_id is not None:
        where.append(Snapshot.project_id == project_id)
    # A snapshot taken through a cluster that mounts a network volume is of that volume.
    source = func.coalesce(
        Snapshot.source_network_volume_id, Snapshot.source_cluster_id, Snapshot.id
    )
    stored = func.coalesce(func.sum(func.coalesce(Snapshot.stored_bytes, Snapshot.size_bytes)), 0)
    largest = func.coalesce(func.max(Snapshot.size_bytes), 0)
    per_source: list[tuple[Any, Any]] = [
        (row[0], row[1])
        for row in session.execute(
            select(stored, largest)
            .where(*where, Snapshot.status == SnapshotStatus.READY.value)
            .group_by(source)
        )
    ]
    taken = sum(max(int(held), int(biggest)) for held, biggest in per_source)
    creating = session.execute(
        select(Snapshot.id).where(*where, Snapshot.status == SnapshotStatus.CREATING.value)
    ).scalars()
    return taken + sum(snapshot_estimate(session, s) for s in creating)


def snapshot_estimate(session: Session, snapshot_id: str) -> int:
    """The bytes a snapshot holds, or (while being taken) may hold: what its source
    volume was last measured to hold, else the volume's size, and at least one byte
    (restic stores a snapshot's metadata even for an empty volume): a new snapshot
    always asks some snapshot storage, so an account at or over its limit is refused
    one whatever its volume holds."""
    snap = session.get(Snapshot, snapshot_id)
    if snap is None:
        return 0
    if snap.status != SnapshotStatus.CREATING.value:
        if snap.status == SnapshotStatus.FAILED.value:
            return 0
        return int(snap.stored_bytes or snap.size_bytes or 0)
    measured: int | None = None
    if snap.source_cluster_id is not None:
        measured = session.scalar(
            select(Cluster.volume_used_bytes).where(Cluster.id == snap.source_cluster_id)
        )
    elif snap.source_network_volume_id is not None:
        measured = session.scalar(
            select(NetworkVolume.used_bytes).where(
                NetworkVolume.id == snap.source_network_volume_id
            )
        )
    return max(1, int(measured) if measured is not None else snap.volume_gb * GIB)


def cluster_ask(session: Session, cluster_id: str) -> Usage:
    """What cluster ``cluster_id``, as now stored, takes of the quotas."""
    row = session.execute(
        select(
            Cluster.status,
            Cluster.gpu_type,
            Cluster.gpu_count,
            Cluster.cpu_cores,
            Cluster.volume_gb,
        ).where(Cluster.id == cluster_id)
    ).one_or_none()
    if row is None:
        return Usage()
    status, gpu_type, gpu_count, cpu_cores, volume_gb = row
    volume = 0 if status in _VOLUME_GONE else volume_gb
    if status not in _HOLDING:
        return Usage(volume_gb=volume)
    return Usage(
        gpus_by_type={gpu_type: gpu_count} if gpu_type and gpu_count else {},
        vcpus=cpu_cores,
        volume_gb=volume,
        running_clusters=1,
    )


# ---------------------------------------------------------------- checks


def check_quotas(session: Session, account_id: int, project_id: int, cluster_id: str) -> None:
    """Raise QuotaExceeded when the account's or project's usage, counting cluster
    ``cluster_id`` as it is now stored, passes one of their quotas (of a resource the
    cluster takes some of). Call it after the claim, with the cluster flushed."""
    check_asked(session, account_id, project_id, lambda: cluster_ask(session, cluster_id))


def check_asked(
    session: Session,
    account_id: int,
    project_id: int,
    asked: Usage | Callable[[], Usage],
) -> None:
    """Raise QuotaExceeded when the account's or project ``project_id``'s usage (which
    already counts the request's own flushed rows) passes one of their limits of a
    resource that ``asked`` (a Usage, or a callable giving one: read only when a limit
    is set) takes some of. ``in_use`` in the details is the usage without ``asked``.

    Takes the placement lock (a no-op cost when the caller's claim took it already) so
    checks of one account run one after another."""
    account_limits, project_limits = account_and_project_limits(session, account_id, project_id)
    if not account_limits.rows() and not project_limits.rows():
        return
    lock_placement(session)
    want = asked() if callable(asked) else asked
    for scope, limits, pid in (
        ("account", account_limits, None),
        ("project", project_limits, project_id),
    ):
        if not limits.rows():
            continue
        held = usage_of(session, account_id, pid)
        breach = first_breach(limits, held.minus(want), want)
        if breach is not None:
            raise _exceeded(breach, scope, account_id, pid)


def _exceeded(breach: Breach, scope: str, account_id: int, project_id: int | None) -> QuotaExceeded:
    label = f"project {project_id}" if project_id is not None else f"account {account_id}"
    return QuotaExceeded(
        breach.describe(label),
        {
            "resource": breach.resource.value,
            "scope": scope,
            "account_id": account_id,
            "project_id": project_id,
            "gpu_type": breach.gpu_type or None,
            "limit": breach.limit,
            "in_use": breach.in_use,
            "asked": breach.asked,
        },
    )


def check_storage(
    session: Session, account_id: int, project_id: int, *, volume_gb: int = 0, snapshot_id: str = ""
) -> None:
    """The storage quotas after a network volume was created or grown by
    ``volume_gb`` GB, or snapshot ``snapshot_id`` was recorded (rows flushed)."""
    session.flush()
    check_asked(
        session,
        account_id,
        project_id,
        lambda: Usage(
            volume_gb=volume_gb,
            snapshot_gb=gb_of(snapshot_estimate(session, snapshot_id)) if snapshot_id else 0,
        ),
    )


def check_training(session: Session, account_id: int, project_id: int, node_ids: list[int]) -> None:
    """The quotas after training nodes ``node_ids`` were placed (flushed) for a
    training cluster: its create (with the cluster itself as one running cluster) or a
    scale (workers added)."""
    session.flush()

    def ask() -> Usage:
        rows = session.execute(
            select(*_NODE_SIZES)
            .join(TrainingCluster, TrainingCluster.id == TrainingNode.cluster_id)
            .where(TrainingNode.id.in_(node_ids))
        )
        return _node_usage(rows, clusters_with_controller=True)

    check_asked(session, account_id, project_id, ask)


# ---------------------------------------------------------------- showing


def _project_of(session: Session, account_id: int, project_id: int) -> Project:
    return owned_row(
        session,
        Project,
        project_id,
        account_id,
        lambda: ProjectNotFound(f"project {project_id} not found", {"project_id": project_id}),
    )


def scope_view(session: Session, account_id: int, project_id: int | None) -> dict[str, Any]:
    """``{limits, usage}`` of the account (``project_id`` None) or a project."""
    limits = limits_of(session, account_id, ACCOUNT_WIDE if project_id is None else project_id)
    return {
        "limits": limits.as_dict(),
        "usage": usage_of(session, account_id, project_id).as_dict(),
    }


def show_quotas(ctx: Context, principal: Principal, account_id: int) -> dict[str, Any]:
    """The account's limits and usage, and each project's (those the caller may
    use), oldest project first."""
    with ctx.read() as session:
        projects = session.scalars(
            select(Project).where(Project.account_id == account_id).order_by(Project.id)
        )
        return {
            "account_id": account_id,
            "account": scope_view(session, account_id, None),
            "projects": [
                {"project_id": p.id, "name": p.name, **scope_view(session, account_id, p.id)}
                for p in projects
                if principal.operator or principal.may_use_project(p.id)
            ],
        }


# ---------------------------------------------------------------- setting


def _checked_change(session: Session, change: LimitChange) -> LimitChange:
    """``change`` with its values checked and GPU types named by catalog id. Raises
    ValidationFailed naming the field."""
    for name, value in change.fields():
        problem = check_value(value)
        if problem is not None:
            raise ValidationFailed(name, problem)
    by_type: dict[str, int | None] = {}
    for name, value in change.gpus_by_type.items():
        info = find_gpu_type(session, name) if name.strip() else None
        if info is None:
            raise ValidationFailed(
                f"gpus_by_type.{name}", f"unknown GPU type {name!r} (GET /v1/gpu-types)"
            )
        by_type[info.id] = value
    return LimitChange(
        gpus=change.gpus,
        gpus_by_type=by_type,
        vcpus=change.vcpus,
        volume_gb=change.volume_gb,
        snapshot_gb=change.snapshot_gb,
        running_clusters=change.running_clusters,
    )


def _store(session: Session, account_id: int, project_id: int, limits: Limits, now: Any) -> None:
    wanted = {(r, t): v for r, t, v in limits.rows()}
    for row in session.scalars(
        select(Quota).where(Quota.account_id == account_id, Quota.project_id == project_id)
    ):
        key = (row.resource, row.gpu_type)
        if key not in wanted:
            session.delete(row)
        elif row.limit_value != wanted[key]:
            row.limit_value = wanted.pop(key)
            row.updated_at = now
        else:
            wanted.pop(key)
    for (resource, gpu_type), value in wanted.items():
        session.add(
            Quota(
                account_id=account_id,
                project_id=project_id,
                resource=resource,
                gpu_type=gpu_type,
                limit_value=value,
                updated_at=now,
            )
        )


def set_quotas(
    ctx: Context,
    principal: Principal,
    account_id: int,
    change: LimitChange,
    project_id: int | None = None,
) -> dict[str, Any]:
    """Apply ``change`` to the account's limits (``project_id`` None: the operator
    only) or to a project's (the operator, or the account's owners and admins; a
    project limit may not pass the account's limit of the same resource). Recorded as
    an audit event ``quota.set`` with the limits before and after. Returns the new
    ``{limits, usage}``. Raises Forbidden, ProjectNotFound, ValidationFailed."""
    if project_id is None and not principal.operator:
        raise Forbidden("only the installation's operator sets an account's quotas")
    if project_id is not None and not principal.operator:
        if principal.account_id != account_id:
            raise Forbidden("quotas are set by the account's owners and admins")
        principal.require_permission(Permission.MANAGE_PROJECTS)
    now = ctx.clock.now()
    with ctx.transaction() as session:
        # One change of an account's quotas at a time (rows are replaced, not merged).
        account = session.get(Account, account_id, with_for_update=True)
        if account is None:
            raise NotFound(f"account {account_id} not found", {"account_id": account_id})
        scope_id = ACCOUNT_WIDE
        if project_id is not None:
            scope_id = _project_of(session, account_id, project_id).id
        checked = _checked_change(session, change)
        before = limits_of(session, account_id, scope_id)
        after = apply_change(before, checked)
        if project_id is not None:
            over = above_account(after, limits_of(session, account_id))
            if over is not None:
                field, mine, cap = over
                raise ValidationFailed(
                    field,
                    f"{mine} is above the account's limit of {cap}",
                    {"account_limit": cap},
                )
        _store(session, account_id, scope_id, after, now)
        record_audit(
            session,
            principal,
            account_id=account_id,
            action="quota.set",
            target_type="account" if project_id is None else "project",
            target_id=account_id if project_id is None else project_id,
            detail={
                "project_id": project_id,
                "before": before.as_dict(),
                "after": after.as_dict(),
            },
            now=now,
        )
        session.flush()
        return {
            "account_id": account_id,
            "project_id": project_id,
            **scope_view(session, account_id, project_id),
        }
