"""RFC 9457 problem details: the error answers of RunPod's REST v2 surface.

RunPod's v2 document answers every error as ``application/problem+json`` with
``{title, status, detail, errors}``; gpuyard adds RFC 9457's ``type`` (a stable URN
naming gpuyard's error code, so a client can branch on it) and ``code`` (the same code
as the v1 envelope's ``error.code``). ``errors`` is a list of strings, one per failing
field, ``"field: message"``.

Which surface a path belongs to is decided here by its prefix, so the exception
handlers and the middlewares that answer before routing (rate limit, body limit, NUL
guard, method not allowed, database outage) agree on the envelope.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse

RUNPOD_V2_PREFIX = "/runpod/v2"
PROBLEM_MEDIA_TYPE = "application/problem+json"


def is_runpod_v2(path: str) -> bool:
    """Whether ``path`` is on RunPod's REST v2 surface."""
    return path == RUNPOD_V2_PREFIX or path.startswith(RUNPOD_V2_PREFIX + "/")


def problem_type(code: str) -> str:
    """RFC 9457 ``type`` of gpuyard error ``code``: ``urn:gpuyard:error:not_found``."""
    return f"urn:gpuyard:error:{code.lower()}"


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_body(
    status: int, code: str, detail: str, errors: list[str] | None = None
) -> dict[str, Any]:
    """The problem document of one error answer."""
    return {
        "type": problem_type(code),
        "title": _title(status),
        "status": status,
        "detail": detail,
        "errors": errors if errors is not None else [],
        "code": code,
    }


def detail_errors(details: dict[str, Any]) -> list[str]:
    """``errors`` from a v1 envelope's ``details``: its field errors as strings."""
    listed = details.get("errors")
    if isinstance(listed, list):
        out = []
        for item in listed:
            if isinstance(item, dict) and "field" in item:
                out.append(f"{item['field']}: {item.get('message', 'invalid')}")
        if out:
            return out
    field = details.get("field")
    return [str(field)] if isinstance(field, str) else []


def problem_response(
    status: int,
    code: str,
    detail: str,
    errors: list[str] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """The whole answer: the problem document with RFC 9457's media type."""
    return JSONResponse(
        problem_body(status, code, detail, errors),
        status_code=status,
        headers=headers,
        media_type=PROBLEM_MEDIA_TYPE,
    )
