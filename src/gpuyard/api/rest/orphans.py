"""``/v1/orphans`` (admin): engine objects of this installation that the database does
not know. Volumes are quarantined here, never deleted on sight (reconciler/duties/orphans.py);
an admin lists them and deletes one now, or lets the retention pass."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from gpuyard.api.http.conditional import ok_tagged
from gpuyard.api.http.envelope import ok
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas.responses import Meta, StrictOut, documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.fleet import orphans
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["orphans"], responses=ERROR_RESPONSES)


class Orphan(StrictOut):
    id: int
    kind: Literal["volume"]
    name: str
    host_id: int
    host: str | None
    cluster_id: str | None
    size_bytes: int | None
    found_at: str
    # null: kept until an admin deletes it (a volume a restore found that the backup
    # did not know).
    delete_after: str | None
    status: Literal["quarantined", "deleted", "released", "vanished"]
    deleted_at: str | None


class OrphanList(StrictOut):
    installation_id: str
    orphans: list[Orphan]


class OrphanListEnvelope(StrictOut):
    success: Literal[True]
    data: OrphanList
    meta: Meta


class OrphanEnvelope(StrictOut):
    success: Literal[True]
    data: Orphan
    meta: Meta


@router.get("/v1/orphans", responses=documented(OrphanListEnvelope))
async def list_orphans(
    request: Request,
    include_done: bool = Query(False, alias="all"),
    principal: Principal = Depends(current_principal),
) -> Response:
    """Quarantined volumes of this installation, oldest first (``all=true``: also the
    deleted, released and vanished ones). Admin. The answer's ``ETag`` is its data's
    digest: ``If-None-Match`` with it answers 304 while the list is the same
    (api/http/conditional.py)."""
    ctx = app_state(request).ctx
    rows = await run_in_threadpool(orphans.list_orphans, ctx, principal, include_done=include_done)
    return ok_tagged(request, {"installation_id": ctx.ownership.installation_id, "orphans": rows})


@router.delete("/v1/orphans/{orphan_id}", responses=documented(OrphanEnvelope))
async def delete_orphan(
    orphan_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Delete a quarantined volume now, with its data. Admin. 404 for an unknown id,
    409 when the engine refuses or a cluster owns the volume again."""
    state = app_state(request)
    oid = orphan_id
    row = await run_in_threadpool(
        orphans.delete_orphan, state.ctx, principal, state.runtime_of, oid
    )
    return ok(row)
