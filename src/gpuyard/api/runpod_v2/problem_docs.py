"""The error answers of RunPod v2's routes, declared once for OpenAPI: each an RFC
9457 problem document (api/http/problems.py) as ``application/problem+json``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Problem(BaseModel):
    """RFC 9457 problem details, as RunPod's ``ErrorResponse`` plus ``type`` and
    ``code`` (gpuyard's error code)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    errors: list[str]
    code: str


_WHY: dict[int, str] = {
    400: "VALIDATION_ERROR naming the field (a value the request's rules refuse, a body "
    "that is not JSON, a NUL character); INSUFFICIENT_CAPACITY when no candidate has room",
    401: "UNAUTHORIZED: missing or invalid API key (with `WWW-Authenticate: Bearer`)",
    403: "FORBIDDEN: the key's scope is too small",
    404: "CLUSTER_NOT_FOUND, ...: no such resource in the acting account",
    405: "METHOD_NOT_ALLOWED (with `Allow`)",
    409: "INVALID_STATE: not possible in the resource's current status",
    413: "PAYLOAD_TOO_LARGE: the body is larger than the server's limit",
    422: "VALIDATION_ERROR: the body breaks its schema (`errors` lists each violation)",
    429: "RATE_LIMITED: too many requests (see `Retry-After`)",
}


def _schema() -> dict[str, Any]:
    return Problem.model_json_schema()


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {
        "description": why,
        "content": {"application/problem+json": {"schema": _schema()}},
    }
    for status, why in _WHY.items()
}


def problem_docs(
    model: type[BaseModel], status: int, description: str
) -> dict[int | str, dict[str, Any]]:
    """A route's answer of ``status`` with ``model``'s JSON."""
    return {status: {"model": model, "description": description}}
