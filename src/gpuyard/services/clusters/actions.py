"""Stop, restart and terminate: a user's (``stop_cluster`` ...) or the control
plane's own (``control_plane_stop``: a drain, a suspension, a spent budget). Each
records the transition in one transaction and wakes the reconciler, which does the
runtime work (DESIGN.md rule 1). And the one change that needs no start: a new name
(``rename_cluster``)."""

from __future__ import annotations

import contextlib
from typing import Any

from gpuyard.core.errors import Conflict, InvalidState, ValidationFailed
from gpuyard.core.input_rules import check_name
from gpuyard.core.progress import STEP_ALLOCATED
from gpuyard.core.states import Action, ClusterStatus
from gpuyard.observability.crash_points import crash_point
from gpuyard.services.clusters.cluster_rows import (
    ANY_ENDPOINT,
    MAX_CONFLICT_RETRIES,
    load_cluster,
    owner_principal,
    refuse_worker,
    require_action,
)
from gpuyard.services.clusters.lifecycle import guarded_update, record_event, transition_cluster
from gpuyard.services.clusters.pending_starts import call_off, has_pending_start
from gpuyard.services.context import Context
from gpuyard.services.tenancy.account_secrets import check_cluster_references
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.secrets import secret_box
from gpuyard.store.schema import Cluster


def _act(
    ctx: Context,
    principal: Principal,
    cluster_id: str,
    action: Action,
    target: ClusterStatus,
    reason: str,
    desired: ClusterStatus,
    *,
    acting_for: str | None = None,
    **values: Any,
) -> Cluster:
    principal.require_write()
    for _ in range(MAX_CONFLICT_RETRIES):
        now = ctx.clock.now()
        try:
            with ctx.transaction() as session:
                cluster = load_cluster(session, principal, cluster_id)
                refuse_worker(cluster, acting_for)
                if action is Action.STOP and has_pending_start(cluster):
                    # A stop while a start waits for the stop to finish calls it off.
                    call_off(session, cluster, now)
                else:
                    require_action(cluster, action)
                    if action is Action.RESTART:
                        # A restart recreates the container: its secrets must exist
                        # (refused now, the running container kept, rather than failed).
                        box = secret_box(ctx.settings)
                        check_cluster_references(
                            session, box, cluster.project_id, cluster.env, "env"
                        )
                    session.expunge(cluster)
                    cluster.version = transition_cluster(
                        session, cluster, target, reason, now,
                        desired_status=desired.value, pending_start=None, **values,
                    )  # fmt: skip
                    cluster.status = target.value
                    cluster.desired_status = desired.value
                    cluster.pending_start = None
                    for column, value in values.items():
                        setattr(cluster, column, value)
        except Conflict:
            continue
        ctx.wake()
        return cluster
    raise Conflict(f"cluster {cluster_id} keeps changing; retry")


def stop_cluster(ctx: Context, principal: Principal, cluster_id: str) -> Cluster:
    stopping = _act(
        ctx,
        principal,
        cluster_id,
        Action.STOP,
        ClusterStatus.STOPPING,
        "stop requested",
        ClusterStatus.STOPPED,
    )
    crash_point("stop.after_request")
    return stopping


def restart_cluster(ctx: Context, principal: Principal, cluster_id: str) -> Cluster:
    """Recreate the container in place (container disk wiped, volume and GPUs kept).
    Raises ValidationFailed (and the container keeps running) when its env refers to
    a secret the account no longer has."""
    return _act(
        ctx,
        principal,
        cluster_id,
        Action.RESTART,
        ClusterStatus.STARTING,
        "restart requested",
        ClusterStatus.RUNNING,
        startup_step=STEP_ALLOCATED,
        start_initiated_at=ctx.clock.now(),
    )


def terminate_cluster(ctx: Context, principal: Principal, cluster_id: str) -> Cluster:
    terminating = _act(
        ctx,
        principal,
        cluster_id,
        Action.TERMINATE,
        ClusterStatus.TERMINATING,
        "terminate requested",
        ClusterStatus.TERMINATED,
    )
    crash_point("terminate.after_request")
    return terminating


# A create's bound (services/clusters/requests.py ``CreateCluster.name``).
MAX_NAME_CHARS = 200


def rename_cluster(ctx: Context, principal: Principal, cluster_id: str, name: str) -> Cluster:
    """Give the cluster a new name (the input rules of a create's name), in any status
    but terminated; its container is untouched. Raises ValidationFailed on ``name``,
    InvalidState once it is terminating or terminated."""
    principal.require_write()
    try:
        name = check_name(name)
    except ValueError as exc:
        raise ValidationFailed("name", str(exc)) from None
    if not name or len(name) > MAX_NAME_CHARS:
        raise ValidationFailed("name", f"must be 1 to {MAX_NAME_CHARS} characters")
    for _ in range(MAX_CONFLICT_RETRIES):
        now = ctx.clock.now()
        try:
            with ctx.transaction() as session:
                cluster = load_cluster(session, principal, cluster_id)
                refuse_worker(cluster)
                if cluster.status in (ClusterStatus.TERMINATING, ClusterStatus.TERMINATED):
                    require_action(cluster, Action.TERMINATE)  # raises INVALID_STATE
                if cluster.name == name:
                    return cluster
                session.expunge(cluster)
                old = cluster.name
                cluster.version = guarded_update(
                    session, cluster.id, cluster.version, now, name=name
                )
                cluster.name = name
                record_event(session, cluster.id, now, "renamed", f"renamed from {old!r}")
        except Conflict:
            continue
        ctx.wake()
        return cluster
    raise Conflict(f"cluster {cluster_id} keeps changing; retry")


def request_drain_stop(ctx: Context, cluster_id: str, reason: str) -> None:
    """Stop a cluster because its host drains (the reconciler starts it again on
    another host once it has stopped: ``restart_drained``)."""
    control_plane_stop(ctx, cluster_id, reason)


def control_plane_stop(ctx: Context, cluster_id: str, reason: str) -> None:
    """Stop a cluster for the control plane's own reason (a drain, a suspension, a
    spent budget), named in its events; its volume is kept. A cluster that is no
    longer running (stopping already, stopped, terminated) is left as it is."""
    with ctx.read() as session:
        principal = owner_principal(session, cluster_id)
    if principal is None:
        return
    # InvalidState: it moved on meanwhile (stopping already, terminated).
    with contextlib.suppress(InvalidState):
        _act(
            ctx,
            principal,
            cluster_id,
            Action.STOP,
            ClusterStatus.STOPPING,
            reason,
            ClusterStatus.STOPPED,
            acting_for=ANY_ENDPOINT,
        )


def endpoint_stop(ctx: Context, cluster_id: str, endpoint_id: str, reason: str) -> bool:
    """Stop a worker cluster of ``endpoint_id`` for its scaler (flashboot: the container
    and volume are kept for a fast start). Returns False when it was not running (it
    moved on meanwhile, or is no cluster of the endpoint's account)."""
    return _endpoint_act(ctx, cluster_id, endpoint_id, Action.STOP, reason)


def endpoint_terminate(ctx: Context, cluster_id: str, endpoint_id: str, reason: str) -> bool:
    """Terminate a worker cluster of ``endpoint_id`` for its scaler. Returns False when
    it could not be (terminated already, or no cluster of the endpoint's account)."""
    return _endpoint_act(ctx, cluster_id, endpoint_id, Action.TERMINATE, reason)


def _endpoint_act(
    ctx: Context, cluster_id: str, endpoint_id: str, action: Action, reason: str
) -> bool:
    with ctx.read() as session:
        principal = owner_principal(session, cluster_id)
    if principal is None:
        return False
    if action is Action.STOP:
        target, desired = ClusterStatus.STOPPING, ClusterStatus.STOPPED
    else:
        target, desired = ClusterStatus.TERMINATING, ClusterStatus.TERMINATED
    try:
        _act(ctx, principal, cluster_id, action, target, reason, desired, acting_for=endpoint_id)
    except InvalidState:
        return False
    return True
