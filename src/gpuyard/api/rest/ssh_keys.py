"""``/v1/ssh-keys``: the acting account's SSH public keys. A key belongs to the caller
who adds it (and to its API key's project, when that key is restricted to one);
services/access/ssh_keys.py says who sees and removes which."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas import resources as rs
from gpuyard.api.rest.schemas.resource_params import account_of
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.access import ssh_keys
from gpuyard.services.tenancy.auth import Principal

# JSON bodies above a few KiB are parsed off the event loop (api/http/json_body.py).
router = APIRouter(tags=["ssh-keys"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)


@router.get("/v1/ssh-keys", responses=documented(rs.SshKeyListEnvelope))
def list_keys(request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    """The acting account's keys, oldest first."""
    with app_state(request).ctx.read() as session:
        rows = ssh_keys.list_keys(session, account_of(session, principal, request), principal)
        return ok({"ssh_keys": [ssh_keys.ssh_key_view(r) for r in rows]})


@router.post("/v1/ssh-keys", status_code=201, responses=documented(rs.SshKeyEnvelope, 201))
def add_key(
    body: rs.AddSshKey, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Add an OpenSSH public key (ssh-ed25519, ssh-rsa, ecdsa-sha2-nistp256/384/521 or
    a security-key type). It is validated, stored normalised and fingerprinted."""
    principal.require_write()
    with app_state(request).ctx.transaction() as session:
        account_id = account_of(session, principal, request)
        row = ssh_keys.add_key(
            session,
            account_id,
            body.name,
            body.public_key,
            user_id=principal.user_id,
            project_id=ssh_keys.registering_project(session, principal),
        )
        data = ssh_keys.ssh_key_view(row)
    return ok(data, status_code=201)


@router.get("/v1/ssh-keys/{ssh_key_id}", responses=documented(rs.SshKeyEnvelope))
def get_key(
    ssh_key_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    key_id = ssh_key_id
    with app_state(request).ctx.read() as session:
        row = ssh_keys.get_key(session, account_of(session, principal, request), key_id, principal)
        return ok(ssh_keys.ssh_key_view(row))


@router.delete("/v1/ssh-keys/{ssh_key_id}", responses=documented(rs.DeletedEnvelope))
def delete_key(
    ssh_key_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Delete a key (your own; anyone's with ``manage_members``). The SSH gateway and
    the clusters' sshd stop taking it within seconds; training clusters that
    authorised it keep it on their nodes until their keys are next replaced
    (``update_ssh_keys``)."""
    principal.require_write()
    key_id = ssh_key_id
    with app_state(request).ctx.transaction() as session:
        ssh_keys.delete_key(session, account_of(session, principal, request), key_id, principal)
    return ok({"id": key_id, "deleted": True})
