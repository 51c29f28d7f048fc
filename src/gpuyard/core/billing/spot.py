"""The spot market, pure: who may be preempted for a request, and what bid wins now.

A request carries a bid per GPU (None: on-demand, which outbids every spot bid).
Only interruptible holders bidding strictly less than the request can be evicted;
an equal bid never preempts. On each host, victims are taken lowest bid first until
the request fits; among hosts the one needing the fewest evictions wins (then the
lowest total bid evicted). No I/O: services/billing/spot.py loads and applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from gpuyard.core.models import CloudType, HostCapacity, Placement, ResourceRequest
from gpuyard.core.placement import AllocationRatios, choose_gpus, fits, free_resources

# Bids are quoted in cents: the smallest bid above another one is one cent more.
BID_STEP = 0.01


@dataclass(frozen=True)
class Holder:
    """A cluster holding resources on a host, as the market sees it."""

    cluster_id: str
    host_id: int
    gpu_indices: tuple[int, ...]
    vcpus: int
    memory_gb: int
    container_disk_gb: int
    bid_per_gpu: float | None  # None: on-demand, never preempted


@dataclass(frozen=True)
class PreemptionPlan:
    placement: Placement
    victims: tuple[Holder, ...] = field(default=())


def _without(host: HostCapacity, victims: list[Holder]) -> HostCapacity:
    freed = {i for v in victims for i in v.gpu_indices}
    return replace(
        host,
        used_gpu_indices=host.used_gpu_indices - freed,
        used_vcpus=host.used_vcpus - sum(v.vcpus for v in victims),
        used_memory_gb=host.used_memory_gb - sum(v.memory_gb for v in victims),
        used_disk_gb=host.used_disk_gb - sum(v.container_disk_gb for v in victims),
    )


def _outbid(holder: Holder, bid: float | None) -> bool:
    if holder.bid_per_gpu is None:
        return False
    return bid is None or holder.bid_per_gpu < bid


def _victims_on(
    host: HostCapacity,
    holders: list[Holder],
    req: ResourceRequest,
    bid: float | None,
    ratios: AllocationRatios,
) -> list[Holder] | None:
    """The fewest, cheapest evictions that make ``req`` fit on ``host``; None if none do."""
    candidates = sorted(
        (h for h in holders if h.host_id == host.host_id and _outbid(h, bid)),
        key=lambda h: (h.bid_per_gpu or 0.0, -len(h.gpu_indices), h.cluster_id),
    )
    chosen: list[Holder] = []
    for candidate in [None, *candidates]:
        if candidate is not None:
            chosen.append(candidate)
        if fits(_without(host, chosen), req, ratios):
            # Drop evictions the fit does not need (a cheap one may have been skipped
            # past by a larger one), most expensive first.
            for v in sorted(chosen, key=lambda h: -(h.bid_per_gpu or 0.0)):
                rest = [x for x in chosen if x is not v]
                if fits(_without(host, rest), req, ratios):
                    chosen = rest
            return chosen
    return None


def plan(
    hosts: list[HostCapacity],
    holders: list[Holder],
    req: ResourceRequest,
    bid: float | None,
    ratios: AllocationRatios,
) -> PreemptionPlan | None:
    """A host and the holders to evict for ``req`` at ``bid``; None when even
    preemption cannot make room."""
    best: tuple[tuple[int, float, int], HostCapacity, list[Holder]] | None = None
    for host in hosts:
        if req.cloud_type != CloudType.ALL and host.cloud_type != req.cloud_type:
            continue
        victims = _victims_on(host, holders, req, bid, ratios)
        if victims is None:
            continue
        key = (len(victims), sum((v.bid_per_gpu or 0.0) * len(v.gpu_indices) for v in victims),
               host.host_id)  # fmt: skip
        if best is None or key < best[0]:
            best = (key, host, victims)
    if best is None:
        return None
    _, host, victims = best
    freed = _without(host, victims)
    return PreemptionPlan(
        placement=Placement(host_id=host.host_id, gpu_indices=choose_gpus(freed, req)),
        victims=tuple(victims),
    )


def minimum_bid(
    hosts: list[HostCapacity],
    holders: list[Holder],
    req: ResourceRequest,
    floor: float,
    ratios: AllocationRatios,
) -> float | None:
    """The lowest bid per GPU that would win ``req`` now: the floor when it fits
    without preemption; one step above the highest bid it must evict otherwise;
    None when not even on-demand could make room."""
    if plan(hosts, holders, req, bid=floor, ratios=ratios) is not None:
        return floor
    needed = plan(hosts, holders, req, bid=None, ratios=ratios)
    if needed is None:
        return None
    # Try each distinct spot bid as the price to beat, cheapest first.
    for beat in sorted({h.bid_per_gpu for h in holders if h.bid_per_gpu is not None}):
        bid = max(floor, math.floor(beat / BID_STEP + 1e-9) * BID_STEP + BID_STEP)
        bid = round(bid, 2)
        if plan(hosts, holders, req, bid=bid, ratios=ratios) is not None:
            return bid
    return None


def free_gpu_counts(hosts: list[HostCapacity], gpu_type: str, ratios: AllocationRatios) -> int:
    """The most GPUs of ``gpu_type`` free on one host (what one cluster could get)."""
    return max((free_resources(h, ratios)["gpus"].get(gpu_type, 0) for h in hosts), default=0)
