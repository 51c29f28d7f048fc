"""``/v1/plans`` (node sizes, ``sku_id``) and ``/v1/locations`` (where hosts are)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.rest.schemas import resources as rs
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.catalog.locations import list_locations
from gpuyard.services.catalog.plans import list_plans
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["catalog"], responses=ERROR_RESPONSES)


@router.get("/v1/plans", responses=documented(rs.PlanListEnvelope))
def plans(request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    """Node plans by ``sku_id``: GPUs, vCPUs and memory per node and the price per
    node-hour (GPUs at the secure on-demand price plus compute)."""
    return ok({"plans": list_plans(app_state(request).ctx)})


@router.get("/v1/locations", responses=documented(rs.LocationListEnvelope))
def locations(request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    """Every location with hosts: how many, and per GPU type the GPUs of its healthy
    hosts and how many are free right now."""
    return ok({"locations": list_locations(app_state(request).ctx)})
