"""Routes of the budgets part of tenancy (filled in with their services)."""

from __future__ import annotations

from fastapi import APIRouter

from gpuyard.api.json_body import OffLoopJsonRoute
from gpuyard.api.openapi_responses import ERROR_RESPONSES

router = APIRouter(tags=["budgets"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)
