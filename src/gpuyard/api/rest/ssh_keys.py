"""``/v1/ssh-keys``: the acting account's SSH public keys. A key belongs to the caller
who adds it (and to its API key's project, when that key is restricted to one);
services/access/ssh_key_use_cases.py says who sees and removes which."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas import resources as rs
from gpuyard.api.rest.schemas.resource_params import query_id
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.access import ssh_key_use_cases as keys
from gpuyard.services.access.ssh_keys import ssh_key_view
from gpuyard.services.tenancy.auth import Principal

# JSON bodies above a few KiB are parsed off the event loop (api/http/json_body.py).
router = APIRouter(tags=["ssh-keys"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)


@router.get("/v1/ssh-keys", responses=documented(rs.SshKeyListEnvelope))
def list_keys(request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    """The acting account's keys, oldest first."""
    active_iam = query_id(request, "active_iam")
    rows = keys.list_ssh_keys(app_state(request).ctx, principal, active_iam)
    return ok({"ssh_keys": [ssh_key_view(r) for r in rows]})


@router.post("/v1/ssh-keys", status_code=201, responses=documented(rs.SshKeyEnvelope, 201))
def add_key(
    body: rs.AddSshKey, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Add an OpenSSH public key (ssh-ed25519, ssh-rsa, ecdsa-sha2-nistp256/384/521 or
    a security-key type). It is validated, stored normalised and fingerprinted."""
    active_iam = query_id(request, "active_iam")
    row = keys.add_ssh_key(
        app_state(request).ctx, principal, active_iam, body.name, body.public_key
    )
    return ok(ssh_key_view(row), status_code=201)


@router.get("/v1/ssh-keys/{ssh_key_id}", responses=documented(rs.SshKeyEnvelope))
def get_key(
    ssh_key_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    active_iam = query_id(request, "active_iam")
    row = keys.show_ssh_key(app_state(request).ctx, principal, active_iam, ssh_key_id)
    return ok(ssh_key_view(row))


@router.delete("/v1/ssh-keys/{ssh_key_id}", responses=documented(rs.DeletedEnvelope))
def delete_key(
    ssh_key_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Delete a key (your own; anyone's with ``manage_members``). The SSH gateway and
    the clusters' sshd stop taking it within seconds; training clusters that
    authorised it keep it on their nodes until their keys are next replaced
    (``update_ssh_keys``)."""
    active_iam = query_id(request, "active_iam")
    keys.delete_ssh_key(app_state(request).ctx, principal, active_iam, ssh_key_id)
    return ok({"id": ssh_key_id, "deleted": True})
