"""``/runpod/v2/registries``: RunPod's Registry over gpuyard's private registry
credentials (services/tenancy/registry_auths.py, the rows of ``/v1/registry-auths``).

Credentials are write-only: the password is sealed at rest and, like the username,
never answered (a Registry is ``{id, name}``). Ids are gpuyard's integer ids as
strings; one that is not an id reads as unknown (404). ``/registries/delegations``
(RunPod's ECR delegation) is not served.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from gpuyard.api.runpod_v2.common import V2Body, answer, documented, no_content, v2_router
from gpuyard.api.state import app_state, current_principal
from gpuyard.core.input_rules import MAX_DB_ID
from gpuyard.services.tenancy import registry_auths as auths
from gpuyard.services.tenancy.auth import Principal

router = v2_router()


class CreateRegistryRequest(V2Body):
    name: str = Field(min_length=1, max_length=auths.MAX_NAME_CHARS)
    username: str = Field(min_length=1, max_length=auths.MAX_USERNAME_CHARS)
    password: str = Field(min_length=1, max_length=auths.MAX_PASSWORD_CHARS, repr=False)


def registry_view(row: Any) -> dict[str, Any]:
    return {"id": str(row.id), "name": row.name}


def _number(registry_id: str) -> int:
    """The integer id ``registry_id`` spells; RegistryAuthNotFound otherwise."""
    if registry_id.isascii() and registry_id.isdigit() and len(registry_id) <= 19:
        number = int(registry_id)
        if 1 <= number <= MAX_DB_ID:
            return number
    raise auths.RegistryAuthNotFound(
        f"registry {registry_id[:40]} not found", {"registry_id": registry_id[:40]}
    )


@router.get("/registries", responses=documented("ListRegistriesResponse: {registries}"))
def list_registries(
    request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """The account's registry credentials, oldest first (id and name only)."""
    rows = auths.list_registry_auths(app_state(request).ctx, principal, None)
    return answer({"registries": [registry_view(r) for r in rows]})


@router.post("/registries", status_code=201, responses=documented("Registry", 201))
def create_registry(
    body: CreateRegistryRequest, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Store credentials for a private registry (the name unique in the account: 409
    REGISTRY_AUTH_EXISTS). Name the answer's id as a template's or pod's ``registry``."""
    row = auths.create_registry_auth(
        app_state(request).ctx, principal, None, body.name, body.username, body.password
    )
    return answer(registry_view(row), 201)


@router.get("/registries/{id}", responses=documented("Registry"))
def get_registry(
    id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    number = _number(id)
    rows = auths.list_registry_auths(app_state(request).ctx, principal, None)
    row = next((r for r in rows if r.id == number), None)
    if row is None:
        raise _missing(id)
    return answer(registry_view(row))


def _missing(registry_id: str) -> auths.RegistryAuthNotFound:
    return auths.RegistryAuthNotFound(
        f"registry {registry_id} not found", {"registry_id": registry_id}
    )


@router.delete("/registries/{id}", status_code=204, responses=documented("Deleted", 204))
def delete_registry(
    id: str, request: Request, principal: Principal = Depends(current_principal)
) -> Response:
    """Delete credentials. Clusters and templates that name them pull anonymously from
    then on."""
    auths.delete_registry_auth(app_state(request).ctx, principal, None, _number(id))
    return no_content()
