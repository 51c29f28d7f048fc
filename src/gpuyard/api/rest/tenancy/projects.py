"""``/v1/projects``: the acting account's projects and the memberships given each."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas import resources as rs
from gpuyard.api.rest.schemas import tenancy as ts
from gpuyard.api.rest.schemas.resource_params import query_id
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.access.resource_util import iso
from gpuyard.services.tenancy import projects
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Member, Project, ProjectMember, User

# JSON bodies above a few KiB are parsed off the event loop (api/http/json_body.py).
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
    active_iam = query_id(request, "active_iam")
    row = projects.create_project(app_state(request).ctx, principal, active_iam, body.name)
    return ok(project_view(row), status_code=201)


def _member_view(pm: ProjectMember, m: Member, u: User) -> dict[str, Any]:
    return {
        "member_id": m.id,
        "user_id": u.id,
        "email": u.email,
        "role": m.role,
        "created_at": iso(pm.created_at),
    }


@router.patch("/v1/projects/{project_id}", responses=documented(rs.ProjectEnvelope))
def rename_project(
    project_id: IdPath,
    body: ts.RenameProject,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Rename a project of the acting account (MANAGE_PROJECTS)."""
    row = projects.rename_project(app_state(request).ctx, principal, project_id, body.name)
    return ok(project_view(row))


@router.delete("/v1/projects/{project_id}", responses=documented(ts.ProjectDeletedEnvelope))
def delete_project(
    project_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Delete a project that holds nothing live (409 PROJECT_NOT_EMPTY listing what it
    holds); never the default project (409)."""
    projects.delete_project(app_state(request).ctx, principal, project_id)
    return ok({"id": project_id, "deleted": True})


@router.get("/v1/projects/{project_id}/members", responses=documented(ts.ProjectMemberListEnvelope))
def list_project_members(
    project_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """The memberships given this project (members and viewers with projects act only
    in theirs)."""
    rows = projects.list_project_members(app_state(request).ctx, principal, project_id)
    return ok({"members": [_member_view(*r) for r in rows]})


@router.post(
    "/v1/projects/{project_id}/members",
    status_code=201,
    responses=documented(ts.ProjectMemberEnvelope, 201),
)
def add_project_member(
    project_id: IdPath,
    body: ts.AddProjectMember,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Give a membership of the account this project (409 if it has it already)."""
    state = app_state(request)
    row = projects.add_project_member(state.ctx, principal, project_id, body.member_id)
    state.keys.clear()  # the member's cached principals name their projects
    return ok(_member_view(*row), status_code=201)


@router.delete(
    "/v1/projects/{project_id}/members/{member_id}",
    responses=documented(ts.ProjectDeletedEnvelope),
)
def remove_project_member(
    project_id: IdPath,
    member_id: IdPath,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Take this project from a membership."""
    state = app_state(request)
    projects.remove_project_member(state.ctx, principal, project_id, member_id)
    state.keys.clear()
    return ok({"id": member_id, "deleted": True})
