"""``GET /v1/host-images``: the images present on the hosts, for the create form to
offer (a cluster from an image already there starts without a pull, and works on a
machine that cannot reach a registry).

Any key may read it (services/fleet/host_images.py says why).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from gpuyard.api.http.envelope import Meta, ok
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.fleet.host_images import host_images as host_images_of
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["images"], responses=ERROR_RESPONSES)


class HostImageOut(BaseModel):
    name: str
    hosts: int


class HostImagesData(BaseModel):
    images: list[HostImageOut]
    # Healthy hosts whose engine did not answer (their images are not counted).
    hosts_unanswered: int


class HostImagesEnvelope(BaseModel):
    success: bool
    data: HostImagesData
    meta: Meta


@router.get("/v1/host-images", response_model=HostImagesEnvelope)
def host_images(
    request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """The image names present on the healthy hosts' engines, most widely held first
    (then by name), each with the number of hosts holding it."""
    found = host_images_of(app_state(request).ctx, app_state(request).runtime_of)
    images = [{"name": name, "hosts": n} for name, n in found.images]
    return ok({"images": images, "hosts_unanswered": found.hosts_unanswered})
