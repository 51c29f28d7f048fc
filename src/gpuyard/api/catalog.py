"""The GPU catalog (hosts: api/hosts.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api.envelope import ok
from gpuyard.api.openapi_responses import ERROR_RESPONSES
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.auth import Principal
from gpuyard.services.catalog import gpu_type_offers

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
