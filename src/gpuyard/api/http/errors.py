"""Exception handlers: every failure leaves in its surface's envelope, never as a trace.

The REST v1 envelope everywhere, except on RunPod's REST v2 (``/runpod/v2``), which
answers RFC 9457 problem details (api/http/problems.py)."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from gpuyard.api.http.database_outage import ErrorGuard, outage_answer
from gpuyard.api.http.envelope import error_body, error_response
from gpuyard.api.http.problems import detail_errors, is_runpod_v2, problem_response
from gpuyard.core.errors import GpuyardError
from gpuyard.store.outage import is_database_unavailable

log = logging.getLogger(__name__)

_HTTP_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
}


_NAMED_ERROR = re.compile(r"^([A-Za-z_][\w.\[\]-]*): (.+)$", re.DOTALL)


def field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """``("body", "ports", 0, "internal_port")`` -> ``ports[0].internal_port``."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out or "body"


def _reason(err: Any) -> dict[str, Any]:
    """The machine-readable why of one validation error, for clients that word it
    themselves (the console: "Image: required"): ``reason`` is pydantic's error type
    ("missing", "string_too_short", "greater_than_equal", ...) and ``limits`` its
    plain-valued context ({"min_length": 1}, {"ge": 1}); anything else is left out."""
    ctx = err.get("ctx") or {}
    limits = {k: v for k, v in ctx.items() if isinstance(v, (int, float, str, bool))}
    out: dict[str, Any] = {"reason": str(err.get("type", "invalid"))}
    if limits and err.get("type") != "value_error":
        out["limits"] = limits
    return out


def validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """Each failing field of ``exc``: ``{field, message, reason[, limits]}``."""
    errors = []
    for err in exc.errors():
        loc = err.get("loc", ())
        field = field_path(loc)
        msg = str(err.get("msg", "invalid"))
        if err.get("type") == "json_invalid":
            field, msg = "body", "request body is not valid JSON"
        elif err.get("type") == "extra_forbidden":
            msg = "unknown field"
        elif field == "body" and err.get("type") == "value_error":
            # A whole-body check (the NUL guard of the request models) says where in its
            # message, "env.TOKEN: must not contain ...": name that field.
            named = _NAMED_ERROR.match(str((err.get("ctx") or {}).get("error", "")))
            if named is not None:
                field, msg = named.group(1), named.group(2)
        errors.append({"field": field, "message": msg, **_reason(err)})
    return errors


def validation_response(exc: RequestValidationError) -> JSONResponse:
    errors = validation_errors(exc)
    first = errors[0] if errors else {"field": "body", "message": "invalid request"}
    return JSONResponse(
        error_body(
            "VALIDATION_ERROR",
            f"{first['field']}: {first['message']}",
            {"field": first["field"], "errors": errors},
        ),
        status_code=400,
    )


class UnexpectedErrors(ErrorGuard):
    """ASGI middleware: an exception no handler took becomes the 500 envelope here,
    and is not raised further. Starlette's outermost error middleware would answer the
    same body but then re-raise, and uvicorn closes the connection of a request whose
    app raised: the client's next request on that keep-alive connection would fail."""

    async def answer(self, exc: Exception, scope: Scope, receive: Receive, send: Send) -> bool:
        if is_database_unavailable(exc):
            await outage_answer(scope.get("path", ""), exc)(scope, receive, send)
            return True
        log.exception("unhandled error")
        await _internal_error(scope.get("path", ""))(scope, receive, send)
        return True


def _internal_error(path: str) -> JSONResponse:
    message = "internal error; see the server log"
    if is_runpod_v2(path):
        return problem_response(500, "INTERNAL_ERROR", message)
    return JSONResponse(error_body("INTERNAL_ERROR", message), status_code=500)


def _problem_of_validation(exc: RequestValidationError) -> JSONResponse:
    """v2: a body that is not JSON is 400; JSON that breaks the schema is 422."""
    errors = validation_errors(exc)
    listed = [f"{e['field']}: {e['message']}" for e in errors]
    status = 400 if any(e.get("reason") == "json_invalid" for e in errors) else 422
    return problem_response(status, "VALIDATION_ERROR", listed[0] if listed else "invalid", listed)


def install(app: FastAPI) -> None:
    # Innermost of the middlewares (install runs before the others are added): it
    # wraps routing and every handler.
    app.add_middleware(UnexpectedErrors)

    @app.exception_handler(GpuyardError)
    async def _domain(request: Request, exc: GpuyardError) -> JSONResponse:
        if exc.http_status >= 500:
            log.error("%s: %s", exc.code, exc.message)
        if is_runpod_v2(request.url.path):
            headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
            errors = detail_errors(exc.details)
            return problem_response(exc.http_status, exc.code, exc.message, errors, headers)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        if is_runpod_v2(request.url.path):
            return _problem_of_validation(exc)
        return validation_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "HTTP_ERROR")
        if is_runpod_v2(request.url.path):
            return problem_response(exc.status_code, code, str(exc.detail))
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _internal_error(request.url.path)
