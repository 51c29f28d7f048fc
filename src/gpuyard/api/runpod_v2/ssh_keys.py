"""``/runpod/v2/account/ssh-keys``: RunPod's account SSH keys over gpuyard's
(services/access/ssh_key_use_cases.py, the rows of ``/v1/ssh-keys``).

As RunPod's ``pubKey`` on GraphQL, these are the caller's own keys in the account (a
key restricted to a project: the caller's keys of that project); other members' keys
are theirs. ``PUT`` replaces them with exactly the keys sent, in one transaction: a
key already stored keeps its row (and id on /v1), a new one is named by its comment,
and nothing changes when any key is refused (422 naming ``keys[i]``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, Field, WithJsonSchema

from gpuyard.api.runpod_v2.common import V2Body, answer, documented, v2_router
from gpuyard.api.state import app_state, current_principal
from gpuyard.core.errors import ValidationFailed
from gpuyard.services.access import ssh_key_use_cases as keys
from gpuyard.services.access.ssh_keys import MAX_KEYS_PER_TEXT, parse_public_key
from gpuyard.services.tenancy.auth import Principal

router = v2_router()


def _one_key(line: str) -> str:
    """One OpenSSH public key line, normalised; ValueError saying what is wrong."""
    if "\n" in line or "\r" in line:
        raise ValueError("one key per item, without line breaks")
    try:
        return parse_public_key(line)[0]
    except ValidationFailed as exc:
        raise ValueError(exc.message.removeprefix(f"{exc.field}: ")) from None


# RunPod's pattern of a key line; what it admits is then parsed (_one_key).
KEY_PATTERN = r"^(ssh|ecdsa|sk)-[^\s]+ [^\s]+([ \t][^\n\r]*)?$"
PublicKey = Annotated[
    str, AfterValidator(_one_key), WithJsonSchema({"type": "string", "pattern": KEY_PATTERN})
]


class UpdateSshKeysRequest(V2Body):
    keys: list[PublicKey] = Field(
        max_length=MAX_KEYS_PER_TEXT,
        description="OpenSSH public keys, one line each (`[]` removes them all)",
    )


@router.get("/account/ssh-keys", responses=documented("SshKeys: {keys}"))
def get_keys(request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    """The caller's public keys in the account, oldest first."""
    text = keys.own_public_keys(app_state(request).ctx, principal)
    return answer({"keys": [line for line in text.splitlines() if line]})


@router.put("/account/ssh-keys", responses=documented("SshKeys: {keys}"))
def put_keys(
    body: UpdateSshKeysRequest, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Make the caller's keys exactly these (all or nothing); answers them as stored."""
    rows = keys.replace_own_keys(app_state(request).ctx, principal, "\n".join(body.keys))
    return answer({"keys": [r.public_key for r in rows]})
