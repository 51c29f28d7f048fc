"""``/v1/images``: node image versions (``image_version_id``); admins register them."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas import resources as rs
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.catalog import images
from gpuyard.services.tenancy.auth import Principal

# JSON bodies above a few KiB are parsed off the event loop (api/http/json_body.py).
router = APIRouter(tags=["images"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)


@router.get("/v1/images", responses=documented(rs.ImageListEnvelope))
def list_images(
    request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Every registered image version, oldest first."""
    rows = images.list_images(app_state(request).ctx)
    return ok({"images": [images.image_view(r) for r in rows]})


@router.post("/v1/images", status_code=201, responses=documented(rs.ImageEnvelope, 201))
def register_image(
    body: rs.RegisterImage, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Register an image version (admin scope). An image reference is registered
    once: a second registration is 409 IMAGE_EXISTS."""
    row = images.add_image_version(
        app_state(request).ctx, principal, body.name, body.version, body.image, body.description
    )
    return ok(images.image_view(row), status_code=201)


@router.get("/v1/images/{image_version_id}", responses=documented(rs.ImageEnvelope))
def get_image(
    image_version_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    return ok(images.image_view(images.show_image(app_state(request).ctx, image_version_id)))
