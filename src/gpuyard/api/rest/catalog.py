"""The GPU catalog (hosts: api/rest/hosts.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.state import app_state, current_principal
from gpuyard.core.billing.pricing import RateParts
from gpuyard.services.billing.quotes import QuoteRequest, quote
from gpuyard.services.catalog.gpu_types import gpu_type_offers
from gpuyard.services.tenancy.auth import Principal

# JSON bodies (the price quote) are parsed off the event loop (api/http/json_body.py).
router = APIRouter(tags=["catalog"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)


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


def _parts(r: RateParts) -> dict[str, float]:
    return {
        "gpu": r.gpu,
        "compute": r.compute,
        "container_disk": r.container_disk,
        "volume": r.volume,
        "total": r.total,
    }


@router.post("/v1/prices/quote")
def price_quote(
    body: QuoteRequest, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """What a cluster of this size would cost per hour, running and stopped: the
    sizing fields of ``POST /v1/clusters`` (others are ignored), priced as the bill
    will be. Nothing is made; an unknown GPU type or a bid under the spot floor is
    400 naming the field, a network volume the account does not have 404."""
    q = quote(app_state(request).ctx, principal, body)
    return ok({"hourly": _parts(q.running), "hourly_stopped": _parts(q.stopped)})
