"""``/v1/images``: node image versions (``image_version_id``); admins register them."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api import resource_schemas as rs
from gpuyard.api.envelope import ERROR_RESPONSES, ok
from gpuyard.api.resource_params import path_id
from gpuyard.api.schemas import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services import images
from gpuyard.services.auth import Principal, Scope

router = APIRouter(tags=["images"], responses=ERROR_RESPONSES)


@router.get("/v1/images", responses=documented(rs.ImageListEnvelope))
def list_images(
    request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Every registered image version, oldest first."""
    with app_state(request).ctx.read() as session:
        return ok({"images": [images.image_view(r) for r in images.list_images(session)]})


@router.post("/v1/images", status_code=201, responses=documented(rs.ImageEnvelope, 201))
def register_image(
    body: rs.RegisterImage, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Register an image version (admin scope). An image reference is registered
    once: a second registration is 409 IMAGE_EXISTS."""
    principal.require(Scope.ADMIN)
    with app_state(request).ctx.transaction() as session:
        row = images.register_image(session, body.name, body.version, body.image, body.description)
        data = images.image_view(row)
    return ok(data, status_code=201)


@router.get("/v1/images/{image_version_id}", responses=documented(rs.ImageEnvelope))
def get_image(
    image_version_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    wanted = path_id("image_version_id", image_version_id)
    with app_state(request).ctx.read() as session:
        return ok(images.image_view(images.find_image(session, wanted)))
