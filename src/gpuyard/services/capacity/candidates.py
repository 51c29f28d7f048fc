"""Candidate hosts for a placement, filtered and ordered by the database.

A fleet may have thousands of hosts; a placement must not load them all. One query
computes each host's free GPUs of the asked type, vCPUs, memory and disk (under the
allocation ratios) from the claim rows themselves (``gpu_allocations``,
``reservations``, in-flight ``volume_moves`` on their source host), keeps the hosts
that take placements (active, healthy), match the cloud type and location and have
enough free, orders them as the policy scores them (core/placement.py
``policy_key``) and returns the first few. Only those are loaded exactly
(services/fleet/hosts.py ``capacities``) for the pure decision.

Correct under concurrency because it runs inside the claim's transaction after the
placement lock (services/capacity/placement.py): no other claim commits between this read
and the caller's inserts, on SQLite and PostgreSQL alike; the unique keys on GPU and
port rows stay the backstop.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, select
from sqlalchemy.orm import Session

from gpuyard.core.fleet import HostStatus, PlacementPolicy
from gpuyard.core.models import CloudType, HostCapacity, ResourceRequest
from gpuyard.core.placement import AllocationRatios, cuda_satisfies
from gpuyard.services.fleet.hosts import MOVES_IN_FLIGHT, capacities
from gpuyard.store.schema import GpuAllocation, Host, HostGpu, Reservation, VolumeMove

# How many candidates are loaded exactly. The first is the policy's choice unless the
# exact figures disagree with the database's at a rounding edge; the rest are spares.
CANDIDATES = 4
# core/placement.py rounds free figures to 2 decimals: the database's filter is this
# much looser so a host the exact check accepts is never filtered out.
_SLACK = 0.01


def _free_figures(ratios: AllocationRatios, gpu_type: str | None) -> dict[str, ColumnElement[Any]]:
    """Per host (correlated with ``hosts``): free GPUs of ``gpu_type`` and free vCPUs,
    memory and disk under the ratios."""
    used_vcpus = (
        select(func.coalesce(func.sum(Reservation.vcpus), 0))
        .where(Reservation.host_id == Host.id)
        .scalar_subquery()
    )
    used_memory = (
        select(func.coalesce(func.sum(Reservation.memory_gb), 0))
        .where(Reservation.host_id == Host.id)
        .scalar_subquery()
    )
    used_disk = (
        select(func.coalesce(func.sum(Reservation.container_disk_gb + Reservation.volume_gb), 0))
        .where(Reservation.host_id == Host.id)
        .scalar_subquery()
    )
    moving = (
        select(func.coalesce(func.sum(VolumeMove.volume_gb), 0))
        .where(VolumeMove.from_host_id == Host.id, VolumeMove.status.in_(MOVES_IN_FLIGHT))
        .scalar_subquery()
    )
    figures: dict[str, ColumnElement[Any]] = {
        "vcpus": Host.vcpus * ratios.vcpu - used_vcpus,
        "memory_gb": Host.memory_gb * ratios.memory - used_memory,
        "disk_gb": Host.disk_gb * ratios.disk - used_disk - moving,
    }
    if gpu_type is not None:
        figures["gpus"] = (
            select(func.count())
            .select_from(HostGpu)
            .outerjoin(
                GpuAllocation,
                and_(
                    GpuAllocation.host_id == HostGpu.host_id,
                    GpuAllocation.gpu_index == HostGpu.gpu_index,
                ),
            )
            .where(
                HostGpu.host_id == Host.id,
                HostGpu.gpu_type == gpu_type,
                GpuAllocation.host_id.is_(None),
            )
            .scalar_subquery()
        )
    return figures


def asks_cuda(req: ResourceRequest) -> bool:
    """Whether ``req`` asks for a CUDA driver version."""
    return req.min_cuda_version is not None or req.allowed_cuda_versions is not None


def cuda_versions(session: Session, req: ResourceRequest) -> list[str] | None:
    """The CUDA driver versions hosts have that meet ``req``'s (core/placement.py
    ``cuda_satisfies``; None: it asks for none). The comparison is numeric ("12.10" is
    above "12.4"), so the database is given the few distinct versions that qualify."""
    if not asks_cuda(req):
        return None
    known = session.scalars(
        select(Host.cuda_version).where(Host.cuda_version.is_not(None)).distinct()
    )
    return sorted(
        v
        for v in known
        if v is not None and cuda_satisfies(v, req.min_cuda_version, req.allowed_cuda_versions)
    )


def placeable(
    q: Select[int],
    req: ResourceRequest,
    exclude: Collection[int],
    cuda: Collection[str] | None = None,
) -> Select[int]:
    """``q`` narrowed to hosts that take placements in the request's cloud type and
    location, less ``exclude``, and (``cuda`` not None) whose CUDA driver version is
    one of ``cuda`` (:func:`cuda_versions`)."""
    q = q.where(Host.healthy.is_(True), Host.status == HostStatus.ACTIVE.value)
    if cuda is not None:
        q = q.where(Host.cuda_version.in_(list(cuda)))
    if req.cloud_type != CloudType.ALL:
        q = q.where(Host.cloud_type == req.cloud_type.value)
    if req.location is not None:
        q = q.where(Host.location == req.location)
    if exclude:
        q = q.where(Host.id.not_in(list(exclude)))
    return q


def candidate_query(
    req: ResourceRequest,
    ratios: AllocationRatios,
    policy: PlacementPolicy,
    *,
    exclude: Collection[int] = (),
    limit: int = CANDIDATES,
    cuda: Collection[str] | None = None,
) -> Select[int]:
    """The ids of the hosts ``req`` may land on with enough free, best first; with
    ``cuda``, only hosts with one of those CUDA driver versions (:func:`cuda_versions`)."""
    gpu_type = req.gpu_type if req.gpu_count else None
    free = _free_figures(ratios, gpu_type)
    q = placeable(select(Host.id), req, exclude, cuda)
    if gpu_type is not None:
        q = q.where(free["gpus"] >= req.gpu_count)
    q = q.where(
        free["vcpus"] >= req.vcpus - _SLACK,
        free["memory_gb"] >= req.memory_gb - _SLACK,
        free["disk_gb"] >= req.disk_gb - _SLACK,
    )
    if policy is PlacementPolicy.SPREAD:
        q = q.order_by((free["gpus"] if gpu_type is not None else free["vcpus"]).desc(), Host.id)
    elif gpu_type is not None:
        q = q.order_by(free["gpus"], free["vcpus"], Host.id)
    else:
        q = q.order_by(free["vcpus"], Host.id)
    return q.limit(limit)


def candidate_hosts(
    session: Session,
    req: ResourceRequest,
    ratios: AllocationRatios,
    policy: PlacementPolicy,
    *,
    exclude: Collection[int] = (),
    limit: int = CANDIDATES,
) -> list[HostCapacity]:
    """At most ``limit`` hosts ``req`` fits on, best first under ``policy``, with their
    exact capacities. Empty when no host can take it as things stand."""
    q = candidate_query(
        req, ratios, policy, exclude=exclude, limit=limit, cuda=cuda_versions(session, req)
    )
    ids = list(session.scalars(q))
    return capacities(session, ids) if ids else []


def nearest_hosts(
    session: Session,
    req: ResourceRequest,
    ratios: AllocationRatios,
    *,
    exclude: Collection[int] = (),
    limit: int = 10,
) -> list[HostCapacity]:
    """For an error's ``available``: up to ``limit`` hosts that take placements in the
    request's cloud type and location, most free GPUs of the type (else vCPUs) first,
    whether or not the request fits there (a full fleet shows a sample, not all) and
    whatever their CUDA driver version (the error says which falls short)."""
    gpu_type = req.gpu_type if req.gpu_count else None
    free = _free_figures(ratios, gpu_type)
    most = free["gpus"] if gpu_type is not None else free["vcpus"]
    q = placeable(select(Host.id), req, exclude).order_by(most.desc(), Host.id).limit(limit)
    ids = list(session.scalars(q))
    return capacities(session, ids) if ids else []
