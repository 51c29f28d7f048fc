"""Snapshots (REST v1): take one of a cluster's volume or of a network volume, list,
read and delete them, and restore one into a network volume. Restoring into a cluster
is its start's ``restore_from_snapshot``; a clone is a create's ``snapshot_id``."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.pagination import CURSOR_QUERY, pagination
from gpuyard.api.rest.schemas.responses import Meta, Pagination, StrictOut, documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.core.input_rules import check_name, check_text
from gpuyard.core.snapshots import SnapshotStatus
from gpuyard.services.clusters.requests import MAX_ID
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.volumes import snapshots as svc

router = APIRouter(tags=["snapshots"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)

_ID = Field(min_length=1, max_length=100)


class CreateSnapshot(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=200)
    description: str = Field(default="", max_length=2000)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return check_name(name)

    @field_validator("description")
    @classmethod
    def _description(cls, text: str) -> str:
        return check_text(text)


class RestoreVolume(BaseModel):
    model_config = ConfigDict(extra="forbid")

    snapshot_id: str = _ID


# -- answers ---------------------------------------------------------------------------


class SnapshotProgress(StrictOut):
    bytes_done: int


class SnapshotOut(StrictOut):
    id: str
    name: str
    description: str
    status: Literal["creating", "ready", "failed"]
    error: str | None
    source_cluster_id: str | None
    source_network_volume_id: str | None
    project_id: int
    consistency: Literal["stopped", "crash_consistent"]
    size_bytes: int | None
    stored_bytes: int | None
    file_count: int | None
    volume_gb: int
    progress: SnapshotProgress | None
    created_at: str | None
    ready_at: str | None


class SnapshotEnvelope(StrictOut):
    success: Literal[True]
    data: SnapshotOut
    meta: Meta


class SnapshotList(StrictOut):
    snapshots: list[SnapshotOut]
    pagination: Pagination


class SnapshotListEnvelope(StrictOut):
    success: Literal[True]
    data: SnapshotList
    meta: Meta


class DeletedSnapshot(StrictOut):
    id: str
    deleted: Literal[True]


class DeletedSnapshotEnvelope(StrictOut):
    success: Literal[True]
    data: DeletedSnapshot
    meta: Meta


class RestoreOut(StrictOut):
    network_volume_id: str
    snapshot_id: str
    status: Literal["restoring", "done", "failed"]


class RestoreEnvelope(StrictOut):
    success: Literal[True]
    data: RestoreOut
    meta: Meta


# -- routes ----------------------------------------------------------------------------


@router.post(
    "/v1/clusters/{cluster_id}/snapshots",
    status_code=202,
    responses=documented(SnapshotEnvelope, 202),
)
def create_cluster_snapshot(
    cluster_id: str,
    request: Request,
    body: CreateSnapshot | None = None,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Snapshot the cluster's volume (or the network volume it mounts). Answers at
    once with ``status: creating``; the data is read in the background. Taken from a
    running cluster it is ``crash_consistent`` (allowed), from a stopped one
    ``stopped``."""
    body = body or CreateSnapshot()
    snap = svc.create_snapshot(
        app_state(request).ctx, principal, cluster_id, body.name, body.description
    )
    return ok(svc.snapshot_view(snap), status_code=202)


@router.post(
    "/v1/networkvolumes/{network_volume_id}/snapshots",
    status_code=202,
    responses=documented(SnapshotEnvelope, 202),
)
def create_volume_snapshot(
    network_volume_id: str,
    request: Request,
    body: CreateSnapshot | None = None,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Snapshot a network volume (crash-consistent while a cluster mounting it runs)."""
    body = body or CreateSnapshot()
    snap = svc.create_volume_snapshot(
        app_state(request).ctx, principal, network_volume_id, body.name, body.description
    )
    return ok(svc.snapshot_view(snap), status_code=202)


@router.post(
    "/v1/networkvolumes/{network_volume_id}/restore",
    status_code=202,
    responses=documented(RestoreEnvelope, 202),
)
def restore_network_volume(
    network_volume_id: str,
    body: RestoreVolume,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Replace a network volume's data with a snapshot's, once no running cluster
    mounts it. The restored copy replaces the volume only when whole."""
    row = svc.restore_volume_of_network_volume(
        app_state(request).ctx, principal, network_volume_id, body.snapshot_id
    )
    return ok(
        {
            "network_volume_id": row.holder_id,
            "snapshot_id": row.snapshot_id,
            "status": row.status,
        },
        status_code=202,
    )


@router.get("/v1/snapshots", responses=documented(SnapshotListEnvelope))
def list_snapshots(
    request: Request,
    principal: Principal = Depends(current_principal),
    cluster_id: str | None = Query(default=None, max_length=100),
    project_id: int | None = Query(default=None, ge=1, le=MAX_ID),
    network_volume_id: str | None = Query(default=None, max_length=100),
    status: SnapshotStatus | None = Query(default=None),
    page: int = Query(default=1, ge=1, le=1_000_000),
    per_page: int = Query(default=svc.DEFAULT_PER_PAGE, ge=1, le=svc.MAX_PER_PAGE),
    cursor: str | None = CURSOR_QUERY,
) -> JSONResponse:
    """The account's snapshots, newest first. Page with ``cursor`` (the previous
    answer's ``pagination.next_cursor``, same filters); ``page`` still works."""
    result = svc.snapshot_page(
        app_state(request).ctx,
        principal,
        cluster_id=cluster_id,
        project_id=project_id,
        network_volume_id=network_volume_id,
        status=status,
        per_page=per_page,
        page=page,
        cursor=cursor,
    )
    return ok(
        {
            "snapshots": [svc.snapshot_view(s) for s in result.snapshots],
            "pagination": pagination(page, per_page, result.total, result.next_cursor),
        }
    )


@router.get("/v1/snapshots/{snapshot_id}", responses=documented(SnapshotEnvelope))
def get_snapshot(
    snapshot_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    return ok(svc.snapshot_view(svc.get_snapshot(app_state(request).ctx, principal, snapshot_id)))


@router.delete("/v1/snapshots/{snapshot_id}", responses=documented(DeletedSnapshotEnvelope))
def delete_snapshot(
    snapshot_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Delete a ready or failed snapshot; billing stops at once and its data leaves
    the repository in the background."""
    svc.delete_snapshot(app_state(request).ctx, principal, snapshot_id)
    return ok({"id": snapshot_id, "deleted": True})
