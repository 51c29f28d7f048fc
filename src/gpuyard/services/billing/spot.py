"""Spot use cases: resume at a bid, and what it costs to win GPUs right now."""

from __future__ import annotations

from dataclasses import dataclass

from gpuyard.core.billing import spot
from gpuyard.core.billing.pricing import gpu_price, spot_floor
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.models import CloudType, GpuTypeInfo, HostCapacity, ResourceRequest
from gpuyard.core.placement import fits, free_resources
from gpuyard.services.capacity.placement import load_holders
from gpuyard.services.catalog.gpu_types import find_gpu_type
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.clusters.use_cases import StartResult, start_cluster
from gpuyard.services.context import Context
from gpuyard.services.fleet.hosts import capacities
from gpuyard.services.tenancy.auth import Principal

# Cluster sizes offered in availableGpuCounts, as RunPod lists them.
OFFERED_COUNTS = (1, 2, 4, 8)


# What a cluster gets unless it asks for more (the create body's defaults).
DEFAULT_VCPUS: int = CreateCluster.model_fields["cpu_cores"].default
DEFAULT_MEMORY_GB: int = CreateCluster.model_fields["memory_gb"].default


@dataclass(frozen=True)
class LowestPrice:
    minimum_bid_price: float | None
    uninterruptable_price: float
    stock_status: str | None
    available_gpu_counts: list[int]
    # What a cluster of gpu_count GPUs gets by default on a host it fits on now;
    # None when none does.
    min_vcpu: int | None = None
    min_memory_gb: int | None = None
    # Free GPUs of the type on the host with the most (of the hosts it fits on).
    max_unreserved_gpu_count: int = 0
    # GPUs of the type on hosts that take clusters (of the cloud type), and how many
    # of them are held.
    total_count: int = 0
    rented_count: int = 0


def bid_resume_cluster(
    ctx: Context,
    principal: Principal,
    cluster_id: str,
    bid_per_gpu: float,
    gpu_count: int | None = None,
) -> StartResult:
    """Resume a stopped cluster as spot at ``bid_per_gpu`` (preempting lower bids if
    its host is full). Raises as start_cluster does, and ValidationFailed for a bid
    below the spot floor."""
    body = StartCluster.model_validate(
        {"update_configuration": {"gpu_count": gpu_count}} if gpu_count is not None else {}
    )
    return start_cluster(ctx, principal, cluster_id, body, bid_per_gpu=bid_per_gpu)


def _stock(free: int) -> str | None:
    if free <= 0:
        return None
    return "High" if free >= 8 else "Medium" if free >= 3 else "Low"


@dataclass(frozen=True)
class Market:
    """Capacity and live bids, loaded once to price many GPU types."""

    hosts: list[HostCapacity]
    holders: list[spot.Holder]


def load_market(ctx: Context) -> Market:
    with ctx.read() as session:
        hosts = capacities(session)
        holders = load_holders(session, [h.host_id for h in hosts], exclude="")
    return Market(hosts, holders)


def lowest_price(
    ctx: Context,
    gpu_type: str | GpuTypeInfo,
    gpu_count: int,
    cloud_type: CloudType = CloudType.SECURE,
    market: Market | None = None,
) -> LowestPrice:
    """Prices for ``gpu_count`` GPUs of a type, from real free capacity and live bids:
    the bid that would win them now (the floor when they are free, one cent above the
    bid to preempt otherwise, None when not even on-demand can make room). Pass a
    ``market`` from load_market to price several types from one read."""
    if gpu_count < 1:
        raise ValidationFailed("gpuCount", "must be at least 1")
    gpu = gpu_type if isinstance(gpu_type, GpuTypeInfo) else _gpu(ctx, gpu_type)
    market = market or load_market(ctx)
    ratios = ctx.settings.allocation_ratios
    request = ResourceRequest(
        gpu_type=gpu.id, gpu_count=gpu_count, vcpus=1, memory_gb=1, disk_gb=0, cloud_type=cloud_type
    )
    free = spot.free_gpu_counts(market.hosts, gpu.id, ratios)
    offered = [
        h
        for h in market.hosts
        if h.takes_placements and (cloud_type == CloudType.ALL or h.cloud_type == cloud_type)
    ]
    default = ResourceRequest(
        gpu_type=gpu.id,
        gpu_count=gpu_count,
        vcpus=DEFAULT_VCPUS,
        memory_gb=DEFAULT_MEMORY_GB,
        disk_gb=0,
        cloud_type=cloud_type,
    )
    qualifying = [h for h in offered if fits(h, default, ratios)]
    of_type = [g for h in offered for g in h.gpus if g.gpu_type == gpu.id]
    held = sum(
        1 for h in offered for g in h.gpus if g.gpu_type == gpu.id and g.index in h.used_gpu_indices
    )
    return LowestPrice(
        minimum_bid_price=spot.minimum_bid(
            market.hosts, market.holders, request, spot_floor(gpu, cloud_type), ratios
        ),
        uninterruptable_price=gpu_price(gpu, cloud_type),
        stock_status=_stock(free),
        available_gpu_counts=[n for n in OFFERED_COUNTS if n <= free],
        min_vcpu=DEFAULT_VCPUS if qualifying else None,
        min_memory_gb=DEFAULT_MEMORY_GB if qualifying else None,
        max_unreserved_gpu_count=max(
            (free_resources(h, ratios)["gpus"].get(gpu.id, 0) for h in qualifying), default=0
        ),
        total_count=len(of_type),
        rented_count=held,
    )


def _gpu(ctx: Context, gpu_type_id: str) -> GpuTypeInfo:
    with ctx.read() as session:
        gpu = find_gpu_type(session, gpu_type_id)
    if gpu is None:
        raise ValidationFailed("id", f"unknown GPU type {gpu_type_id!r}")
    return gpu
