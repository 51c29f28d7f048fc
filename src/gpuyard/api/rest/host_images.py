"""``GET /v1/host-images``: the images present on the hosts, for the create form to
offer (a cluster from an image already there starts without a pull, and works on a
machine that cannot reach a registry).

Names only, with how many hosts hold each: nothing about which tenant's cluster uses
an image or which host it is, so any key may read it. A host whose engine cannot be
asked right now is left out (the answer says how many were).
"""

from __future__ import annotations

from collections import Counter

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import select

from gpuyard.api.http.envelope import Meta, ok
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.state import app_state, current_principal
from gpuyard.runtimes.base import ImageListing
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Host

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
    state = app_state(request)
    with state.ctx.read() as session:
        host_ids = list(session.scalars(select(Host.id).where(Host.healthy.is_(True))))
    counts: Counter[str] = Counter()
    unanswered = 0
    for host_id in host_ids:
        try:
            runtime = state.runtime_of(host_id)
            if not isinstance(runtime, ImageListing):
                continue
            counts.update(set(runtime.local_images()))
        except Exception:  # one host's engine being away leaves its images out, no more
            unanswered += 1
    images = [
        {"name": name, "hosts": n}
        for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    return ok({"images": images, "hosts_unanswered": unanswered})
