"""The catalog with the fleet's GPUs host by host: what RunPod's v2 catalog
(``/runpod/v2/catalog``) answers availability from.

``fleet_stock`` reads, in one short transaction, the GPU types, every location that
has a host, and, per host that takes placements (active and healthy), how many GPUs
of each type it has and how many are free under the installation's allocation
ratios. ``availability`` turns "how many nodes of ``count`` GPUs could be placed
now" into RunPod's levels. Anybody with a key may read it, as ``/v1/gpu-types``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select

from gpuyard.core.models import CloudType, GpuTypeInfo
from gpuyard.core.placement import free_resources
from gpuyard.services.catalog.gpu_types import list_gpu_types
from gpuyard.services.context import Context
from gpuyard.services.fleet.hosts import capacities
from gpuyard.store.schema import Host


@dataclass(frozen=True)
class HostStock:
    """One GPU type on one host that takes placements."""

    host_id: int
    location: str
    cloud_type: CloudType
    gpu_type: str
    total: int
    free: int


@dataclass(frozen=True)
class FleetStock:
    types: list[GpuTypeInfo]
    locations: list[str]
    hosts: list[HostStock]


def fleet_stock(ctx: Context) -> FleetStock:
    """The catalog by id, the locations by name and each host's GPUs by type."""
    ratios = ctx.settings.allocation_ratios
    with ctx.read() as session:
        types = list_gpu_types(session)
        locations = sorted(set(session.scalars(select(Host.location))))
        caps = capacities(session)
    stock = []
    for cap in caps:
        free = free_resources(cap, ratios)["gpus"]
        totals: dict[str, int] = {}
        for g in cap.gpus:
            totals[g.gpu_type] = totals.get(g.gpu_type, 0) + 1
        for gpu_type, total in sorted(totals.items()):
            stock.append(
                HostStock(
                    cap.host_id,
                    cap.location,
                    cap.cloud_type,
                    gpu_type,
                    total,
                    int(free.get(gpu_type, 0)),
                )
            )
    return FleetStock(types, locations, stock)


def placeable(hosts: Iterable[HostStock], count: int) -> int:
    """How many nodes of ``count`` GPUs the hosts could take now (each on one host)."""
    return sum(h.free // count for h in hosts) if count > 0 else 0


def availability(nodes: int) -> str:
    """RunPod's AvailabilityLevel of ``nodes`` placeable nodes: NONE for none, LOW for
    one, MEDIUM for two or three, HIGH for four or more."""
    if nodes <= 0:
        return "NONE"
    if nodes == 1:
        return "LOW"
    return "MEDIUM" if nodes < 4 else "HIGH"
