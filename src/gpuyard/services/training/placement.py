"""Where a training cluster's nodes go: every node claims its GPUs, vCPUs and memory on
one host of the cluster's location, all nodes at once or none (the caller's
transaction), under the placement lock the caller holds.

A cluster goes on one host when one can take it all (``binpack``, the default); when
none can, or under ``spread``, its nodes are placed across the location's hosts, each
on a host with room for it: ``binpack`` fills one host before the next (nodes stay
together where they can), ``spread`` puts each node on the host holding the fewest of
the cluster's nodes. Nodes on several hosts share one network through an overlay
between the hosts (runtimes/slurm/overlay.py), so a cluster that spans hosts has a subnet of
its own (core/training/network.py) and each node a fixed address in it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import InsufficientCapacity
from gpuyard.core.fleet import HostStatus, PlacementPolicy
from gpuyard.core.models import PortSpec, ResourceRequest
from gpuyard.core.placement import free_resources
from gpuyard.core.states import ClusterStatus
from gpuyard.core.training import clusters as domain
from gpuyard.core.training import network as training_network
from gpuyard.core.training.clusters import NodeName, NodeRole, NodeStatus
from gpuyard.services.access.port_rules import server_ports
from gpuyard.services.capacity.candidates import candidate_hosts
from gpuyard.services.capacity.placement import assign_ports, claim
from gpuyard.services.catalog.locations import check_location
from gpuyard.services.context import Context
from gpuyard.services.fleet.hosts import capacities
from gpuyard.services.training.nodes import (
    NodePlan,
    meter_node,
    node_request,
    nodes_of,
    plan_of,
)
from gpuyard.store.schema import Host, TrainingCluster, TrainingNode

SSH_PORT = 22
# Engines whose hosts run no command for us (tcp://): their nodes cannot join an
# overlay, so a cluster spans only hosts reached over ssh:// or this machine's socket
# (and this machine only with an address the other hosts reach).
_NO_COMMANDS = ("tcp://", "https://", "http://")


def location_hosts(
    ctx: Context, session: Session, location: str, plan: NodePlan, workers: int
) -> list[int]:
    """The hosts of ``location`` to try for the whole cluster on one host, best first:
    those that take placements (active, healthy) with room for every node at once,
    ordered by the placement policy (a few, however large the location); when none has
    room as things stand, every host there that takes placements (claims may preempt
    spot clusters). Raises ValidationFailed for a location no host is at."""
    check_location(session, location)
    need = ResourceRequest(
        gpu_type=plan.gpu_type,
        gpu_count=workers * plan.gpus_per_node,
        vcpus=workers * plan.cpus_per_node + domain.CONTROLLER_VCPUS,
        memory_gb=workers * plan.memory_gb_per_node + domain.CONTROLLER_MEMORY_GB,
        disk_gb=0,
        location=location,
    )
    ratios, policy = ctx.settings.allocation_ratios, ctx.settings.placement_policy
    hosts = [h.host_id for h in candidate_hosts(session, need, ratios, policy)]
    return hosts or active_hosts(session, location)


def active_hosts(session: Session, location: str, *, spanning: bool = False) -> list[int]:
    """Every host of ``location`` that takes placements (active, healthy), by id;
    ``spanning``: only those whose nodes can join an overlay."""
    query = select(Host.id, Host.engine_url, Host.address).where(
        Host.location == location,
        Host.healthy.is_(True),
        Host.status == HostStatus.ACTIVE.value,
    )
    rows = session.execute(query.order_by(Host.id)).all()
    return [host_id for host_id, url, address in rows if not spanning or _joins(url, address)]


def _joins(engine_url: str | None, address: str) -> bool:
    """Whether a host can be one end of an overlay: commands run there (not tcp://) and
    the other hosts reach it at its address (not a loopback one, as this machine's is
    until GPUYARD_PUBLIC_ADDRESS names another)."""
    if str(engine_url or "").lower().startswith(_NO_COMMANDS):
        return False
    try:
        return not ipaddress.ip_address(address).is_loopback
    except ValueError:
        return True  # a name: resolved where the overlay is made


def hosts_without_overlay(session: Session, location: str) -> frozenset[int]:
    """The hosts of ``location`` a node of a cluster that spans hosts cannot go to (no
    command runs there to join the overlay: a tcp:// engine)."""
    every = set(session.scalars(select(Host.id).where(Host.location == location)))
    return frozenset(every - set(active_hosts(session, location, spanning=True)))


def assign_subnet(ctx: Context, session: Session, cluster: TrainingCluster) -> None:
    """Give ``cluster`` a subnet of its own from the installation's pool (one no live
    training cluster of this installation uses). Raises InsufficientCapacity when the
    pool is full."""
    pool = ctx.settings.training_subnets or training_network.default_pool(ctx.ownership.short)
    used = session.scalars(
        select(TrainingCluster.subnet).where(
            TrainingCluster.deleted_at.is_(None),
            TrainingCluster.subnet.is_not(None),
            TrainingCluster.id != cluster.id,
        )
    )
    subnet = training_network.pick_subnet(pool, [u for u in used if u])
    if subnet is None:
        raise InsufficientCapacity(
            f"every training network of the pool {pool} is in use "
            "(GPUYARD_TRAINING_SUBNETS sets a larger one)"
        )
    cluster.subnet = subnet


def place_node(
    ctx: Context,
    session: Session,
    cluster: TrainingCluster,
    role: NodeRole,
    name: str,
    host_id: int,
    now: datetime,
) -> TrainingNode:
    """Record node ``name`` on ``host_id`` with its claim, its address and its meter.
    Raises InsufficientCapacity when it does not fit there (call it in a savepoint)."""
    node = TrainingNode(
        cluster_id=cluster.id,
        role=role.value,
        name=name,
        status=NodeStatus.CREATING.value,
        host_id=host_id,
        gpu_indices=[],
        image_version_id=cluster.image_version_id,
        created_at=now,
    )
    if cluster.subnet is not None:
        node.address = _address(session, cluster, role)
    session.add(node)
    session.flush()
    plan = plan_of(cluster)
    placement = claim(
        session,
        cluster_id=domain.node_owner(node.id),
        request=node_request(role, plan),
        volume_gb=0,
        ratios=ctx.settings.allocation_ratios,
        now=now,
        host_id=host_id,
    )
    node.gpu_indices = list(placement.gpu_indices)
    meter_node(session, cluster, node, ClusterStatus.RUNNING, now)
    return node


def _address(session: Session, cluster: TrainingCluster, role: NodeRole) -> str:
    assert cluster.subnet is not None
    if role == NodeRole.CONTROLLER:
        return training_network.controller_address(cluster.subnet)
    taken = [n.address for n in nodes_of(session, cluster.id) if n.address]
    address = training_network.worker_address(cluster.subnet, taken)
    if address is None:
        raise InsufficientCapacity(f"the cluster's network {cluster.subnet} has no address left")
    return address


def place_all(
    ctx: Context, session: Session, cluster: TrainingCluster, hosts: list[int], now: datetime
) -> None:
    """Place the controller and ``cluster.next_worker - 1`` workers: on the first of
    ``hosts`` that takes them all (``binpack``), else across the location's hosts; and
    the cluster's SSH port on the controller's host. Raises InsufficientCapacity with
    what each host has free when they fit nowhere (nothing is held)."""
    names = NodeName(cluster.id, cluster.name_prefix)
    workers = cluster.next_worker - 1
    spread = ctx.settings.placement_policy == PlacementPolicy.SPREAD
    last: InsufficientCapacity | None = None
    for host_id in [] if spread and workers > 1 else hosts:
        savepoint = session.begin_nested()
        try:
            place_node(ctx, session, cluster, NodeRole.CONTROLLER, names.controller, host_id, now)
            for index in range(1, workers + 1):
                place_node(
                    ctx, session, cluster, NodeRole.WORKER, names.worker(index), host_id, now
                )
            _ssh_port(ctx, session, cluster, host_id)
        except InsufficientCapacity as exc:
            savepoint.rollback()
            last = exc
            continue
        savepoint.commit()
        return
    spanning = active_hosts(session, cluster.location, spanning=True)
    savepoint = session.begin_nested()
    try:
        controller = _place_somewhere(
            ctx, session, cluster, NodeRole.CONTROLLER, names.controller, spanning, now
        )
        for index in range(1, workers + 1):
            _place_somewhere(
                ctx, session, cluster, NodeRole.WORKER, names.worker(index), spanning, now
            )
        _ssh_port(ctx, session, cluster, controller.host_id)
    except InsufficientCapacity as exc:
        savepoint.rollback()
        raise short_of(
            ctx,
            session,
            cluster,
            spanning or hosts,
            workers=workers,
            with_controller=True,
            what=f"in location {cluster.location!r} for a controller and {workers} worker(s)",
            cause=exc if spanning else last,
        ) from exc
    savepoint.commit()


def add_workers(
    ctx: Context, session: Session, cluster: TrainingCluster, extra: int, now: datetime
) -> list[int]:
    """Place ``extra`` more workers on any host of the location with room (binpack:
    the cluster's own hosts first); only on its current hosts for a cluster without a
    subnet of its own, or with a node on a host that cannot join an overlay. All or
    nothing; raises InsufficientCapacity saying what each host has free. Returns the
    new nodes' ids."""
    names = NodeName(cluster.id, cluster.name_prefix)
    current = sorted({n.host_id for n in nodes_of(session, cluster.id) if n.host_id is not None})
    rows = session.execute(select(Host.engine_url, Host.address).where(Host.id.in_(current)))
    spans = cluster.subnet is not None and all(_joins(url, address) for url, address in rows)
    hosts = active_hosts(session, cluster.location, spanning=True) if spans else current
    added: list[int] = []
    savepoint = session.begin_nested()
    try:
        for index in range(cluster.next_worker, cluster.next_worker + extra):
            node = _place_somewhere(
                ctx, session, cluster, NodeRole.WORKER, names.worker(index), hosts, now
            )
            added.append(node.id)
    except InsufficientCapacity as exc:
        savepoint.rollback()
        where = "on the location's hosts" if cluster.subnet else "on the cluster's host"
        raise short_of(
            ctx,
            session,
            cluster,
            hosts,
            workers=extra,
            with_controller=False,
            what=f"{where} for {extra} more worker(s); nothing was added",
            cause=exc,
        ) from exc
    savepoint.commit()
    return added


def _ssh_port(
    ctx: Context, session: Session, cluster: TrainingCluster, host_id: int | None
) -> None:
    """The cluster's SSH entry: a port of the controller's host."""
    assert host_id is not None
    ports = assign_ports(
        session,
        cluster_id=domain.cluster_owner(cluster.id),
        host_id=host_id,
        ports=(PortSpec(internal_port=SSH_PORT),),
        port_range=(ctx.settings.port_range_start, ctx.settings.port_range_end),
        reserved=server_ports(ctx.settings),
    )
    cluster.host_id = host_id
    cluster.ssh_port = ports[(SSH_PORT, "tcp")]


def _host_order(
    ctx: Context, session: Session, cluster: TrainingCluster, hosts: Sequence[int]
) -> list[int]:
    """``hosts`` in the order a node of ``cluster`` tries them: ``binpack`` the hosts
    already holding most of its nodes first, then the ones with most free GPUs of its
    type (so its nodes stay on as few hosts as they can); ``spread`` the hosts holding
    the fewest of its nodes first."""
    held: dict[int, int] = {}
    for node in nodes_of(session, cluster.id):
        if node.host_id is not None:
            held[node.host_id] = held.get(node.host_id, 0) + 1
    ratios = ctx.settings.allocation_ratios
    free = {
        h.host_id: free_resources(h, ratios)["gpus"].get(cluster.gpu_type, 0)
        for h in capacities(session, list(hosts))
    }
    if ctx.settings.placement_policy == PlacementPolicy.SPREAD:
        return sorted(hosts, key=lambda h: (held.get(h, 0), -free.get(h, 0), h))
    return sorted(hosts, key=lambda h: (-held.get(h, 0), -free.get(h, 0), h))


def _place_somewhere(
    ctx: Context,
    session: Session,
    cluster: TrainingCluster,
    role: NodeRole,
    name: str,
    hosts: Sequence[int],
    now: datetime,
) -> TrainingNode:
    """Place one node on the first host (in :func:`_host_order`) it fits on; a cluster
    that gets a second host gets its own subnet first. Raises InsufficientCapacity
    when it fits on none."""
    last: InsufficientCapacity | None = None
    for host_id in _host_order(ctx, session, cluster, hosts):
        savepoint = session.begin_nested()
        try:
            node = place_node(ctx, session, cluster, role, name, host_id, now)
        except InsufficientCapacity as exc:
            savepoint.rollback()
            last = exc
            continue
        savepoint.commit()
        return node
    raise last or InsufficientCapacity(f"no host of location {cluster.location!r} takes nodes")


def short_of(
    ctx: Context,
    session: Session,
    cluster: TrainingCluster,
    host_ids: Sequence[int],
    *,
    workers: int,
    with_controller: bool,
    what: str,
    cause: InsufficientCapacity | None,
) -> InsufficientCapacity:
    """The error for nodes that fit on none of ``host_ids``, alone or spread: what they
    need in all and per node, against what each host has free. Call it after the failed
    attempt's claims were rolled back, so ``available`` is what the user could really
    have."""
    plan = plan_of(cluster)
    needed = {
        "gpu_type": plan.gpu_type,
        "gpus": workers * plan.gpus_per_node,
        "vcpus": workers * plan.cpus_per_node + (domain.CONTROLLER_VCPUS if with_controller else 0),
        "memory_gb": workers * plan.memory_gb_per_node
        + (domain.CONTROLLER_MEMORY_GB if with_controller else 0),
    }
    per_node = {
        "gpus": plan.gpus_per_node,
        "vcpus": plan.cpus_per_node,
        "memory_gb": plan.memory_gb_per_node,
    }
    ratios = ctx.settings.allocation_ratios
    details: dict[str, Any] = {
        "needed_gpus": needed["gpus"],
        "needed": needed,
        "needed_per_worker": per_node,
        "available": [free_resources(h, ratios) for h in capacities(session, list(host_ids))],
    }
    if cause is not None:
        details["reason"] = cause.message
    message = (
        f"not enough free capacity {what}: they need {needed['gpus']}x {plan.gpu_type}, "
        f"{needed['vcpus']} vCPUs and {needed['memory_gb']} GB of memory in all, "
        f"each worker {plan.gpus_per_node} GPU(s), {plan.cpus_per_node} vCPUs and "
        f"{plan.memory_gb_per_node} GB on one host"
    )
    if with_controller:
        message += (
            f" (the controller takes {domain.CONTROLLER_VCPUS} vCPUs and "
            f"{domain.CONTROLLER_MEMORY_GB} GB)"
        )
    return InsufficientCapacity(message, details)
