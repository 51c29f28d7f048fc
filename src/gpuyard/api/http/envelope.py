"""The REST v1 envelope: ``{success, data, meta: {request_id}}`` and
``{success: false, error: {code, message, details}}`` (seed 000)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel

from gpuyard.core.errors import GpuyardError
from gpuyard.core.ids import new_request_id


def ok(data: Any, status_code: int = 200, **meta: Any) -> JSONResponse:
    return JSONResponse(
        {"success": True, "data": data, "meta": {"request_id": new_request_id(), **meta}},
        status_code=status_code,
    )


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "success": False,
        "error": {"code": code, "message": message, "details": details or {}},
        "meta": {"request_id": new_request_id()},
    }


def error_response(exc: GpuyardError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
    return JSONResponse(
        error_body(exc.code, exc.message, exc.details), status_code=exc.http_status, headers=headers
    )


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any]


class Meta(BaseModel):
    request_id: str


class ErrorEnvelope(BaseModel):
    """The body of every error answer (documented in OpenAPI)."""

    success: bool = False
    error: ErrorDetail
    meta: Meta


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorEnvelope, "description": "VALIDATION_ERROR naming the field"},
    401: {"model": ErrorEnvelope, "description": "UNAUTHORIZED: missing or invalid API key"},
    403: {"model": ErrorEnvelope, "description": "FORBIDDEN: the key's scope is too small"},
    404: {"model": ErrorEnvelope, "description": "CLUSTER_NOT_FOUND, SNAPSHOT_NOT_FOUND, ..."},
    409: {
        "model": ErrorEnvelope,
        "description": "INVALID_STATE, INSUFFICIENT_CAPACITY or PORT_IN_USE",
    },
}
