"""The error answers every REST route may give, declared once for OpenAPI.

Each REST v1/v2 router is built with ``responses=ERROR_RESPONSES`` so its operations
document the statuses the server really sends for them (the fuzz test in
tests/api/test_fuzz.py holds the server to this): each body is the v1 error envelope
(api/http/envelope.py ``ErrorEnvelope``). A route that can answer something more specific
adds it in its own decorator.
"""

from __future__ import annotations

from typing import Any

from gpuyard.api.http.envelope import ErrorEnvelope

_WHY: dict[int, str] = {
    400: "VALIDATION_ERROR naming the field (a malformed or out-of-range value, a body "
    "that is not JSON, a NUL character)",
    401: "UNAUTHORIZED: missing or invalid API key (with `WWW-Authenticate: Bearer`)",
    403: "FORBIDDEN: the key's scope is too small, or the account may not act for another",
    404: "CLUSTER_NOT_FOUND, PROJECT_NOT_FOUND, ...: no such resource in the acting account",
    409: "INVALID_STATE, INSUFFICIENT_CAPACITY, PORT_IN_USE (a chosen host port is held) "
    "or a name already taken",
    413: "PAYLOAD_TOO_LARGE: the body is larger than the server's limit",
    422: "IDEMPOTENCY_KEY_REUSED: the Idempotency-Key came with another body",
    429: "RATE_LIMITED: too many requests (see `Retry-After`)",
}

# Declared on every REST router. It also keeps FastAPI from documenting its own 422
# validation shape, which this server never sends (validation errors are 400s).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorEnvelope, "description": why} for status, why in _WHY.items()
}


def training_error_responses(schema_ref: dict[str, Any]) -> dict[str, Any]:
    """The same statuses for seed 002's surface, whose errors use its own envelope
    (``schema_ref``: the JSON schema of ``{code, data, errors, message}``); as raw
    OpenAPI for ``openapi_extra``, since those routes parse their requests by hand."""
    return {
        str(status): {"description": why, "content": {"application/json": {"schema": schema_ref}}}
        for status, why in _WHY.items()
    }
