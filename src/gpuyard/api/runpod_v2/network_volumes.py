"""``/runpod/v2/network-volumes``: RunPod's NetworkVolume over gpuyard's network
volumes (services/volumes/network_volumes.py, the rows of ``/v1/networkvolumes``).

``dataCenter`` is a host location (``/runpod/v2/catalog/datacenters``); sizes are GB,
10 to 4096 as RunPod's document bounds them, and only grow. gpuyard has one storage
tier, answered as ``STANDARD``; asking for ``HIGH_PERFORMANCE`` is a 422.
"""

from __future__ import annotations

from typing import Literal

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ConfigDict, Field, model_validator

from gpuyard.api.runpod_v2.common import (
    V2Body,
    answer,
    documented,
    inputs,
    no_content,
    renamed,
    v2_router,
)
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.volumes import network_volumes as nvs

router = v2_router()

MIN_GB, MAX_GB = 10, 4096
NAMES = {"dataCenterId": "dataCenter", "name": "name", "size": "size"}


class CreateNetworkVolumeRequest(V2Body):
    name: str = Field(min_length=1, max_length=200)
    size: int = Field(ge=MIN_GB, le=MAX_GB, strict=True, description="GB")
    dataCenter: str = Field(min_length=1, max_length=100, description="A data center's id")
    type: Literal["STANDARD"] | None = Field(
        default=None, description="STANDARD only: gpuyard has one storage tier"
    )


class UpdateNetworkVolumeRequest(V2Body):
    # An empty change is refused: the document's schema says so too.
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    name: str | None = Field(default=None, min_length=1, max_length=200)
    size: int | None = Field(
        default=None, ge=MIN_GB, le=MAX_GB, strict=True, description="GB; only grows"
    )

    @model_validator(mode="after")
    def _something(self) -> UpdateNetworkVolumeRequest:
        if not self.model_fields_set:
            raise ValueError("send name and/or size")
        return self


def volume_view(v: nvs.NetworkVolumeView) -> dict[str, object]:
    return {
        "id": v.id,
        "name": v.name,
        "size": v.size_gb,
        "dataCenter": v.location,
        "type": "STANDARD",
    }


@router.get(
    "/network-volumes", responses=documented("ListNetworkVolumesResponse: {networkVolumes}")
)
def list_volumes(
    request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """The account's network volumes, newest first."""
    rows = nvs.list_network_volumes(app_state(request).ctx, principal)
    return answer({"networkVolumes": [volume_view(v) for v in rows]})


@router.post("/network-volumes", status_code=201, responses=documented("NetworkVolume", 201))
def create_volume(
    body: CreateNetworkVolumeRequest,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """A network volume of ``size`` GB in ``dataCenter``, in the account's default
    project; billed by size from now. An unknown data center is a 400 naming
    ``dataCenter``; no host there with the disk free, 409 INSUFFICIENT_CAPACITY."""
    data = {"name": body.name, "size": body.size, "dataCenterId": body.dataCenter}
    create = inputs(nvs.CreateNetworkVolume, data, NAMES)
    with renamed(NAMES):
        created = nvs.create_network_volume(app_state(request).ctx, principal, create)
    return answer(volume_view(created), 201)


@router.get("/network-volumes/{id}", responses=documented("NetworkVolume"))
def get_volume(
    id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    return answer(volume_view(nvs.get_network_volume(app_state(request).ctx, principal, id)))


@router.patch("/network-volumes/{id}", responses=documented("NetworkVolume"))
def update_volume(
    id: str,
    body: UpdateNetworkVolumeRequest,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Rename and/or grow. A smaller ``size`` is a 400 naming it; more than the host
    has free, 409 INSUFFICIENT_CAPACITY."""
    state = app_state(request)
    change = inputs(nvs.UpdateNetworkVolume, body.model_dump(exclude_unset=True), NAMES)
    updated = nvs.update_network_volume(
        state.ctx, principal, id, change, runtime_of=state.runtime_of
    )
    return answer(volume_view(updated))


@router.delete("/network-volumes/{id}", status_code=204, responses=documented("Deleted", 204))
def delete_volume(
    id: str, request: Request, principal: Principal = Depends(current_principal)
) -> Response:
    """Delete it and its data; 409 NETWORK_VOLUME_IN_USE while a cluster that is not
    terminated mounts it or snapshots of it exist."""
    state = app_state(request)
    nvs.delete_network_volume(state.ctx, principal, id, state.runtime_of)
    return no_content()
