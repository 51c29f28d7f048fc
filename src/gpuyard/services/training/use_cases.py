"""Training clusters (seed 002): create, read, delete and the nine actions.

Every request is validated completely before anything is written, and every write
happens in one transaction: a create or ``scale_cluster`` that cannot get all its GPUs
changes nothing. Work on the nodes (containers, Slurm) is left to the training
operator (reconciler/training/operator.py) through ``operation``; the network edge (reserved
IPs, security groups) changes at once and the edge is re-synced.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, assert_never

from sqlalchemy import ColumnElement, and_, func, select
from sqlalchemy.orm import Session

from gpuyard.core import cursors
from gpuyard.core.errors import NotFound, ValidationFailed
from gpuyard.core.states import ClusterStatus
from gpuyard.core.training import clusters as domain
from gpuyard.core.training.clusters import NodeRole, TrainingStatus
from gpuyard.observability.crash_points import crash_point
from gpuyard.services.access.reserved_ips import get_reserved_ip
from gpuyard.services.access.security_groups import groups_by_ids
from gpuyard.services.access.ssh_keys import keys_by_ids
from gpuyard.services.billing.admission import refuse_closed_account
from gpuyard.services.billing.quotas import check_training
from gpuyard.services.capacity.placement import lock_placement, release_all
from gpuyard.services.catalog.gpu_types import find_gpu_type
from gpuyard.services.catalog.images import get_image_version
from gpuyard.services.catalog.plans import get_plan
from gpuyard.services.clusters.event_pages import EventPage, check_cursor, read_page
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.context import Context
from gpuyard.services.idempotency import Claim
from gpuyard.services.owned_rows import owned_row
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import acting_account, resolve_project
from gpuyard.services.tenancy.secrets import secret_box
from gpuyard.services.training import autoterm
from gpuyard.services.training.inputs import (
    ActionRequest,
    AddSecurityGroups,
    AttachIp,
    ClusterSpec,
    DetachIp,
    PlanById,
    PlanChoice,
    RemoveSecurityGroup,
    RestartCluster,
    RestartWorkers,
    ScaleCluster,
    UpdateAutoTerminate,
    UpdateImage,
    UpdateSshKeys,
    parse_action_request,
    parse_cluster_spec,
)
from gpuyard.services.training.nodes import (
    NodePlan,
    begin_operation,
    meter_node,
    nodes_of,
    transition_training,
)

# SSH_PORT: also imported from here by the operator and the edge.
from gpuyard.services.training.placement import SSH_PORT as SSH_PORT
from gpuyard.services.training.placement import (
    add_workers,
    assign_subnet,
    location_hosts,
    place_all,
)
from gpuyard.services.training.stops import start_stopped
from gpuyard.store.schema import ReservedIp, TrainingCluster


class TrainingClusterNotFound(NotFound):
    code = "TRAINING_CLUSTER_NOT_FOUND"


@dataclass(frozen=True)
class Scope:
    """Where a request points: ``project_id`` and ``location`` (both required by seed
    002) and the optional ``active_iam``."""

    project_id: int
    location: str
    active_iam: int | None = None


@dataclass(frozen=True)
class ActionResult:
    """What an action answers: the cluster, a Reserved IP (``reserved_ip``: the row
    as committed, detached), nothing, or a message."""

    kind: str  # "cluster" | "reserved_ip" | "empty" | "message"
    cluster_id: int
    reserved_ip_id: int | None = None
    message: str = ""
    reserved_ip: ReservedIp | None = None


# ---------------------------------------------------------------- reading


def _visible(session: Session, principal: Principal, scope: Scope) -> tuple[int, int]:
    project = resolve_project(session, principal, scope.project_id, scope.active_iam)
    return project.account_id, project.id


def load_cluster(
    session: Session,
    principal: Principal,
    scope: Scope,
    cluster_id: int,
    *,
    for_update: bool = False,
) -> TrainingCluster:
    """The live cluster of the scope's project and location, inside the caller's
    session, else 404 (another account's cluster is indistinguishable from a missing
    one). ``for_update`` locks the row (PostgreSQL) so concurrent actions and deletes
    apply one after another."""
    account_id, project_id = _visible(session, principal, scope)
    return owned_row(
        session,
        TrainingCluster,
        cluster_id,
        account_id,
        lambda: TrainingClusterNotFound(
            f"training cluster {cluster_id} not found in project {scope.project_id} at "
            f"location {scope.location!r}",
            {"cluster_id": cluster_id},
        ),
        visible=lambda row: (
            row.deleted_at is None
            and row.project_id == project_id
            and row.location == scope.location
        ),
        lock=for_update,
    )


def _listed(account_id: int, project_id: int, location: str) -> ColumnElement[bool]:
    return and_(
        TrainingCluster.account_id == account_id,
        TrainingCluster.project_id == project_id,
        TrainingCluster.location == location,
        TrainingCluster.deleted_at.is_(None),
    )


def list_clusters(
    session: Session,
    principal: Principal,
    scope: Scope,
    *,
    after_id: int | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> list[TrainingCluster]:
    """The scope's live training clusters, oldest first (by id: the ``project_id``
    index's order): those after ``after_id`` when given, at most ``limit`` of them
    from ``offset``. Raises ProjectNotFound / Forbidden for a scope not the caller's."""
    account_id, project_id = _visible(session, principal, scope)
    q = select(TrainingCluster).where(_listed(account_id, project_id, scope.location))
    if after_id is not None:
        q = q.where(TrainingCluster.id > after_id)
    q = q.order_by(TrainingCluster.id).offset(offset)
    if limit is not None:
        q = q.limit(limit)
    return list(session.scalars(q))


def count_clusters(session: Session, principal: Principal, scope: Scope) -> int:
    """How many clusters ``list_clusters`` lists in all."""
    account_id, project_id = _visible(session, principal, scope)
    where = _listed(account_id, project_id, scope.location)
    return int(session.scalar(select(func.count()).select_from(TrainingCluster).where(where)) or 0)


# ---------------------------------------------------------------- create


def _plan(session: Session, choice: PlanChoice) -> NodePlan:
    """The node plan a well-formed choice names. Raises ValidationFailed for an
    unknown plan id or GPU type."""
    if isinstance(choice, PlanById):
        plan = get_plan(session, choice.sku_id)
        return NodePlan(
            plan.gpu_type,
            plan.gpus_per_node,
            plan.cpus_per_node,
            plan.memory_gb_per_node,
            plan.id,
        )
    info = find_gpu_type(session, choice.gpu_type)
    if info is None:
        raise ValidationFailed(
            "gpu_type", f"unknown GPU type {choice.gpu_type!r} (GET /v1/gpu-types)"
        )
    return NodePlan(
        info.id, choice.gpus_per_node, choice.cpus_per_node, choice.memory_gb_per_node, None
    )


def create_cluster(
    ctx: Context,
    principal: Principal,
    scope: Scope,
    spec: ClusterSpec | Mapping[str, Any],
    *,
    idempotency: Claim | None = None,
) -> int:
    """Check what ``spec`` names against the store (project, image, keys, plan, group,
    location), place every node and record the cluster in one transaction; the
    operator then builds it. Returns the new id. A mapping (a seed 002 body as JSON
    gave it) is parsed with parse_cluster_spec first. Raises ValidationFailed naming
    the field, ProjectNotFound / Forbidden, InsufficientCapacity (nothing is held).
    With ``idempotency`` its key is stored in that transaction, before placement."""
    principal.require_write()
    if not isinstance(spec, ClusterSpec):
        spec = parse_cluster_spec(spec)
    now = ctx.clock.now()
    with ctx.transaction() as session:
        account_id, project_id = _visible(session, principal, scope)
        image = get_image_version(session, spec.image_version_id)
        keys = keys_by_ids(session, account_id, list(spec.ssh_key_ids))
        plan = _plan(session, spec.plan)
        groups: list[int] = []
        if spec.security_group_id is not None:
            found = groups_by_ids(
                session, account_id, [spec.security_group_id], "security_group_id"
            )
            if any(g.project_id != project_id for g in found):
                raise ValidationFailed(
                    "security_group_id", "the security group belongs to another project"
                )
            groups = [g.id for g in found]
        lock_placement(session)
        # Under the placement lock, as every admission: a suspension or exhaustion that
        # committed meanwhile is seen (services/tenancy/account_stops.py takes it too).
        refuse_closed_account(session, account_id)
        hosts = location_hosts(ctx, session, scope.location, plan, spec.no_of_nodes)
        cluster = TrainingCluster(
            account_id=account_id,
            project_id=project_id,
            location=scope.location,
            name=spec.name,
            status=TrainingStatus.CREATING.value,
            status_reason="creating the controller and worker nodes",
            image_version_id=image.id,
            sku_id=plan.sku_id,
            gpu_type=plan.gpu_type,
            gpus_per_node=plan.gpus_per_node,
            cpus_per_node=plan.cpus_per_node,
            memory_gb_per_node=plan.memory_gb_per_node,
            ssh_key_ids=[k.id for k in keys],
            security_group_ids=groups,
            lifecycle_script=spec.lifecycle_script,
            # Sealed at rest (services/tenancy/secrets.py); opened only for the nodes' files.
            munge_key=secret_box(ctx.settings).seal(
                base64.b64encode(secrets.token_bytes(1024)).decode()
            ),
            next_worker=spec.no_of_nodes + 1,
            operation={"action": "create", "token": secrets.token_hex(8)},
            auto_terminate=spec.auto_terminate or {},
            run_started_at=now,
            created_at=now,
            updated_at=now,
        )
        session.add(cluster)
        session.flush()
        # Engine names carry the installation, so two installations never collide.
        cluster.name_prefix = ctx.ownership.training_prefix(cluster.id)
        if idempotency is not None:
            idempotency.record(session, cluster.id, now)
        record_event(
            session,
            domain.cluster_owner(cluster.id),
            now,
            "status",
            cluster.status_reason,
            None,
            TrainingStatus.CREATING,
        )
        assign_subnet(ctx, session, cluster)
        place_all(ctx, session, cluster, hosts, now)
        placed = [n.id for n in nodes_of(session, cluster.id)]
        check_training(session, account_id, project_id, placed)
        autoterm.refuse_spent(session, cluster, now)
        cluster_id = cluster.id
    crash_point("training.create.after_row")
    ctx.wake()  # spot clusters preempted for the nodes must stop
    ctx.training_wake(cluster_id)
    return cluster_id


# ---------------------------------------------------------------- delete


TRAINING_EVENTS = "training_events"


def event_page(
    ctx: Context,
    principal: Principal,
    scope: Scope,
    cluster_id: int,
    *,
    page: int = 1,
    per_page: int = 50,
    cursor: str | None = None,
) -> EventPage:
    """The cluster's status changes, oldest first: after ``cursor`` (an earlier page's
    ``next_cursor`` for this cluster and scope), else ``page`` by offset (404 as
    load_cluster; ValidationFailed naming ``cursor`` for a bad one)."""
    bound: dict[str, cursors.FilterValue] = {
        "account": principal.account_id,
        "cluster": cluster_id,
        "project_id": scope.project_id,
        "location": scope.location,
        "active_iam": scope.active_iam,
    }
    after_id = check_cursor(TRAINING_EVENTS, bound, page, cursor)
    with ctx.read() as session:
        load_cluster(session, principal, scope, cluster_id)
        return read_page(
            session,
            domain.cluster_owner(cluster_id),
            TRAINING_EVENTS,
            bound,
            after_id=after_id,
            page=page,
            per_page=per_page,
        )


def delete_cluster(
    ctx: Context, principal: Principal, scope: Scope, cluster_id: int, *, finish_now: bool = False
) -> None:
    """Mark for deletion; the operator removes every container, the network, the state
    volume and the SSH edge's rules, then releases capacity. Billing ends now, at the request
    (as a terminated cluster's does), however long the teardown takes. Idempotent while
    deleting. ``finish_now`` (no operator runs: nothing was ever built) releases what
    the cluster holds and hides it at once, as finish_delete."""
    principal.require_write()
    with ctx.transaction() as session:
        cluster = load_cluster(session, principal, scope, cluster_id, for_update=True)
        if cluster.status != TrainingStatus.DELETING:
            begin_delete(session, cluster, "deleting", ctx.clock.now())
    crash_point("training.delete.after_request")
    ctx.training_wake(cluster_id)
    if finish_now:
        finish_delete(ctx, cluster_id)


def begin_delete(session: Session, cluster: TrainingCluster, reason: str, now: datetime) -> None:
    """Inside the caller's transaction, for a cluster (locked) not yet deleting: close
    every node's meter (billing ends at the request) and record the ``delete``
    operation with ``reason``. The caller wakes the operator after the commit."""
    for node in nodes_of(session, cluster.id):
        meter_node(session, cluster, node, ClusterStatus.TERMINATED, now)
    begin_operation(session, cluster, TrainingStatus.DELETING, {"action": "delete"}, reason, now)


def finish_delete(ctx: Context, cluster_id: int) -> None:
    """After the runtime cleaned up: release capacity, detach reserved IPs, close the
    nodes' meters and hide the cluster."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        cluster = session.get(TrainingCluster, cluster_id, with_for_update=True)
        if cluster is None or cluster.deleted_at is not None:
            return
        lock_placement(session)
        for node in nodes_of(session, cluster_id):
            # Closed at the request already; closing again is a no-op, and covers a
            # cluster whose delete was recorded before billing ended at the request.
            meter_node(session, cluster, node, ClusterStatus.TERMINATED, now)
            release_all(session, domain.node_owner(node.id))
            session.delete(node)
        release_all(session, domain.cluster_owner(cluster_id))
        for ip in session.scalars(
            select(ReservedIp).where(ReservedIp.training_cluster_id == cluster_id)
        ):
            ip.training_cluster_id = None
        transition_training(session, cluster, TrainingStatus.DELETED, "deleted", now)
        cluster.deleted_at = now


# ---------------------------------------------------------------- actions


def perform_action(
    ctx: Context,
    principal: Principal,
    scope: Scope,
    cluster_id: int,
    request: ActionRequest | Mapping[str, Any],
) -> ActionResult:
    """Apply one of seed 002's actions in one transaction, then hand a long action to
    the operator or re-sync the cluster's network edge. A mapping (a seed 002 body as
    JSON gave it) is parsed with parse_action_request first. Raises ValidationFailed
    naming the field, InvalidState naming the status, InsufficientCapacity for a scale
    that does not fit (nothing added)."""
    principal.require_write()
    if isinstance(request, Mapping):
        request = parse_action_request(request)
    action = request.action
    now = ctx.clock.now()
    with ctx.transaction() as session:
        cluster = load_cluster(session, principal, scope, cluster_id, for_update=True)
        domain.check_allowed(action, TrainingStatus(cluster.status))
        account_id = acting_account(session, principal, scope.active_iam)
        result = _apply(ctx, session, cluster, account_id, request, now)
    if action is domain.Action.SCALE_CLUSTER:
        crash_point("training.scale.after_request")
    if action is domain.Action.UPDATE_AUTO_TERMINATE:
        ctx.wake()  # the watcher plans the new policy at once
    elif action in domain.LONG_ACTIONS:
        ctx.wake()  # a scale may have preempted spot clusters
        ctx.training_wake(cluster_id)
    else:
        ctx.training_edge(cluster_id)
    return result


def _apply(
    ctx: Context,
    s: Session,
    c: TrainingCluster,
    account: int,
    request: ActionRequest,
    now: datetime,
) -> ActionResult:
    """The handler of ``request``'s action, inside the caller's transaction."""
    match request:
        case UpdateSshKeys():
            return _update_ssh_keys(s, c, account, request, now)
        case UpdateImage():
            return _update_image(s, c, request, now)
        case RestartWorkers():
            return _restart_workers(s, c, now)
        case RestartCluster():
            return _restart_cluster(ctx, s, c, now)
        case ScaleCluster():
            return _scale_cluster(ctx, s, c, request, now)
        case AttachIp():
            return _attach_ip(s, c, account, request, now)
        case DetachIp():
            return _detach_ip(s, c, account, request, now)
        case AddSecurityGroups():
            return _add_security_group(s, c, account, request, now)
        case RemoveSecurityGroup():
            return _remove_security_group(c, request, now)
        case UpdateAutoTerminate():
            autoterm.update_policy(s, c, request.update, now)
            return ActionResult("cluster", c.id)
    assert_never(request)


def _update_ssh_keys(
    s: Session, c: TrainingCluster, account: int, request: UpdateSshKeys, now: datetime
) -> ActionResult:
    keys = keys_by_ids(s, account, list(request.ssh_key_ids))
    c.ssh_key_ids = [k.id for k in keys]
    begin_operation(
        s, c, TrainingStatus.UPDATING, {"action": "update_ssh_keys"}, "replacing SSH keys", now
    )
    return ActionResult("cluster", c.id)


def _update_image(
    s: Session, c: TrainingCluster, request: UpdateImage, now: datetime
) -> ActionResult:
    image = get_image_version(s, request.image_version_id)
    c.image_version_id = image.id
    begin_operation(
        s,
        c,
        TrainingStatus.UPDATING,
        {"action": "update_image"},
        f"rolling the nodes to image {image.name} {image.version}, one at a time",
        now,
    )
    return ActionResult("cluster", c.id)


def _restart_workers(s: Session, c: TrainingCluster, now: datetime) -> ActionResult:
    begin_operation(
        s, c, TrainingStatus.RESTARTING, {"action": "restart_workers"}, "restarting workers", now
    )
    return ActionResult("cluster", c.id)


def _restart_cluster(ctx: Context, s: Session, c: TrainingCluster, now: datetime) -> ActionResult:
    if c.status == TrainingStatus.STOPPED:
        # Its nodes hold nothing: they claim their places and are built anew.
        start_stopped(ctx, s, c, now)
        autoterm.refuse_spent(s, c, now)
    else:
        begin_operation(
            s,
            c,
            TrainingStatus.RESTARTING,
            {"action": "restart_cluster"},
            "restarting every node",
            now,
        )
    return ActionResult("cluster", c.id)


def _scale_cluster(
    ctx: Context, s: Session, c: TrainingCluster, request: ScaleCluster, now: datetime
) -> ActionResult:
    existing = sum(1 for n in nodes_of(s, c.id) if n.role == NodeRole.WORKER)
    room = domain.MAX_WORKERS - existing
    if room < 1:
        raise ValidationFailed(
            "additional_nodes", f"the cluster already has the maximum of {domain.MAX_WORKERS}"
        )
    extra = domain.positive_int("additional_nodes", request.additional_nodes, room)
    lock_placement(s)
    refuse_closed_account(s, c.account_id)
    added = add_workers(ctx, s, c, extra, now)
    check_training(s, c.account_id, c.project_id, added)
    c.next_worker += extra
    begin_operation(
        s,
        c,
        TrainingStatus.SCALING,
        {"action": "scale_cluster", "nodes": added},
        f"adding {extra} worker(s)",
        now,
    )
    return ActionResult("cluster", c.id)


def _attach_ip(
    s: Session, c: TrainingCluster, account: int, request: AttachIp, now: datetime
) -> ActionResult:
    # Locked: two clusters attaching one IP, or an attach and a release: one wins.
    # Only the cluster's project's: another project's address is "not found".
    ip = get_reserved_ip(
        s, account, request.reserved_ip_id, project_id=c.project_id, for_update=True
    )
    if ip.training_cluster_id not in (None, c.id):
        raise ValidationFailed(
            "reserved_ip_id",
            f"reserved IP {ip.address} is attached to training cluster {ip.training_cluster_id}",
        )
    ip.training_cluster_id = c.id
    c.updated_at = now
    return ActionResult("reserved_ip", c.id, reserved_ip_id=ip.id, reserved_ip=ip)


def _detach_ip(
    s: Session, c: TrainingCluster, account: int, request: DetachIp, now: datetime
) -> ActionResult:
    ip = get_reserved_ip(
        s, account, request.reserved_ip_id, project_id=c.project_id, for_update=True
    )
    if ip.training_cluster_id != c.id:
        raise ValidationFailed(
            "reserved_ip_id", f"reserved IP {ip.address} is not attached to this cluster"
        )
    ip.training_cluster_id = None
    c.updated_at = now
    return ActionResult("empty", c.id)


def _add_security_group(
    s: Session, c: TrainingCluster, account: int, request: AddSecurityGroups, now: datetime
) -> ActionResult:
    groups = groups_by_ids(s, account, list(request.security_group_ids), "security_groups_ids")
    for g in groups:
        if g.project_id != c.project_id:
            raise ValidationFailed(
                "security_groups_ids", f"security group {g.id} belongs to another project"
            )
    current = list(c.security_group_ids)
    c.security_group_ids = current + [g.id for g in groups if g.id not in current]
    c.updated_at = now
    names = ", ".join(g.name for g in groups)
    return ActionResult("message", c.id, message=f"security group(s) {names} added")


def _remove_security_group(
    c: TrainingCluster, request: RemoveSecurityGroup, now: datetime
) -> ActionResult:
    raw = request.security_group_id
    if raw not in c.security_group_ids:
        raise ValidationFailed(
            "security_group_id", f"security group {raw} is not attached to this cluster"
        )
    c.security_group_ids = [g for g in c.security_group_ids if g != raw]
    c.updated_at = now
    return ActionResult("message", c.id, message=f"security group {raw} removed")
