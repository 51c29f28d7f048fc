"""``/v1/security-groups``: a project's named lists of inbound rules."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas import resources as rs
from gpuyard.api.rest.schemas.resource_params import project_ref
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.access import security_groups as sg
from gpuyard.services.tenancy.auth import Principal

# JSON bodies above a few KiB are parsed off the event loop (api/http/json_body.py).
router = APIRouter(
    tags=["security-groups"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute
)


def _rules(body: rs.SecurityGroupIn) -> list[dict[str, object]]:
    # Back to plain JSON values: core/network/secgroups.py validates and names the fields.
    return [r.model_dump() for r in body.rules]


@router.get("/v1/security-groups", responses=documented(rs.SecurityGroupListEnvelope))
def list_groups(
    request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """The project's security groups (``project_id``; default: the default project)."""
    rows = sg.list_project_groups(app_state(request).ctx, principal, project_ref(request))
    return ok({"security_groups": [sg.group_view(r) for r in rows]})


@router.post(
    "/v1/security-groups", status_code=201, responses=documented(rs.SecurityGroupEnvelope, 201)
)
def create_group(
    body: rs.SecurityGroupIn, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Create a group. Rules only allow: ``protocol`` tcp|udp|all to ``port_range``
    ("22" or "8000-9000") from ``source_cidr``; no rules denies everything."""
    row = sg.create_project_group(
        app_state(request).ctx,
        principal,
        project_ref(request),
        body.name,
        body.description,
        _rules(body),
    )
    return ok(sg.group_view(row), status_code=201)


@router.get(
    "/v1/security-groups/{security_group_id}", responses=documented(rs.SecurityGroupEnvelope)
)
def get_group(
    security_group_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    wanted = security_group_id
    row = sg.show_group(app_state(request).ctx, principal, wanted, project_ref(request))
    return ok(sg.group_view(row))


@router.put(
    "/v1/security-groups/{security_group_id}", responses=documented(rs.SecurityGroupEnvelope)
)
def replace_group(
    security_group_id: IdPath,
    body: rs.SecurityGroupIn,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Replace the name, description (absent: empty) and rules. Training clusters that
    attach the group enforce the new rules from then on."""
    wanted = security_group_id
    row = sg.update_group(
        app_state(request).ctx,
        principal,
        wanted,
        project_ref(request),
        body.name,
        body.description,
        _rules(body),
    )
    return ok(sg.group_view(row))


@router.delete("/v1/security-groups/{security_group_id}", responses=documented(rs.DeletedEnvelope))
def delete_group(
    security_group_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Delete a group; one attached to a live training cluster is 409 INVALID_STATE."""
    wanted = security_group_id
    sg.remove_group(app_state(request).ctx, principal, wanted, project_ref(request))
    return ok({"id": wanted, "deleted": True})
