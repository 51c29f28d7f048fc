"""Pure placement: choose a host and GPU indices for a resource request.

No I/O. The caller (services/placement.py) loads capacities inside a serialised
transaction and inserts the allocation rows; the database's unique key on
``(host_id, gpu_index)`` remains the last word if two placements ever race.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuyard.core.errors import InsufficientCapacity
from gpuyard.core.models import CloudType, HostCapacity, Placement, ResourceRequest


@dataclass(frozen=True)
class AllocationRatios:
    """Overcommit factors: 2.0 lets a host promise twice its physical vCPUs."""

    vcpu: float = 1.0
    memory: float = 1.0
    disk: float = 1.0


def free_resources(host: HostCapacity, ratios: AllocationRatios) -> dict[str, Any]:
    free_gpus = [g for g in host.gpus if g.index not in host.used_gpu_indices]
    by_type: dict[str, int] = {}
    for gpu in free_gpus:
        by_type[gpu.gpu_type] = by_type.get(gpu.gpu_type, 0) + 1
    return {
        "host_id": host.host_id,
        "gpus": by_type,
        "vcpus": round(host.vcpus * ratios.vcpu - host.used_vcpus, 2),
        "memory_gb": round(host.memory_gb * ratios.memory - host.used_memory_gb, 2),
        "disk_gb": round(host.disk_gb * ratios.disk - host.used_disk_gb, 2),
    }


def fits(host: HostCapacity, req: ResourceRequest, ratios: AllocationRatios) -> bool:
    """Whether ``req`` fits in what ``host`` has free."""
    if req.cloud_type != CloudType.ALL and host.cloud_type != req.cloud_type:
        return False
    free = free_resources(host, ratios)
    return (
        free["vcpus"] >= req.vcpus
        and free["memory_gb"] >= req.memory_gb
        and free["disk_gb"] >= req.disk_gb
        and (req.gpu_count == 0 or free["gpus"].get(req.gpu_type or "", 0) >= req.gpu_count)
    )


def choose_gpus(host: HostCapacity, req: ResourceRequest) -> tuple[int, ...]:
    free = [
        g.index
        for g in sorted(host.gpus, key=lambda g: g.index)
        if g.gpu_type == req.gpu_type and g.index not in host.used_gpu_indices
    ]
    return tuple(free[: req.gpu_count])


def place(hosts: list[HostCapacity], req: ResourceRequest, ratios: AllocationRatios) -> Placement:
    """Best fit: the eligible host left with the fewest free GPUs of the type, then
    the least free vCPUs, so large hosts stay whole for large requests.

    Raises InsufficientCapacity with what was asked and what each host has free.
    """
    eligible = [h for h in hosts if fits(h, req, ratios)]
    if not eligible:
        raise insufficient(hosts, req, ratios)

    def waste(h: HostCapacity) -> tuple[float, float, int]:
        free = free_resources(h, ratios)
        return (free["gpus"].get(req.gpu_type or "", 0), free["vcpus"], h.host_id)

    best = min(eligible, key=waste)
    return Placement(host_id=best.host_id, gpu_indices=choose_gpus(best, req))


def insufficient(
    hosts: list[HostCapacity],
    req: ResourceRequest,
    ratios: AllocationRatios,
    message: str | None = None,
) -> InsufficientCapacity:
    asked = {
        "gpu_type": req.gpu_type,
        "gpu_count": req.gpu_count,
        "cpu_cores": req.vcpus,
        "memory_gb": req.memory_gb,
        "disk_gb": req.disk_gb,
        "cloud_type": req.cloud_type.value,
    }
    what = f"{req.gpu_count} x {req.gpu_type}" if req.gpu_count else f"{req.vcpus} vCPUs"
    return InsufficientCapacity(
        message or f"No host has free capacity for {what}",
        {"requested": asked, "available": [free_resources(h, ratios) for h in hosts]},
    )
