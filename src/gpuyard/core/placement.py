"""Pure placement: choose a host and GPU indices for a resource request.

No I/O. The caller (services/capacity/placement.py) loads the candidate hosts' capacities inside
a serialised transaction and inserts the allocation rows; the database's unique key on
``(host_id, gpu_index)`` remains the last word if two placements ever race.

Filters: the host takes placements (active and healthy), the cloud type and location
asked for, the CUDA driver version asked for (at least ``min_cuda_version`` and, when
given, one of ``allowed_cuda_versions``; a host whose version is unknown meets neither),
and free GPUs of the type, vCPUs, memory and disk. Scores (``policy_key``):

- ``binpack`` (best fit): the host left with the fewest free GPUs of the type, then the
  least free vCPUs, so large hosts stay whole for large requests;
- ``spread``: the host with the most free GPUs of the type (for a CPU-only request: the
  most free vCPUs), so one host failing hits fewer clusters.

Ties go to the lowest host id: the same state always gives the same answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuyard.core.errors import InsufficientCapacity
from gpuyard.core.fleet import PlacementPolicy
from gpuyard.core.models import CloudType, HostCapacity, Placement, ResourceRequest


@dataclass(frozen=True)
class AllocationRatios:
    """Overcommit factors: 2.0 lets a host promise twice its physical vCPUs."""

    vcpu: float = 1.0
    memory: float = 1.0
    disk: float = 1.0


# core/input_rules.py CUDA_VERSION_PATTERN, in groups.
_VERSION = re.compile(r"([0-9]+)(?:\.([0-9]+))?")


def cuda_version_key(version: str | None) -> tuple[int, int] | None:
    """``"12.4"`` as ``(12, 4)`` for comparing (``"12.10"`` is above ``"12.4"``;
    ``"12"`` is ``(12, 0)``); None when ``version`` is None or not a version."""
    found = _VERSION.fullmatch(version.strip()) if version is not None else None
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2) or 0)


def cuda_from_nvml(version: int) -> str:
    """NVML's ``nvmlSystemGetCudaDriverVersion`` (``12040``) as ``"12.4"``."""
    return f"{version // 1000}.{version % 1000 // 10}"


def cuda_satisfies(
    version: str | None, minimum: str | None, allowed: tuple[str, ...] | None = None
) -> bool:
    """Whether a host with CUDA driver ``version`` meets ``minimum`` (None: any) and is
    one of ``allowed`` (None: any). An unknown version meets no constraint."""
    if minimum is None and allowed is None:
        return True
    key = cuda_version_key(version)
    if key is None:
        return False
    wanted = cuda_version_key(minimum)
    if minimum is not None and (wanted is None or key < wanted):
        return False
    return allowed is None or key in {cuda_version_key(v) for v in allowed}


def cuda_wanted(req: ResourceRequest) -> str | None:
    """The request's CUDA constraint in words (None: it has none)."""
    parts = []
    if req.min_cuda_version is not None:
        parts.append(f"at least {req.min_cuda_version} (min_cuda_version)")
    if req.allowed_cuda_versions is not None:
        shown = ", ".join(req.allowed_cuda_versions) or "none"
        parts.append(f"one of {shown} (allowed_cuda_versions)")
    return " and ".join(parts) or None


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
    """Whether ``req`` may land on ``host`` and fits in what it has free."""
    return why_not(host, req, ratios) is None


def why_not(host: HostCapacity, req: ResourceRequest, ratios: AllocationRatios) -> str | None:
    """Why ``req`` cannot land on ``host`` (None: it can), in words for an error."""
    if not host.takes_placements:
        return "the host takes no new clusters (cordoned, draining or unreachable)"
    if req.cloud_type != CloudType.ALL and host.cloud_type != req.cloud_type:
        return f"the host is {host.cloud_type.value} cloud"
    if req.location is not None and host.location != req.location:
        return f"the host is in location {host.location!r}"
    if not cuda_satisfies(host.cuda_version, req.min_cuda_version, req.allowed_cuda_versions):
        return f"the host's CUDA driver version is {host.cuda_version or 'unknown'}"
    free = free_resources(host, ratios)
    if req.gpu_count and free["gpus"].get(req.gpu_type or "", 0) < req.gpu_count:
        return f"not enough free {req.gpu_type} GPUs"
    for key, asked in (
        ("vcpus", req.vcpus),
        ("memory_gb", req.memory_gb),
        ("disk_gb", req.disk_gb),
    ):
        if free[key] < asked:
            return f"not enough free {key.removesuffix('_gb').replace('vcpus', 'vCPUs')}"
    return None


def policy_key(
    host: HostCapacity, req: ResourceRequest, ratios: AllocationRatios, policy: PlacementPolicy
) -> tuple[float, float, int]:
    """The sort key of ``host`` under ``policy``: the smallest key wins."""
    free = free_resources(host, ratios)
    gpus = float(free["gpus"].get(req.gpu_type or "", 0)) if req.gpu_count else 0.0
    vcpus = float(free["vcpus"])
    if policy is PlacementPolicy.SPREAD:
        if req.gpu_count:
            return (-gpus, 0.0, host.host_id)
        return (-vcpus, 0.0, host.host_id)
    return (gpus, vcpus, host.host_id)


def choose_gpus(host: HostCapacity, req: ResourceRequest) -> tuple[int, ...]:
    free = [
        g.index
        for g in sorted(host.gpus, key=lambda g: g.index)
        if g.gpu_type == req.gpu_type and g.index not in host.used_gpu_indices
    ]
    return tuple(free[: req.gpu_count])


def place(
    hosts: list[HostCapacity],
    req: ResourceRequest,
    ratios: AllocationRatios,
    policy: PlacementPolicy = PlacementPolicy.BINPACK,
) -> Placement:
    """The eligible host that ``policy`` scores best (see the module docstring), and
    the lowest free GPU indices of the type there. Deterministic.

    Raises InsufficientCapacity with what was asked and what each host has free.
    """
    eligible = [h for h in hosts if fits(h, req, ratios)]
    if not eligible:
        raise insufficient(hosts, req, ratios)
    best = min(eligible, key=lambda h: policy_key(h, req, ratios, policy))
    return Placement(host_id=best.host_id, gpu_indices=choose_gpus(best, req))


def insufficient(
    hosts: list[HostCapacity],
    req: ResourceRequest,
    ratios: AllocationRatios,
    message: str | None = None,
) -> InsufficientCapacity:
    asked: dict[str, Any] = {
        "gpu_type": req.gpu_type,
        "gpu_count": req.gpu_count,
        "cpu_cores": req.vcpus,
        "memory_gb": req.memory_gb,
        "disk_gb": req.disk_gb,
        "cloud_type": req.cloud_type.value,
        "location": req.location,
    }
    if req.min_cuda_version is not None:
        asked["min_cuda_version"] = req.min_cuda_version
    if req.allowed_cuda_versions is not None:
        asked["allowed_cuda_versions"] = list(req.allowed_cuda_versions)
    what = f"{req.gpu_count} x {req.gpu_type}, " if req.gpu_count else ""
    what += f"{req.vcpus:g} vCPUs and {req.memory_gb:g} GB of memory"
    cuda = cuda_wanted(req)
    # What stood in the way on each host, once each: the resource that is short.
    reasons = sorted({why for why in (why_not(h, req, ratios) for h in hosts) if why})
    # No host (of those shown) has the CUDA version asked for: that is the news.
    no_cuda = cuda is not None and not any(
        cuda_satisfies(h.cuda_version, req.min_cuda_version, req.allowed_cuda_versions)
        for h in hosts
    )
    if not message and no_cuda:
        message = f"No host has a CUDA driver version {cuda} for {what}"
        message += f": {'; '.join(reasons)}" if reasons else ""
    if not message and cuda is not None:
        what += f" on a CUDA driver version {cuda}"
    if not message:
        message = f"No host has free capacity for {what}"
        message += f": {'; '.join(reasons)}" if reasons else ": no host matches"
    details: dict[str, Any] = {
        "requested": asked,
        "available": [
            {
                **free_resources(h, ratios),
                "cuda_version": h.cuda_version,
                "why_not": why_not(h, req, ratios),
            }
            for h in hosts
        ],
    }
    if no_cuda:
        details["hint"] = (
            f"no host has a CUDA driver version {cuda}: ask for a lower one, or the "
            "operator can declare a host's cuda_version where NVML cannot tell it"
        )
    if req.gpu_count and not any(g.gpu_type == req.gpu_type for h in hosts for g in h.gpus):
        # Not busy: absent. Say what would make it exist (a machine without GPUs).
        hint = (
            f"no host has any {req.gpu_type} GPU: declare a machine's GPUs with "
            f"GPUYARD_LOCAL_GPUS (e.g. GPUYARD_LOCAL_GPUS='{req.gpu_type}:4') or add a host "
            "that has them (POST /v1/hosts)"
        )
        message += f" ({hint})"
        details["hint"] = hint
    return InsufficientCapacity(message, details)
