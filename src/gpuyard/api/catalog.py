"""GPU types and hosts."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api.envelope import ok
from gpuyard.api.host_schemas import HostListEnvelope
from gpuyard.api.openapi_responses import ERROR_RESPONSES
from gpuyard.api.schemas import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.core.placement import AllocationRatios, free_resources
from gpuyard.services.auth import Principal, Scope
from gpuyard.services.catalog import gpu_type_offers
from gpuyard.services.host_views import HostView, list_hosts

router = APIRouter(tags=["catalog"], responses=ERROR_RESPONSES)


@router.get("/v1/gpu-types")
def gpu_types(request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    """The catalog with prices per GPU-hour and how many are free right now."""
    offers = gpu_type_offers(app_state(request).ctx)
    return ok(
        {
            "gpu_types": [
                {
                    "id": o.info.id,
                    "display_name": o.info.display_name,
                    "manufacturer": o.info.manufacturer,
                    "memory_gb": o.info.memory_gb,
                    "secure_price": o.info.secure_price,
                    "community_price": o.info.community_price,
                    "secure_spot_price": o.info.secure_spot_price,
                    "community_spot_price": o.info.community_spot_price,
                    "total_gpus": o.total_gpus,
                    "available_gpus": o.available_gpus,
                }
                for o in offers
            ]
        }
    )


@router.get("/v1/hosts", responses=documented(HostListEnvelope))
def hosts(request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    """This installation's id, and every host with its identity, capacity, what is
    free, whether it enforces CPU/memory limits and where each figure came from (admin)."""
    principal.require(Scope.ADMIN)
    state = app_state(request)
    # This process's engine is the local host's; asked outside any transaction.
    engine_problem = state.runtime.available()
    overview = list_hosts(state.ctx)
    ratios = state.ctx.settings.allocation_ratios
    return ok(
        {
            "installation_id": overview.installation_id,
            "hosts": [host_view(h, engine_problem, ratios) for h in overview.hosts],
        }
    )


def host_view(h: HostView, engine_problem: str | None, ratios: AllocationRatios) -> dict[str, Any]:
    """One host as ``GET /v1/hosts`` shows it (api/host_schemas.py HostOut)."""
    cap = h.capacity
    return {
        "id": h.id,
        "name": h.name,
        "machine_id": h.machine_id,
        "location": h.location,
        "cloud_type": h.cloud_type,
        "address": h.address,
        "engine_url": h.engine_url,
        "engine": {"reachable": engine_problem is None, "message": engine_problem},
        "healthy": h.healthy,
        "vcpus": h.vcpus,
        "memory_gb": h.memory_gb,
        "disk_gb": h.disk_gb,
        "gpu_source": h.gpu_source,
        "declared": list(h.declared),
        "enforces_limits": h.enforces_limits,
        "limits_note": h.limits_note,
        "gpus": [
            {
                "index": g.index,
                "type": g.gpu_type,
                "uuid": g.uuid,
                "allocated": g.index in cap.used_gpu_indices,
            }
            for g in cap.gpus
        ],
        "free": free_resources(cap, ratios),
    }
