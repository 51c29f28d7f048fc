"""Claiming and releasing capacity in the store.

Every claim runs inside the caller's transaction and starts by bumping the single
placement-lock row, which serialises placements across threads and API replicas on
SQLite and PostgreSQL alike. The unique keys on GPU and port rows stay the backstop.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace
from datetime import datetime

from sqlalchemy import delete, event, select, update
from sqlalchemy.orm import Session

from gpuyard.core.billing import spot
from gpuyard.core.errors import InsufficientCapacity, PortInUse, ValidationFailed
from gpuyard.core.fleet import PlacementPolicy, takes_placements
from gpuyard.core.models import CloudType, HostCapacity, Placement, PortSpec, ResourceRequest
from gpuyard.core.placement import AllocationRatios, cuda_satisfies, insufficient, place
from gpuyard.core.states import HOLDS_COMPUTE, ClusterStatus
from gpuyard.services.capacity.candidates import (
    CANDIDATES,
    asks_cuda,
    candidate_hosts,
    cuda_versions,
    nearest_hosts,
    placeable,
)
from gpuyard.services.capacity.fleet_hint import FleetHint, hint_for
from gpuyard.services.clusters.lifecycle import transition_cluster
from gpuyard.services.fleet.hosts import capacities
from gpuyard.store.schema import (
    Cluster,
    GpuAllocation,
    Host,
    PlacementLock,
    PortAllocation,
    Reservation,
)

# Statuses in which an interruptible cluster can be preempted (not already leaving).
PREEMPTIBLE = (ClusterStatus.PENDING, ClusterStatus.STARTING, ClusterStatus.RUNNING)


_LOCK = update(PlacementLock).where(PlacementLock.id == 1).values(counter=PlacementLock.counter + 1)

# session.info keys. _LOCKED: the root transaction that holds the placement lock (taken
# outside any SAVEPOINT, so no rollback to one gives it back). _REFRESHED: the root
# transaction whose hint was refreshed. BATCH_TOUCHED: set by the placer in batches
# (services/capacity/placement_batch.py) around each create's SAVEPOINT, the hosts its
# claims told the hint about (re-read when the SAVEPOINT rolls back).
_LOCKED = "gpuyard.placement_locked"
_REFRESHED = "gpuyard.hint_refreshed"
BATCH_TOUCHED = "gpuyard.placement_batch_touched"


def lock_placement(session: Session) -> None:
    """Take the placement lock in the caller's transaction (runs inside the caller's
    transaction); once taken outside a SAVEPOINT, a second call is free."""
    root = session.get_transaction()
    if root is not None and session.info.get(_LOCKED) is root:
        return
    session.execute(_LOCK)
    if root is not None and not session.in_nested_transaction():
        session.info[_LOCKED] = root


def claim(
    session: Session,
    *,
    cluster_id: str,
    request: ResourceRequest,
    volume_gb: int,
    ratios: AllocationRatios,
    now: datetime,
    host_id: int | None = None,
    not_enough_message: str | None = None,
    bid: float | None = None,
    exclude_hosts: frozenset[int] = frozenset(),
    policy: PlacementPolicy = PlacementPolicy.BINPACK,
    fresh: bool = False,
) -> Placement:
    """Place ``request`` and record the GPU allocations and reservation for
    ``cluster_id``: on ``host_id`` when given (a stopped cluster's volume lives there),
    else on the host ``policy`` scores best among those that take placements (active,
    healthy), match the request's cloud type and location and are not in
    ``exclude_hosts`` (e.g. the host a cluster moves away from). Only a few candidate
    hosts are loaded (services/capacity/candidates.py), however large the fleet.

    A pinned host that is cordoned, draining or unreachable fails at once with an
    InsufficientCapacity that says so (``details.host_status``/``reachable``), so the
    caller can decide to move the cluster.

    When nothing is free, interruptible clusters bidding less than ``bid`` (None:
    on-demand, which outbids every spot bid) are preempted: moved to ``stopping``
    with the reason, their compute released in this same transaction; the caller
    wakes the reconciler, which stops their containers (volumes kept).

    The cluster's own existing reservation, if any, is replaced (``fresh``: the
    cluster is new and holds none, so none is looked for). Raises
    InsufficientCapacity with what was asked and what is free.
    """
    lock_placement(session)
    hint = hint_for(session)
    # The cluster's own volume is already counted in its host's used disk (not in
    # another host's: a cluster moving there brings its whole volume).
    own = None if fresh else session.get(Reservation, cluster_id)
    if own is not None:
        # A new cluster holds nothing yet: only an existing one has compute to drop.
        release_compute(session, cluster_id, mark=False)
        session.flush()
        hint.dirty.add(own.host_id)
    stays = own is not None and (host_id in (None, own.host_id) and not exclude_hosts)
    own_volume = own.volume_gb if own is not None and stays else 0
    pinned = host_id is not None
    sized = ResourceRequest(
        gpu_type=request.gpu_type,
        gpu_count=request.gpu_count,
        vcpus=request.vcpus,
        memory_gb=request.memory_gb,
        disk_gb=request.disk_gb + max(0, volume_gb - own_volume),
        # A pinned host was chosen before (its cloud type and location included).
        cloud_type=CloudType.ALL if pinned else request.cloud_type,
        location=None if pinned else request.location,
        # Kept for a pinned host too: its driver may have changed since.
        min_cuda_version=request.min_cuda_version,
        allowed_cuda_versions=request.allowed_cuda_versions,
    )
    if host_id is not None:
        if host_id in exclude_hosts:
            raise InsufficientCapacity("the cluster's host is not available", {"host_id": host_id})
        hosts = capacities(session, [host_id])
        refuse_unplaceable(session, host_id)
    else:
        hosts = _candidates(session, hint, sized, ratios, policy, exclude_hosts, now)
    try:
        placement = place(hosts, sized, ratios, policy)
    except InsufficientCapacity as exc:
        pool = hosts if pinned else _spot_pool(session, sized, bid, exclude_hosts)
        holders = load_holders(session, [h.host_id for h in pool], exclude=cluster_id)
        room = spot.plan(pool, holders, sized, bid, ratios)
        if room is None:
            shown = (
                hosts if pinned else nearest_hosts(session, sized, ratios, exclude=exclude_hosts)
            )
            # The caller's words are about free resources: a host whose CUDA version
            # falls short gets placement's own, which say so.
            cuda_ok = all(
                cuda_satisfies(h.cuda_version, sized.min_cuda_version, sized.allowed_cuda_versions)
                for h in shown
            )
            message = not_enough_message if cuda_ok else None
            raise insufficient(shown, sized, ratios, message) from exc
        preempt(session, room.victims, by=cluster_id, bid=bid, now=now)
        placement = room.placement
    for index in placement.gpu_indices:
        session.add(
            GpuAllocation(host_id=placement.host_id, gpu_index=index, cluster_id=cluster_id)
        )
    if own is None:
        session.add(
            Reservation(
                cluster_id=cluster_id,
                host_id=placement.host_id,
                vcpus=request.vcpus,
                memory_gb=request.memory_gb,
                container_disk_gb=request.disk_gb,
                volume_gb=volume_gb,
            )
        )
    else:
        own.host_id = placement.host_id
        own.vcpus, own.memory_gb = request.vcpus, request.memory_gb
        own.container_disk_gb, own.volume_gb = request.disk_gb, volume_gb
    session.flush()
    _remember(session, hint, hosts, placement, request, volume_gb - own_volume, ratios)
    return placement


def _candidates(
    session: Session,
    hint: FleetHint,
    req: ResourceRequest,
    ratios: AllocationRatios,
    policy: PlacementPolicy,
    exclude: frozenset[int],
    now: datetime,
) -> list[HostCapacity]:
    """A few hosts ``req`` fits on, best first under ``policy``, with exact figures:
    the hint's best until they read back exact (services/capacity/fleet_hint.py), else the
    database's candidate query."""
    if _hintless_savepoint(session) or asks_cuda(req):
        # A savepoint may roll back without the hint hearing of it: no hint here (the
        # placer's batches tell it). The hint knows no CUDA versions: the database
        # filters on them.
        return candidate_hosts(session, req, ratios, policy, exclude=exclude)
    ready_hint(session, hint, ratios, now)
    for _ in range(4):
        ids = hint.pick(req, policy, exclude, CANDIDATES)
        if not ids:
            break
        exact = capacities(session, ids)
        if not hint.update(exact, ratios):
            return exact
    hosts = candidate_hosts(session, req, ratios, policy, exclude=exclude)
    hint.update(hosts, ratios)
    return hosts


def ready_hint(session: Session, hint: FleetHint, ratios: AllocationRatios, now: datetime) -> None:
    """Bring ``hint`` up to date inside the caller's locked transaction: refreshed once
    per transaction (services/capacity/fleet_hint.py), then only the hosts marked dirty
    since are read again."""
    root = session.get_transaction()
    if session.info.get(_REFRESHED) is root:
        # Refreshed already in this locked transaction (a batch): only hosts marked
        # since then are read again.
        with hint.lock:
            dirty, hint.dirty = list(hint.dirty), set()
        if dirty:
            hint.update(capacities(session, dirty), ratios)
    else:
        hint.refresh(session, ratios, now)
        session.info[_REFRESHED] = root


def _remember(
    session: Session,
    hint: FleetHint,
    hosts: list[HostCapacity],
    placement: Placement,
    request: ResourceRequest,
    added_volume_gb: int,
    ratios: AllocationRatios,
) -> None:
    """Tell the hint what the claim took (or, when it cannot say exactly, that the
    host must be read again); a rollback of the transaction invalidates the hint."""
    before = next((h for h in hosts if h.host_id == placement.host_id), None)
    if _hintless_savepoint(session) or before is None:
        hint.dirty.add(placement.host_id)
        return
    after = replace(
        before,
        used_gpu_indices=before.used_gpu_indices | set(placement.gpu_indices),
        used_vcpus=before.used_vcpus + request.vcpus,
        used_memory_gb=before.used_memory_gb + request.memory_gb,
        used_disk_gb=before.used_disk_gb + request.disk_gb + max(0, added_volume_gb),
    )
    hint.update([after], ratios)
    touched = session.info.get(BATCH_TOUCHED)
    if touched is not None:
        # The placer re-reads these hosts if the SAVEPOINT rolls back, and rebuilds the
        # hint if the whole batch does.
        touched.add(placement.host_id)
        return
    event.listen(session, "after_rollback", lambda _s: hint.invalidate(), once=True)


def _hintless_savepoint(session: Session) -> bool:
    """In a SAVEPOINT whose rollback the hint would not hear of (any but the placer's)."""
    return session.in_nested_transaction() and BATCH_TOUCHED not in session.info


def refuse_unplaceable(session: Session, host_id: int) -> None:
    """Raise InsufficientCapacity saying why, when ``host_id`` is gone or takes no new
    clusters: cordoned or draining (the operator's word) or unreachable (missed
    heartbeats)."""
    host = session.get(Host, host_id)
    if host is None:
        raise InsufficientCapacity("the cluster's host is gone", {"host_id": host_id})
    if takes_placements(host.status, host.healthy):
        return
    why = "unreachable" if not host.healthy else host.status
    raise InsufficientCapacity(
        f"the cluster's host {host.name} (#{host_id}) is {why} and takes no new clusters",
        {"host_id": host_id, "host_status": host.status, "reachable": host.healthy},
    )


def _spot_pool(
    session: Session, req: ResourceRequest, bid: float | None, exclude: frozenset[int]
) -> list[HostCapacity]:
    """The hosts where preempting spot clusters could make room for ``req`` at ``bid``:
    those (taking placements, in its cloud type and location) that hold a cluster
    bidding less. Bounded by the hosts running spot clusters, not the fleet."""
    outbid = select(Reservation.host_id).join(Cluster, Cluster.id == Reservation.cluster_id)
    outbid = outbid.where(
        Cluster.interruptible.is_(True),
        Cluster.status.in_([s.value for s in PREEMPTIBLE]),
    )
    if bid is not None:
        outbid = outbid.where(Cluster.bid_per_gpu < bid)
    q = placeable(select(Host.id), req, exclude, cuda_versions(session, req))
    q = q.where(Host.id.in_(outbid))
    ids = list(session.scalars(q.order_by(Host.id)))
    return capacities(session, ids) if ids else []


def load_holders(session: Session, host_ids: list[int], exclude: str) -> list[spot.Holder]:
    """Clusters holding compute on these hosts. Only interruptible clusters that are
    not already leaving carry a bid (and so can be preempted)."""
    rows = session.execute(
        select(
            Cluster.id,
            Cluster.status,
            Cluster.interruptible,
            Cluster.bid_per_gpu,
            Cluster.gpu_indices,
            Reservation.host_id,
            Reservation.vcpus,
            Reservation.memory_gb,
            Reservation.container_disk_gb,
        )
        .join(Reservation, Reservation.cluster_id == Cluster.id)
        .where(
            Reservation.host_id.in_(host_ids),
            Cluster.id != exclude,
            Cluster.status.in_([s.value for s in HOLDS_COMPUTE]),
        )
    )
    # Only clusters can be preempted; other holders (training nodes) are already
    # counted in each host's used capacity.
    holders = [
        spot.Holder(
            cluster_id=r.id,
            host_id=r.host_id,
            gpu_indices=tuple(r.gpu_indices),
            vcpus=r.vcpus,
            memory_gb=r.memory_gb,
            container_disk_gb=r.container_disk_gb,
            bid_per_gpu=r.bid_per_gpu
            if r.interruptible and ClusterStatus(r.status) in PREEMPTIBLE
            else None,
        )
        for r in rows
    ]
    return holders


def preempt(
    session: Session,
    victims: tuple[spot.Holder, ...],
    *,
    by: str,
    bid: float | None,
    now: datetime,
) -> None:
    """Move each victim to ``stopping`` (reason names the winner and both prices) and
    release its compute now, so the winner's claim can take it."""
    winner = "an on-demand request" if bid is None else f"a bid of {bid:.2f} USD/GPU-hour"
    for victim in victims:
        cluster = session.get(Cluster, victim.cluster_id)
        if cluster is None:
            continue
        session.expunge(cluster)
        reason = (
            f"preempted by cluster {by} ({winner} outbid {victim.bid_per_gpu:.2f} USD/GPU-hour)"
        )
        transition_cluster(
            session,
            cluster,
            ClusterStatus.STOPPING,
            reason,
            now,
            desired_status=ClusterStatus.STOPPED.value,
        )
        release_compute(session, victim.cluster_id)


def release_compute(session: Session, cluster_id: str, *, mark: bool = True) -> None:
    """Free GPUs, vCPUs, memory and container disk; keep the volume's disk and ports.
    ``mark``: tell this process's fleet hint to read the host again."""
    if mark:
        _mark_host_of(session, cluster_id)
    session.execute(delete(GpuAllocation).where(GpuAllocation.cluster_id == cluster_id))
    session.execute(
        update(Reservation)
        .where(Reservation.cluster_id == cluster_id)
        .values(vcpus=0, memory_gb=0, container_disk_gb=0)
    )


def _mark_host_of(session: Session, cluster_id: str) -> None:
    host_id = session.scalar(
        select(Reservation.host_id).where(Reservation.cluster_id == cluster_id)
    )
    if host_id is not None:
        hint_for(session).dirty.add(host_id)


def release_all(session: Session, cluster_id: str) -> None:
    """Free everything the cluster holds (terminate)."""
    _mark_host_of(session, cluster_id)
    session.execute(delete(GpuAllocation).where(GpuAllocation.cluster_id == cluster_id))
    session.execute(delete(Reservation).where(Reservation.cluster_id == cluster_id))
    session.execute(delete(PortAllocation).where(PortAllocation.cluster_id == cluster_id))


def assign_ports(
    session: Session,
    *,
    cluster_id: str,
    host_id: int,
    ports: tuple[PortSpec, ...],
    port_range: tuple[int, int],
    reserved: frozenset[int] = frozenset(),
    held: Callable[[], frozenset[tuple[int, str]]] | None = None,
    fresh: bool = False,
) -> dict[tuple[int, str], int]:
    """(Re)assign host ports for ``ports``; returns ``(internal, transport) -> external``.

    A port the cluster already had for the same internal port and transport is kept,
    so addresses stay stable across stop/start. ``external_port`` > 0 claims exactly
    that port (409 PORT_IN_USE if another cluster holds it). A port in ``reserved`` (the server's
    own) is never assigned. ``held`` asks the host which ports something else holds
    there (Context.ports_held); it is asked only for a port the user chose, which
    then answers 409 PORT_IN_USE at once. A port gpuyard chooses is checked against
    the host when the cluster starts (reconciler/clusters/port_moves.py), outside this
    transaction. ``fresh``: the cluster holds no ports yet (a create), so there is
    nothing to keep or free first.
    """
    held_now: frozenset[tuple[int, str]] | None = None

    def on_host(port: int, transport: str) -> bool:
        nonlocal held_now
        if held is None:
            return False
        if held_now is None:
            held_now = held()
        return (port, transport) in held_now

    lock_placement(session)
    if fresh and not ports:
        return {}
    previous: dict[tuple[int, str], int] = {}
    if not fresh:
        rows = list(
            session.scalars(select(PortAllocation).where(PortAllocation.cluster_id == cluster_id))
        )
        kept = ports_kept(rows, ports, host_id)
        if kept is not None:
            return kept
        previous = {(r.internal_port, r.protocol): r.port for r in rows}
        session.execute(delete(PortAllocation).where(PortAllocation.cluster_id == cluster_id))
        session.flush()
    taken = {
        (r.port, r.protocol)
        for r in session.execute(
            select(PortAllocation.port, PortAllocation.protocol).where(
                PortAllocation.host_id == host_id
            )
        )
    }
    result: dict[tuple[int, str], int] = {}
    for spec in ports:
        key = (spec.internal_port, spec.transport)
        if key in result:
            raise ValidationFailed(
                "ports", f"internal port {spec.internal_port}/{spec.transport} listed twice"
            )
        if spec.external_port:
            if (spec.external_port, spec.transport) in taken:
                raise PortInUse(
                    f"host port {spec.external_port}/{spec.transport} is already in use",
                    {"external_port": spec.external_port},
                )
            if on_host(spec.external_port, spec.transport):
                raise PortInUse(
                    f"host port {spec.external_port}/{spec.transport} is in use on the host "
                    "(held outside this cluster); choose another, or 0 to let gpuyard "
                    "assign one",
                    {"external_port": spec.external_port},
                )
            port = spec.external_port
        else:
            keep = previous.get(key)
            port = keep if keep and (keep, spec.transport) not in taken else 0
            if not port:
                port = free_port(taken, spec.transport, port_range, reserved)
            if not port:
                raise InsufficientCapacity("no free host port left in the configured range")
        taken.add((port, spec.transport))
        result[key] = port
        session.add(
            PortAllocation(
                host_id=host_id,
                port=port,
                protocol=spec.transport,
                cluster_id=cluster_id,
                internal_port=spec.internal_port,
            )
        )
    session.flush()
    return result


def ports_kept(
    rows: Collection[PortAllocation], ports: tuple[PortSpec, ...], host_id: int
) -> dict[tuple[int, str], int] | None:
    """What :func:`assign_ports` would answer for a cluster that keeps every port it
    holds (``rows``): all on ``host_id``, exactly one per port of ``ports``, each of
    gpuyard's choice. Then nothing changes (a row's key is the host, port and
    transport: no other cluster holds any of them), so its rows stay as they are
    instead of being deleted and written again. None when anything would change."""
    keys = [(spec.internal_port, spec.transport) for spec in ports]
    if any(spec.external_port for spec in ports) or len(set(keys)) != len(keys):
        return None
    held = {(r.internal_port, r.protocol): r for r in rows}
    if len(held) != len(rows) or set(held) != set(keys):
        return None
    if any(r.host_id != host_id for r in rows):
        return None
    return {key: held[key].port for key in keys}


def free_port(
    taken: Collection[tuple[int, str]],
    transport: str,
    port_range: tuple[int, int],
    reserved: Collection[int],
) -> int:
    """The lowest port of ``port_range`` for ``transport`` that is neither ``taken``
    (``(port, transport)`` pairs) nor ``reserved``; 0 when none is left."""
    return next(
        (
            p
            for p in range(port_range[0], port_range[1] + 1)
            if (p, transport) not in taken and p not in reserved
        ),
        0,
    )
