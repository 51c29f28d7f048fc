"""``/v1/projects``: the acting account's projects."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api import resource_schemas as rs
from gpuyard.api.envelope import ok
from gpuyard.api.json_body import OffLoopJsonRoute
from gpuyard.api.openapi_responses import ERROR_RESPONSES
from gpuyard.api.resource_params import query_id
from gpuyard.api.schemas import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services import projects
from gpuyard.services.auth import Principal
from gpuyard.services.resource_util import iso
from gpuyard.store.schema import Project

# JSON bodies above a few KiB are parsed off the event loop (api/json_body.py).
router = APIRouter(tags=["projects"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)


def project_view(p: Project) -> dict[str, Any]:
    return {"id": p.id, "name": p.name, "is_default": p.is_default, "created_at": iso(p.created_at)}


@router.get("/v1/projects", responses=documented(rs.ProjectListEnvelope))
def list_projects(
    request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """The projects of the acting account (``active_iam``: another account the
    caller is a member of), oldest first."""
    active_iam = query_id(request, "active_iam")
    rows = projects.list_projects(app_state(request).ctx, principal, active_iam)
    return ok({"projects": [project_view(p) for p in rows]})


@router.post("/v1/projects", status_code=201, responses=documented(rs.ProjectEnvelope, 201))
def create_project(
    body: rs.CreateProject, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Create a (non-default) project in the acting account. Needs the write scope."""
    principal.require_write()
    active_iam = query_id(request, "active_iam")
    row = projects.create_project(app_state(request).ctx, principal, active_iam, body.name)
    return ok(project_view(row), status_code=201)
