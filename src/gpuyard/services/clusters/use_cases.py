"""Cluster use cases: create and start here (the changes a start may make are
validated in services/clusters/config.py); stop, restart and terminate in
services/clusters/actions.py, reads in services/clusters/reads.py and the list in
services/clusters/lists.py, all known by this module's names too.

Each records intent in one transaction (placement included), then wakes the
reconciler, which does the runtime work (DESIGN.md rule 1). None of them calls a
runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy.orm import Session

from gpuyard.core.autoterm import Rule, deadlines, read_policy_as
from gpuyard.core.billing.pricing import RateParts, spot_floor
from gpuyard.core.errors import (
    Conflict,
    GpuyardError,
    ValidationFailed,
)
from gpuyard.core.ids import new_cluster_id
from gpuyard.core.image_refs import check_image
from gpuyard.core.models import (
    AnyAutoTerminatePolicy,
    AutoTerminatePolicy,
    CloudType,
    GpuTypeInfo,
)
from gpuyard.core.progress import STEP_ALLOCATED
from gpuyard.core.states import (
    Action,
    ClusterStatus,
)
from gpuyard.observability.crash_points import crash_point
from gpuyard.services.access.port_rules import check_external_ports, server_ports
from gpuyard.services.billing.admission import admit
from gpuyard.services.capacity.placement import assign_ports, claim
from gpuyard.services.capacity.placement_batch import placer_for
from gpuyard.services.catalog.gpu_types import find_gpu_type
from gpuyard.services.catalog.locations import check_location

# The room's other use cases live in their own modules; callers know them by this
# one's names too.
from gpuyard.services.clusters.actions import control_plane_stop as control_plane_stop
from gpuyard.services.clusters.actions import rename_cluster as rename_cluster
from gpuyard.services.clusters.actions import request_drain_stop as request_drain_stop
from gpuyard.services.clusters.actions import restart_cluster as restart_cluster
from gpuyard.services.clusters.actions import stop_cluster as stop_cluster
from gpuyard.services.clusters.actions import terminate_cluster as terminate_cluster
from gpuyard.services.clusters.autoterm_policy import merge_policy
from gpuyard.services.clusters.cluster_rows import (
    MAX_CONFLICT_RETRIES,
    refuse_worker,
    require_action,
)
from gpuyard.services.clusters.cluster_rows import load_cluster as load_cluster
from gpuyard.services.clusters.cluster_rows import owner_principal as owner_principal
from gpuyard.services.clusters.cluster_rows import request_of as request_of
from gpuyard.services.clusters.config import ports_of, start_changes, with_host_ports
from gpuyard.services.clusters.create_batch import cluster_values, fast_form
from gpuyard.services.clusters.host_checks import (
    refuse_exposed_private_ports as refuse_exposed_private_ports,
)
from gpuyard.services.clusters.host_checks import (
    refuse_unenforced_disk as refuse_unenforced_disk,
)
from gpuyard.services.clusters.host_checks import (
    refuse_unenforced_limits as refuse_unenforced_limits,
)
from gpuyard.services.clusters.lifecycle import (
    guarded_update,
    meter_status,
    record_event,
    transition_cluster,
)
from gpuyard.services.clusters.lists import ClusterPage as ClusterPage
from gpuyard.services.clusters.lists import list_clusters as list_clusters
from gpuyard.services.clusters.moves import place_for_start
from gpuyard.services.clusters.pending_starts import (
    call_off,
    defer_start,
    open_start,
)
from gpuyard.services.clusters.reads import event_page as event_page
from gpuyard.services.clusters.reads import get_cluster as get_cluster
from gpuyard.services.clusters.reads import list_events as list_events
from gpuyard.services.clusters.requests import AutoTerminateUpdate, CreateCluster, StartCluster
from gpuyard.services.clusters.snapshot_sources import check_fits, clone_source, restorable_for
from gpuyard.services.clusters.templates import merged_env, template_for_create, with_template
from gpuyard.services.clusters.views import cluster_rate, estimated_startup_seconds
from gpuyard.services.context import Context
from gpuyard.services.idempotency import Claim
from gpuyard.services.tenancy.account_secrets import check_cluster_references, check_references
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import project_for_create
from gpuyard.services.tenancy.registry_auths import checked_auth_id
from gpuyard.services.tenancy.secrets import seal_env, secret_box
from gpuyard.services.volumes.network_volumes import mount_for_cluster
from gpuyard.services.volumes.snapshots import (
    add_restore,
    add_snapshot,
    cluster_source,
    refuse_while_restoring,
    restore_target,
)
from gpuyard.store.schema import Cluster, GpuType, Host, Project, Snapshot


@dataclass(frozen=True)
class StartResult:
    cluster: Cluster
    configuration_updates_applied: list[str]
    previous_rate: float
    new_rate: float
    rate_change_reason: str | None
    # The snapshot taken before the changes (``snapshot_before_changes``).
    snapshot_before_changes: Snapshot | None = None


def resolve_gpu_type(session: Session, name: str | None, field: str = "gpu_type") -> GpuTypeInfo:
    if not name:
        raise ValidationFailed(field, "a GPU type is required when gpu_count > 0")
    info = find_gpu_type(session, name)
    if info is None:
        raise ValidationFailed(field, f"unknown GPU type {name!r}; see GET /v1/gpu-types")
    return info


def rate_of(
    session: Session, c: Cluster, ctx: Context, *, running: bool | None = None
) -> RateParts:
    gpu = find_gpu_type(session, c.gpu_type) if c.gpu_type else None
    return cluster_rate(c, gpu, ctx.settings.prices, running)


def spot_bid(gpu: GpuTypeInfo, gpu_count: int, cloud_type: CloudType, bid: float) -> float:
    """``bid`` (USD per GPU-hour, rounded to cents) if it meets the GPU type's spot
    floor; raises ValidationFailed naming ``bid_per_gpu`` otherwise."""
    if gpu_count < 1:
        raise ValidationFailed("bid_per_gpu", "a spot cluster needs at least one GPU")
    floor = spot_floor(gpu, cloud_type)
    bid = round(bid, 2)
    if bid < floor:
        raise ValidationFailed(
            "bid_per_gpu",
            f"bid {bid:.2f} USD/GPU-hour is below the spot floor {floor:.2f} for {gpu.id}",
            {"minimum": floor},
        )
    return bid


def checked_bid(
    gpu: GpuTypeInfo | None, gpu_count: int, cloud_type: CloudType, body: CreateCluster
) -> float:
    if gpu is None or body.bid_per_gpu is None:
        raise ValidationFailed("bid_per_gpu", "an interruptible cluster needs a GPU type and a bid")
    return spot_bid(gpu, gpu_count, cloud_type, body.bid_per_gpu)


def refuse_spent_policy(
    session: Session,
    policy_json: dict[str, Any],
    hourly_rate: float,
    now: datetime,
    model: type[AnyAutoTerminatePolicy] = AutoTerminatePolicy,
) -> None:
    """Refuse a start whose auto-termination limit would be reached before the cluster
    is even running (its cost or runtime limit is used up by the measured startup
    time): starting it would only bill for a start that is stopped at once. ``model``:
    the kind of policy stored (a cluster's, or a training cluster's)."""
    policy = read_policy_as(policy_json, model).policy
    if policy is None:
        return
    startup = timedelta(seconds=estimated_startup_seconds(session) or 0.0)
    plan = deadlines(policy, run_started_at=now, hourly_rate=hourly_rate, idle_since=None)
    if plan and plan[0].at <= now + startup:
        first = plan[0]
        limit = (
            f"cost limit {policy.cost_limit_usd:.2f} USD at {hourly_rate:.4f} USD/h"
            if first.rule == Rule.COST_LIMIT
            else f"max runtime {policy.max_runtime_hours:g} h"
        )
        raise ValidationFailed(
            "auto_terminate",
            f"the {limit} would be reached before the cluster is running "
            f"(starting takes about {startup.total_seconds():.0f} s); raise the limit",
            {"rule": first.rule.value, "startup_seconds": startup.total_seconds()},
        )


def create_cluster(
    ctx: Context,
    principal: Principal,
    body: CreateCluster,
    *,
    idempotency: Claim | None = None,
    location: str | None = None,
    serverless_endpoint_id: str | None = None,
    sealed_env: Mapping[str, str] | None = None,
    record_with: Callable[[Session, Cluster], None] | None = None,
) -> Cluster:
    """Validate, place and record a new cluster in ``starting``. Nothing is stored when
    placement fails (InsufficientCapacity). With ``idempotency`` its key is stored in
    the same transaction, before placement (see services/idempotency.py). ``location``
    pins it to the hosts of that location (GraphQL ``dataCenterId``); a location no
    host has is a ValidationFailed on ``location``.

    A serverless endpoint's scaler creates its workers here: ``serverless_endpoint_id``
    marks the cluster as that endpoint's (left out of the user's lists, refused to the
    user's actions), ``sealed_env`` is env as stored (sealed already: the endpoint's),
    laid under the body's, and ``record_with`` records the worker's own row in the
    same transaction, after placement and admission."""
    principal.require_write()
    if not body.docker_image and body.template_id is None:
        raise ValidationFailed("docker_image", "is required (or a template_id)")
    now = ctx.clock.now()
    gpu_count = body.gpu_count if body.gpu_count is not None else (1 if body.gpu_type else 0)
    step = partial(
        _record_create,
        ctx=ctx,
        principal=principal,
        body=body,
        gpu_count=gpu_count,
        now=now,
        idempotency=idempotency,
        location=location,
        serverless_endpoint_id=serverless_endpoint_id,
        sealed_env=sealed_env,
        record_with=record_with,
    )
    # The plain create has a fast form too: decided with the batch's other plain
    # creates in memory and written per table at once (services/clusters/create_batch.py).
    fast = fast_form(
        ctx,
        principal,
        body,
        gpu_count,
        now,
        idempotency,
        plain=location is None
        and serverless_endpoint_id is None
        and sealed_env is None
        and record_with is None,
    )
    # Recorded together with concurrent creates, in one transaction and commit
    # (services/capacity/placement_batch.py); answered after that commit.
    cluster = placer_for(ctx).run(ctx, step, fast)
    crash_point("create.idempotent_after_row" if idempotency else "create.after_row")
    ctx.wake()
    return cluster


def _record_create(
    session: Session,
    *,
    ctx: Context,
    principal: Principal,
    body: CreateCluster,
    gpu_count: int,
    now: datetime,
    idempotency: Claim | None,
    location: str | None,
    serverless_endpoint_id: str | None,
    sealed_env: Mapping[str, str] | None,
    record_with: Callable[[Session, Cluster], None] | None,
) -> Cluster:
    """create_cluster's recording step: validate, place and record the new cluster.
    Runs inside the caller's transaction, which holds the placement lock (the placer's
    batch); raises whatever refuses the create, having stored nothing it must keep."""
    project_id = project_for_create(session, principal, body.project_id)
    template = None
    # Credentials given by the create are named as its own field; a template's as
    # the template.
    auth_field = "registry_auth_id"
    if body.template_id is not None:
        account_id = session.get_one(Project, project_id).account_id
        template = template_for_create(session, principal, account_id, body.template_id)
        if "registry_auth_id" not in body.model_fields_set:
            auth_field = "template_id"
        body = with_template(body, template)
    # The engine connects to the registry an image names: only allowed registries.
    check_image(body.docker_image, ctx.settings.registry_policy, "docker_image")
    check_external_ports(body.ports, ctx.settings, "ports")
    check_references(session, principal.account_id, body.env.values(), "env")
    registry_auth_id = None
    if body.registry_auth_id is not None:
        # One of the new cluster's account's; another account's reads as unknown.
        account_id = session.get_one(Project, project_id).account_id
        registry_auth_id = checked_auth_id(session, account_id, body.registry_auth_id, auth_field)
    if location is not None:
        check_location(session, location)
    needs_gpu = gpu_count > 0 or body.gpu_type
    # Held for the step, as the host below: the rate and the meter read it again.
    _gpu_row = session.get(GpuType, body.gpu_type) if body.gpu_type else None
    gpu = resolve_gpu_type(session, body.gpu_type) if needs_gpu else None
    bid = checked_bid(gpu, gpu_count, body.cloud_type, body) if body.spot else None
    clone = clone_source(session, principal, body)
    # A clone's volume is at least its snapshot's source volume.
    volume_gb = max(body.volume_gb, clone.volume_gb) if clone else body.volume_gb
    if clone is not None:
        check_fits(clone, volume_gb, field="snapshot_id")
    # A network volume is mounted instead of a volume of its own (none is made,
    # reserved or billed: volume_gb is ignored); the cluster goes to its host.
    mounted = (
        mount_for_cluster(
            session,
            principal,
            body.network_volume_id,
            location,
            project_id if body.project_id is not None else None,
        )
        if body.network_volume_id
        else None
    )
    if mounted is not None:
        # A cluster lives in its network volume's project (named, or taken from it).
        project_id = mounted.project_id
        refuse_while_restoring(session, mounted.id)
        volume_gb = 0
    cluster_id = new_cluster_id()
    own_env = seal_env(secret_box(ctx.settings), body.env, body.secret_env)
    cluster = Cluster(
        **cluster_values(
            cluster_id=cluster_id,
            project_id=project_id,
            body=body,
            env={**(sealed_env or {}), **merged_env(template, own_env)},
            gpu=gpu,
            gpu_count=gpu_count,
            volume_gb=volume_gb,
            now=now,
            template_id=template.id if template is not None else None,
            network_volume_id=mounted.id if mounted is not None else None,
            registry_auth_id=registry_auth_id,
            serverless_endpoint_id=serverless_endpoint_id,
            bid=bid,
        )
    )
    session.add(cluster)
    session.flush()
    if idempotency is not None:
        idempotency.record(session, cluster_id, now)
    placement = claim(
        session,
        cluster_id=cluster_id,
        request=replace(request_of(cluster, body.cloud_type), location=location),
        volume_gb=volume_gb,
        ratios=ctx.settings.allocation_ratios,
        now=now,
        bid=bid,
        policy=ctx.settings.placement_policy,
        fresh=True,
        host_id=mounted.host_id if mounted is not None else None,
        not_enough_message=(
            f"not enough free resources on network volume {mounted.id}'s host"
            if mounted is not None
            else None
        ),
    )
    assigned = assign_ports(
        session,
        cluster_id=cluster_id,
        host_id=placement.host_id,
        ports=tuple(body.ports),
        port_range=(ctx.settings.port_range_start, ctx.settings.port_range_end),
        reserved=server_ports(ctx.settings),
        held=partial(ctx.ports_held, placement.host_id, cluster_id),
        fresh=True,
    )
    # Held for the rest of the step: the session's identity map keeps rows only while
    # something refers to them, and the checks and the meter below read this host.
    _host = session.get(Host, placement.host_id)
    refuse_unenforced_limits(session, ctx, placement.host_id)
    refuse_unenforced_disk(session, ctx, placement.host_id)
    cluster.ports = with_host_ports(tuple(body.ports), assigned)
    refuse_exposed_private_ports(session, ctx, placement.host_id, cluster.ports)
    cluster.host_id = placement.host_id
    cluster.gpu_indices = list(placement.gpu_indices)
    session.flush()
    admit(session, principal.account_id, project_id, cluster_id)
    refuse_spent_policy(
        session, cluster.auto_terminate, rate_of(session, cluster, ctx, running=True).total, now
    )
    record_event(session, cluster_id, now, "status", "created", None, ClusterStatus.STARTING.value)
    if clone is not None:
        # Its volume is made from the snapshot before its container starts.
        add_restore(
            session,
            cluster_id,
            clone,
            placement.host_id,
            restore_target(ctx.ownership.prefix, cluster_id),
            now,
        )
        record_event(session, cluster_id, now, "snapshot", f"cloned from snapshot {clone.id}")
    meter_status(session, cluster, ClusterStatus.STARTING, now)
    if record_with is not None:
        record_with(session, cluster)
    return cluster


def _check_secret_refs(
    ctx: Context, session: Session, cluster: Cluster, values: dict[str, Any]
) -> None:
    """Refuse a start whose env (as the start leaves it) refers to secrets the
    cluster's account does not have. Raises ValidationFailed."""
    env = values.get("env", cluster.env)
    field = "environment_updates" if "env" in values else "env"
    check_cluster_references(session, secret_box(ctx.settings), cluster.project_id, env, field)


def start_cluster(
    ctx: Context,
    principal: Principal,
    cluster_id: str,
    body: StartCluster,
    *,
    bid_per_gpu: float | None = None,
    acting_for: str | None = None,
) -> StartResult:
    """Start a stopped (or failed) cluster on its host, applying the body's changes.
    With ``bid_per_gpu`` it resumes as spot (interruptible at that bid); without, a
    spot cluster resumes on-demand.

    When the cluster's host cannot take it (full, cordoned, draining, unreachable) and
    ``body.allow_move``, it starts on another host and its volume is copied there first
    (services/clusters/moves.py).

    Raises InvalidState (not stopped), SnapshotNotFound, ValidationFailed,
    InsufficientCapacity ("not enough free GPUs on the host machine") or HostUnreachable
    (its volume is on a host that does not answer); in every error case nothing stored
    changes. A serverless worker's cluster is started by its endpoint's scaler only
    (``acting_for``: the endpoint's id); anyone else is refused with WorkerCluster.
    """
    principal.require_write()
    upd = body.update_configuration
    if upd is not None and upd.docker_image is not None:
        field = "update_configuration.docker_image"
        check_image(upd.docker_image, ctx.settings.registry_policy, field)
    if body.port_mapping_updates:
        check_external_ports(body.port_mapping_updates, ctx.settings, "port_mapping_updates")
    for _ in range(MAX_CONFLICT_RETRIES):
        now = ctx.clock.now()
        try:
            # One transaction: a start either waits for the stop in progress (kept as
            # the desired state) or is placed now.
            with ctx.transaction() as session:
                cluster = load_cluster(session, principal, cluster_id)
                refuse_worker(cluster, acting_for)
                require_action(cluster, Action.START)
                if cluster.status == ClusterStatus.STOPPING.value:
                    # Desired state, not a race: kept and applied once the stop is done.
                    # The body's own errors answer now; placement waits for the stop.
                    restorable_for(session, principal, cluster, body)
                    values, _, _ = start_changes(cluster, body, secret_box(ctx.settings))
                    _check_secret_refs(ctx, session, cluster, values)
                    if bid_per_gpu is not None:
                        count = values.get("gpu_count", cluster.gpu_count)
                        gpu = resolve_gpu_type(session, cluster.gpu_type)
                        spot_bid(gpu, count, CloudType(cluster.cloud_type), bid_per_gpu)
                    rate = rate_of(session, cluster, ctx, running=True).total
                    defer_start(ctx, session, cluster, body, bid_per_gpu, now)
                    result = StartResult(cluster, [], rate, rate, None)
                    deferred = True
                else:
                    result = _start_now(ctx, session, principal, cluster, body, bid_per_gpu, now)
                    deferred = False
        except Conflict:
            continue
        if not deferred:
            crash_point("start.after_request")
        ctx.wake()
        return result
    raise Conflict(f"cluster {cluster_id} keeps changing; retry")


def _start_now(
    ctx: Context,
    session: Session,
    principal: Principal,
    cluster: Cluster,
    body: StartCluster,
    bid_per_gpu: float | None,
    now: datetime,
) -> StartResult:
    """The start of ``cluster`` (loaded in ``session``, not stopping) with the body's
    changes: placed, its ports assigned, ``starting``. Raises as start_cluster does."""
    restore = restorable_for(session, principal, cluster, body)
    # Taken of the volume as it rests, before anything changes it (the
    # driver starts nothing on the volume until it is done).
    before = (
        add_snapshot(
            session,
            principal.account_id,
            cluster_source(ctx, session, cluster),
            f"before-start-{now.strftime('%Y%m%d-%H%M%S')}",
            "taken by a start with snapshot_before_changes",
            now,
        )
        if body.snapshot_before_changes
        else None
    )
    # Detached: proposed changes must reach the row only through the funnel.
    session.expunge(cluster)
    previous = rate_of(session, cluster, ctx, running=True).total
    values, applied, reasons = start_changes(cluster, body, secret_box(ctx.settings))
    _check_secret_refs(ctx, session, cluster, values)
    if bid_per_gpu is not None:
        gpu = resolve_gpu_type(session, cluster.gpu_type)
        count = values.get("gpu_count", cluster.gpu_count)
        bid = spot_bid(gpu, count, CloudType(cluster.cloud_type), bid_per_gpu)
        values.update(interruptible=True, bid_per_gpu=bid)
        applied.append(f"bid_per_gpu: {bid:.2f}")
        reasons.append("Spot bid")
    elif cluster.interruptible:
        # A plain resume is on-demand: the cluster is no longer preemptible.
        values.update(interruptible=False, bid_per_gpu=None)
        applied.append("interruptible: true -> false")
        reasons.append("On-demand resume")
    for column, value in values.items():
        setattr(cluster, column, value)
    gpu_count = cluster.gpu_count
    # On its own host; else (full, cordoned, unreachable) on another one,
    # its volume moved there, unless the body says not to.
    placement = place_for_start(
        session,
        ctx,
        cluster,
        now,
        allow_move=body.allow_move,
        not_enough_message="not enough free GPUs on the host machine"
        if gpu_count
        else "not enough free resources on the host machine",
        bid=cluster.bid_per_gpu if cluster.interruptible else None,
    )
    if cluster.network_volume_id is not None:
        # Checked under the placement lock, which its restore takes too.
        refuse_while_restoring(session, cluster.network_volume_id)
    if restore is not None:
        check_fits(restore, values.get("volume_gb", cluster.volume_gb))
        add_restore(
            session,
            cluster.id,
            restore,
            placement.host_id,
            restore_target(ctx.ownership.prefix, cluster.id),
            now,
            after_snapshot_id=before.id if before is not None else None,
        )
        applied.append(f"restore_from_snapshot: {restore.id} ({restore.name})")
    specs = ports_of(cluster)
    assigned = assign_ports(
        session,
        cluster_id=cluster.id,
        host_id=placement.host_id,
        ports=specs,
        port_range=(ctx.settings.port_range_start, ctx.settings.port_range_end),
        reserved=server_ports(ctx.settings),
        held=partial(ctx.ports_held, placement.host_id, cluster.id),
    )
    values["ports"] = cluster.ports = with_host_ports(specs, assigned)
    version = transition_cluster(
        session,
        cluster,
        ClusterStatus.STARTING,
        "start requested" + (f" ({'; '.join(applied)})" if applied else ""),
        now,
        desired_status=ClusterStatus.RUNNING.value,
        startup_step=STEP_ALLOCATED,
        start_initiated_at=now,
        error_message=None,
        pending_start=None,
        gpu_indices=list(placement.gpu_indices),
        host_id=placement.host_id,
        **values,
    )
    cluster.status = ClusterStatus.STARTING.value
    cluster.version = version
    cluster.startup_step = STEP_ALLOCATED
    cluster.start_initiated_at = now
    cluster.error_message = None
    cluster.gpu_indices = list(placement.gpu_indices)
    cluster.host_id = placement.host_id
    new = rate_of(session, cluster, ctx, running=True).total
    refuse_spent_policy(session, cluster.auto_terminate, new, now)
    admit(session, principal.account_id, cluster.project_id, cluster.id)
    reason = ", ".join(reasons) if reasons and new != previous else None
    return StartResult(cluster, applied, previous, new, reason, before)


def update_auto_terminate(
    ctx: Context, principal: Principal, cluster_id: str, update: AutoTerminateUpdate
) -> Cluster:
    """Change a cluster's auto-termination policy in any status but terminated. On a
    running cluster it applies to the current run at once: a limit the run has
    already passed fires on the reconciler's next pass."""
    principal.require_write()
    for _ in range(MAX_CONFLICT_RETRIES):
        now = ctx.clock.now()
        try:
            with ctx.transaction() as session:
                cluster = load_cluster(session, principal, cluster_id)
                refuse_worker(cluster)
                if cluster.status in (ClusterStatus.TERMINATING, ClusterStatus.TERMINATED):
                    require_action(cluster, Action.TERMINATE)  # raises INVALID_STATE
                session.expunge(cluster)
                policy = merge_policy(cluster.auto_terminate, update)
                cluster.version = guarded_update(
                    session, cluster.id, cluster.version, now, auto_terminate=policy
                )
                cluster.auto_terminate = policy
                record_event(
                    session, cluster.id, now, "auto_terminate",
                    "policy updated: " + ", ".join(sorted(update.model_fields_set)),
                )  # fmt: skip
        except Conflict:
            continue
        ctx.wake()
        return cluster
    raise Conflict(f"cluster {cluster_id} keeps changing; retry")


def start_drained(ctx: Context, cluster_id: str) -> str | None:
    """Start a cluster a drain stopped, on another host. Returns why it cannot (it
    stays stopped, its volume where it is), or None."""
    with ctx.read() as session:
        principal = owner_principal(session, cluster_id)
    if principal is None:
        return None
    try:
        start_cluster(ctx, principal, cluster_id, StartCluster())
    except GpuyardError as exc:
        return exc.message
    return None


def start_pending(ctx: Context, cluster_id: str) -> None:
    """Start a stopped cluster whose start was requested while it was stopping, with
    that request's body, through the normal start (its placement, capacity, spend and
    admission checks happen now). A start that cannot be made (no capacity, a spent
    policy, ...) is called off with its reason in the events; the cluster stays
    stopped. A conflict is left for the next pass."""
    with ctx.read() as session:
        principal = owner_principal(session, cluster_id)
        cluster = session.get(Cluster, cluster_id)
        if principal is None or cluster is None or cluster.pending_start is None:
            return
        if cluster.status != ClusterStatus.STOPPED.value:
            return
        stored = cluster.pending_start
    body, bid = open_start(secret_box(ctx.settings), stored)
    crash_point("start.pending_before_start")
    try:
        start_cluster(ctx, principal, cluster_id, body, bid_per_gpu=bid)
    except Conflict:
        return
    except GpuyardError as exc:
        with ctx.transaction() as session:
            row = session.get(Cluster, cluster_id)
            if row is not None and row.pending_start == stored:
                call_off(session, row, ctx.clock.now(), f"pending start failed: {exc.message}")
        ctx.wake()
