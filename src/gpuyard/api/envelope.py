"""The REST v1 envelope: ``{success, data, meta: {request_id}}`` and
``{success: false, error: {code, message, details}}`` (seed 000)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

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
