"""``/v1/networkvolumes``: storage that outlives clusters, on one host of a data centre
(RunPod's network volumes; services/volumes/network_volumes.py). A cluster mounts one by
naming it in ``network_volume_id`` at create."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.rest.schemas.cluster_json import iso
from gpuyard.api.rest.schemas.responses import Meta, StrictOut, documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.volumes import network_volumes as nvs

# JSON bodies above a few KiB are parsed off the event loop (api/http/json_body.py).
router = APIRouter(
    tags=["network-volumes"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute
)


class NetworkVolumeOut(StrictOut):
    id: str
    name: str
    size: int = Field(description="Size in GB (billed by it)")
    dataCenterId: str = Field(description="The host location it lives in")
    project_id: int
    used_bytes: int | None = Field(description="Bytes used, as last measured (null: not yet)")
    measured_at: str | None
    created_at: str | None
    attached_cluster_ids: list[str] = Field(description="Clusters (not terminated) mounting it")


class NetworkVolumeList(StrictOut):
    network_volumes: list[NetworkVolumeOut]


class NetworkVolumeDeleted(StrictOut):
    id: str
    deleted: Literal[True]


class NetworkVolumeEnvelope(StrictOut):
    success: Literal[True]
    data: NetworkVolumeOut
    meta: Meta


class NetworkVolumeListEnvelope(StrictOut):
    success: Literal[True]
    data: NetworkVolumeList
    meta: Meta


class NetworkVolumeDeletedEnvelope(StrictOut):
    success: Literal[True]
    data: NetworkVolumeDeleted
    meta: Meta


def view(v: nvs.NetworkVolumeView) -> dict[str, Any]:
    """RunPod's ``{id, name, size, dataCenterId}`` and what gpuyard adds."""
    return {
        "id": v.id,
        "name": v.name,
        "size": v.size_gb,
        "dataCenterId": v.location,
        "project_id": v.project_id,
        "used_bytes": v.used_bytes,
        "measured_at": iso(v.measured_at),
        "created_at": iso(v.created_at),
        "attached_cluster_ids": list(v.attached_cluster_ids),
    }


@router.get("/v1/networkvolumes", responses=documented(NetworkVolumeListEnvelope))
def list_volumes(
    request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """The account's network volumes, newest first."""
    rows = nvs.list_network_volumes(app_state(request).ctx, principal)
    return ok({"network_volumes": [view(v) for v in rows]})


@router.post(
    "/v1/networkvolumes", status_code=201, responses=documented(NetworkVolumeEnvelope, 201)
)
def create_volume(
    body: nvs.CreateNetworkVolume,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Create a network volume of ``size`` GB in data centre ``dataCenterId`` (a host
    location): placed on one of its hosts, billed by size from now. Unknown
    ``dataCenterId``: 400; no host there has the disk: 409 INSUFFICIENT_CAPACITY."""
    created = nvs.create_network_volume(app_state(request).ctx, principal, body)
    return ok(view(created), status_code=201)


@router.get("/v1/networkvolumes/{network_volume_id}", responses=documented(NetworkVolumeEnvelope))
def get_volume(
    network_volume_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    return ok(view(nvs.get_network_volume(app_state(request).ctx, principal, network_volume_id)))


@router.patch("/v1/networkvolumes/{network_volume_id}", responses=documented(NetworkVolumeEnvelope))
def update_volume(
    network_volume_id: str,
    body: nvs.UpdateNetworkVolume,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Rename and/or grow. A smaller ``size`` is 400 (details: ``current_size``); more
    than the host has free is 409 INSUFFICIENT_CAPACITY."""
    state = app_state(request)
    updated = nvs.update_network_volume(
        state.ctx, principal, network_volume_id, body, runtime_of=state.runtime_of
    )
    return ok(view(updated))


@router.delete(
    "/v1/networkvolumes/{network_volume_id}", responses=documented(NetworkVolumeDeletedEnvelope)
)
def delete_volume(
    network_volume_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Delete it and its data. 409 NETWORK_VOLUME_IN_USE (details: ``cluster_ids``,
    ``snapshot_ids``) while a cluster that is not terminated mounts it or snapshots
    of it exist."""
    state = app_state(request)
    nvs.delete_network_volume(state.ctx, principal, network_volume_id, state.runtime_of)
    return ok({"id": network_volume_id, "deleted": True})
