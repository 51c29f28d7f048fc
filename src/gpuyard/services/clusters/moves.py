"""Moving a cluster to another host: the store's side.

A stopped cluster whose host is full, cordoned or unreachable is started on another host
that can take it (``place_for_start``), and a draining host's clusters are sent away
(``drain_host``). The data path (a tar stream between helper containers on the two
engines) is the reconciler's (``ClusterDriver``); here the decisions are recorded:

- the claim on the new host and a ``volume_moves`` row (``copying``) are written in the
  transaction that accepts the start, and the cluster's ``host_id`` points at the new
  host from then on; the old host's disk for the volume stays counted until the move
  ends (services/fleet/hosts.py capacities);
- ``copied``: the data is on the new host; the old copy is deleted once the cluster
  runs there (a stopped cluster's move: at once), then ``done``;
- ``failed``: the cluster goes back to its old host, where its data still is.

A volume on an unreachable host cannot be read: such a start answers 409
``HOST_UNREACHABLE`` and changes nothing (never a silent start on an empty volume).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import HostNotFound, HostUnreachable, InsufficientCapacity
from gpuyard.core.fleet import HostStatus
from gpuyard.core.models import CloudType, Placement, ResourceRequest
from gpuyard.core.states import ClusterStatus
from gpuyard.observability.crash_points import crash_point
from gpuyard.services.capacity.placement import claim, lock_placement
from gpuyard.services.clusters.actions import request_drain_stop
from gpuyard.services.clusters.cluster_rows import cuda_of, request_of
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal, Scope
from gpuyard.services.training.drain import TrainingDrain, drain_training_nodes
from gpuyard.store.schema import Cluster, Host, Reservation, VolumeMove

COPYING = "copying"
COPIED = "copied"
DONE = "done"
FAILED = "failed"
# Moves whose source copy still exists (counted on the old host's disk).
IN_FLIGHT = (COPYING, COPIED)
# The status reason a drain stops a running cluster with: a cluster stopped so is
# started again on another host by the drain, one a user stopped only has its volume
# moved.
DRAIN_STOP = "draining host"


def volume_of(ctx: Context, cluster: Cluster) -> str:
    """The cluster's engine volume on its current host."""
    return cluster.volume_name or ctx.ownership.volume(cluster.id)


def _host_label(host: Host | None, host_id: int) -> str:
    return f"{host.name} (#{host_id})" if host is not None else f"#{host_id}"


def place_for_start(
    session: Session,
    ctx: Context,
    cluster: Cluster,
    now: datetime,
    *,
    allow_move: bool,
    not_enough_message: str,
    bid: float | None,
) -> Placement:
    """Claim the cluster's GPUs on its own host; when that host cannot take it (full,
    cordoned, draining, unreachable) and ``allow_move``, on another host, recording the
    volume's move there. Raises InsufficientCapacity (nothing fits, or moving is not
    allowed) or HostUnreachable (the volume cannot be read); nothing changes then."""
    old_host = cluster.host_id
    # Taken outside the SAVEPOINTs below: held to the commit whichever claim succeeds
    # (a lock taken inside one is given back with its rollback), and asked for once
    # in the transaction (the admission check after the start's claim takes it too).
    lock_placement(session)
    try:
        with session.begin_nested():
            return _claim(session, ctx, cluster, now, old_host, not_enough_message, bid)
    except InsufficientCapacity as exc:
        # A network volume lives on its host: a cluster mounting it never leaves.
        if not allow_move or old_host is None or cluster.network_volume_id is not None:
            raise
        host = session.get(Host, old_host)
        if cluster.volume_gb > 0 and host is not None and not host.healthy:
            raise HostUnreachable(
                f"the cluster's host {_host_label(host, old_host)} does not answer, so its "
                "volume cannot be moved; start it again once the host is back, or "
                "terminate it",
                {
                    "host_id": old_host,
                    "host_name": host.name,
                    "unreachable_since": host.unreachable_since.isoformat()
                    if host.unreachable_since
                    else None,
                    "last_heartbeat_at": host.last_heartbeat_at.isoformat()
                    if host.last_heartbeat_at
                    else None,
                },
            ) from exc
        try:
            with session.begin_nested():
                placement = _claim(
                    session, ctx, cluster, now, None, None, bid, exclude=frozenset({old_host})
                )
        except InsufficientCapacity as elsewhere:
            raise InsufficientCapacity(
                f"{exc.message}, and no other host can take the cluster",
                {**(exc.details or {}), "elsewhere": elsewhere.details},
            ) from elsewhere
        why = _why_not_here(host, exc.message)
        if cluster.volume_gb > 0:
            begin_move(session, ctx, cluster, placement.host_id, f"start: {why}", now)
        else:
            record_event(
                session,
                cluster.id,
                now,
                "moved",
                f"starts on host #{placement.host_id} instead of #{old_host} ({why}); "
                "it has no volume to move",
            )
        return placement


def _claim(
    session: Session,
    ctx: Context,
    cluster: Cluster,
    now: datetime,
    host_id: int | None,
    message: str | None,
    bid: float | None,
    exclude: frozenset[int] = frozenset(),
) -> Placement:
    return claim(
        session,
        cluster_id=cluster.id,
        request=request_of(cluster),
        volume_gb=cluster.volume_gb,
        ratios=ctx.settings.allocation_ratios,
        host_id=host_id,
        not_enough_message=message,
        now=now,
        bid=bid,
        exclude_hosts=exclude,
        policy=ctx.settings.placement_policy,
    )


def _why_not_here(host: Host | None, message: str) -> str:
    if host is None:
        return "its host is gone"
    if not host.healthy:
        return f"host {host.name} is unreachable"
    if host.status != HostStatus.ACTIVE:
        return f"host {host.name} is {host.status}"
    return f"host {host.name}: {message}"


def begin_move(
    session: Session, ctx: Context, cluster: Cluster, to_host_id: int, reason: str, now: datetime
) -> None:
    """Record that ``cluster``'s volume goes from its host to ``to_host_id`` (the claim
    there is the caller's). Replaces a finished or failed earlier move's row."""
    assert cluster.host_id is not None
    old = session.get(VolumeMove, cluster.id)
    if old is not None:
        session.delete(old)
        session.flush()
    session.add(
        VolumeMove(
            cluster_id=cluster.id,
            from_host_id=cluster.host_id,
            to_host_id=to_host_id,
            volume_gb=cluster.volume_gb,
            source_volume=volume_of(ctx, cluster),
            reason=reason,
            status=COPYING,
            bytes_copied=0,
            started_at=now,
        )
    )
    src, dst = session.get(Host, cluster.host_id), session.get(Host, to_host_id)
    record_event(
        session,
        cluster.id,
        now,
        "moved",
        f"moving volume from host {_host_label(src, cluster.host_id)} to host "
        f"{_host_label(dst, to_host_id)} ({reason})",
    )


def pending_move(ctx: Context, cluster_id: str) -> VolumeMove | None:
    """The cluster's move whose data is not copied yet, if any."""
    with ctx.read() as session:
        move = pending_move_in(session, cluster_id)
        if move is not None:
            session.expunge(move)
        return move


def pending_move_in(session: Session, cluster_id: str) -> VolumeMove | None:
    """:func:`pending_move`, read in ``session`` (still attached to it)."""
    move = session.get(VolumeMove, cluster_id)
    return move if move is not None and move.status == COPYING else None


def record_progress(ctx: Context, cluster_id: str, copied: int) -> None:
    with ctx.transaction() as session:
        move = session.get(VolumeMove, cluster_id)
        if move is not None and move.status == COPYING:
            move.bytes_copied = copied


def finish_copy(
    session: Session, cluster_id: str, copied: int, seconds: float, now: datetime
) -> None:
    """The data is on the new host: say from where to where, how much, how long."""
    move = session.get(VolumeMove, cluster_id)
    if move is None:
        return
    move.status, move.bytes_copied, move.seconds = COPIED, copied, seconds
    src, dst = session.get(Host, move.from_host_id), session.get(Host, move.to_host_id)
    rate = copied / seconds / 1e6 if seconds > 0 else 0.0
    record_event(
        session,
        cluster_id,
        now,
        "moved",
        f"volume moved from host {_host_label(src, move.from_host_id)} to host "
        f"{_host_label(dst, move.to_host_id)}: {copied} bytes in {seconds:.1f} s "
        f"({rate:.1f} MB/s)",
    )


def fail_move(session: Session, cluster_id: str, error: str, now: datetime) -> int | None:
    """The copy failed: the cluster's volume (and reservation) go back to the old host,
    where its data still is. Returns the old host's id (the cluster's host again)."""
    move = session.get(VolumeMove, cluster_id)
    if move is None:
        return None
    move.status, move.error, move.finished_at = FAILED, error[:2000], now
    reservation = session.get(Reservation, cluster_id)
    if reservation is not None:
        reservation.host_id = move.from_host_id
    return move.from_host_id


def copies_to_delete(
    ctx: Context, host_ids: tuple[int, ...] | None, cluster_id: str | None = None
) -> list[VolumeMove]:
    """Moves whose old copy can go now (on ``host_ids``; None: any host; only
    ``cluster_id``'s when given): the data is copied and the cluster runs on its new
    host, or rests there."""
    settled = [
        ClusterStatus.RUNNING.value,
        ClusterStatus.STOPPED.value,
        ClusterStatus.ERROR.value,
        ClusterStatus.TERMINATED.value,
    ]
    with ctx.read() as session:
        q = (
            select(VolumeMove)
            .join(Cluster, Cluster.id == VolumeMove.cluster_id)
            .where(VolumeMove.status == COPIED, Cluster.status.in_(settled))
        )
        if host_ids is not None:
            q = q.where(VolumeMove.from_host_id.in_(host_ids))
        if cluster_id is not None:
            q = q.where(VolumeMove.cluster_id == cluster_id)
        rows = list(session.scalars(q))
        session.expunge_all()
    return rows


def old_copy_deleted(ctx: Context, cluster_id: str) -> None:
    now = ctx.clock.now()
    with ctx.transaction() as session:
        move = session.get(VolumeMove, cluster_id)
        if move is None or move.status != COPIED:
            return
        move.status, move.finished_at = DONE, now
        record_event(
            session,
            cluster_id,
            now,
            "moved",
            f"old copy of the volume deleted from host #{move.from_host_id}",
        )


@dataclass
class DrainReport:
    host_id: int
    status: str
    stopping: list[str] = field(default_factory=list)
    moving: list[str] = field(default_factory=list)
    cannot_move: list[dict[str, str]] = field(default_factory=list)
    training: TrainingDrain = field(default_factory=TrainingDrain)


def drain_host(ctx: Context, principal: Principal, host_id: int) -> DrainReport:
    """(Admin.) Cordon the host and send its clusters away: running ones are stopped (then
    started on another host by the reconciler: ``restart_drained``), stopped ones have
    their volume moved. Clusters that cannot move are listed with the reason. Its
    training workers are recreated on other hosts of their location, and the nodes
    that cannot move are listed with the reason (services/training/drain.py)."""
    principal.require(Scope.ADMIN)
    now = ctx.clock.now()
    with ctx.transaction() as session:
        lock_placement(session)  # a create alongside sees the host before or after
        host = session.get(Host, host_id)
        if host is None:
            raise HostNotFound(f"host {host_id} not found", {"host_id": host_id})
        host.status = HostStatus.DRAINING.value
        clusters = list(
            session.scalars(
                select(Cluster)
                .where(
                    Cluster.host_id == host_id,
                    Cluster.status != ClusterStatus.TERMINATED.value,
                )
                .order_by(Cluster.id)
            )
        )
    crash_point("drain.after_cordon")
    report = DrainReport(host_id=host_id, status=HostStatus.DRAINING.value)
    for cluster in clusters:
        status = ClusterStatus(cluster.status)
        if status in (ClusterStatus.RUNNING, ClusterStatus.STARTING, ClusterStatus.PENDING):
            request_drain_stop(ctx, cluster.id, f"{DRAIN_STOP} {host_id}")
            report.stopping.append(cluster.id)
        elif status in (ClusterStatus.STOPPED, ClusterStatus.ERROR):
            problem = move_resting(ctx, cluster.id, f"{DRAIN_STOP} {host_id}", now)
            if problem is None:
                report.moving.append(cluster.id)
            else:
                report.cannot_move.append({"cluster_id": cluster.id, "reason": problem})
        elif status == ClusterStatus.STOPPING:
            report.stopping.append(cluster.id)
    report.training = drain_training_nodes(ctx, host_id)
    ctx.wake()
    return report


def move_resting(ctx: Context, cluster_id: str, reason: str, now: datetime) -> str | None:
    """Move a stopped cluster's volume to another host (it stays stopped). Returns why
    it cannot, or None when the move is recorded (or nothing needs moving)."""
    with ctx.transaction() as session:
        cluster = session.get(Cluster, cluster_id)
        if cluster is None or cluster.host_id is None:
            return None
        move = session.get(VolumeMove, cluster_id)
        if move is not None and move.status in IN_FLIGHT:
            return None  # already on its way
        if cluster.network_volume_id is not None:
            return f"it mounts network volume {cluster.network_volume_id}, which lives on this host"
        old_host = cluster.host_id
        try:
            with session.begin_nested():
                placement = claim(
                    session,
                    cluster_id=cluster.id,
                    request=_volume_only(cluster),
                    volume_gb=cluster.volume_gb,
                    ratios=ctx.settings.allocation_ratios,
                    host_id=None,
                    now=now,
                    exclude_hosts=frozenset({old_host}),
                    policy=ctx.settings.placement_policy,
                )
        except InsufficientCapacity as exc:
            return f"no other host has {cluster.volume_gb} GB of disk free ({exc.message})"
        if cluster.volume_gb > 0:
            begin_move(session, ctx, cluster, placement.host_id, reason, now)
        cluster.host_id = placement.host_id
        cluster.gpu_indices = []
        cluster.version += 1
        cluster.updated_at = now
    return None


def _volume_only(cluster: Cluster) -> ResourceRequest:
    """A request for the volume's disk only (a stopped cluster holds no compute)."""
    return ResourceRequest(
        gpu_type=None,
        gpu_count=0,
        vcpus=0,
        memory_gb=0,
        disk_gb=0,
        cloud_type=CloudType.ALL,
        # It starts where its volume goes.
        **cuda_of(cluster),
    )


def resting_moves(session: Session) -> list[tuple[str, int]]:
    """(cluster id, new host id) of the volume moves of resting clusters (a drain),
    which run on their new host's lanes."""
    return [
        (cluster_id, to_host)
        for cluster_id, to_host in session.execute(
            select(VolumeMove.cluster_id, VolumeMove.to_host_id)
            .join(Cluster, Cluster.id == VolumeMove.cluster_id)
            .where(
                VolumeMove.status == COPYING,
                Cluster.status.in_([ClusterStatus.STOPPED.value, ClusterStatus.ERROR.value]),
            )
        )
    ]
