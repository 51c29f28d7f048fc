"""What the v2 resource modules share: the router they are built on, the problem
answers OpenAPI documents for them, the base of their request bodies, and the shapes
RunPod spells differently from gpuyard (``"8888/http"`` ports, date-times).

Errors are raised as gpuyard's (core/errors.py) and answered as problem details by the
app's handlers (api/http/errors.py); :func:`renamed` re-raises a use case's
ValidationFailed under the v2 field's name, so a problem names what the caller sent.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.problems import PROBLEM_MEDIA_TYPE, RUNPOD_V2_PREFIX
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.models import PortSpec
from gpuyard.core.text import nul_path

TAG = "runpod-v2"
M = TypeVar("M", bound=BaseModel)

_PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Problem",
    "description": "RFC 9457 problem details (RunPod's ErrorResponse, with type and code)",
    "required": ["type", "title", "status", "detail", "errors", "code"],
    "properties": {
        "type": {"type": "string", "description": "urn:gpuyard:error:<code>"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {"type": "array", "items": {"type": "string"}},
        "code": {"type": "string", "description": "gpuyard's error code"},
    },
}
_WHY: dict[int, str] = {
    400: "VALIDATION_ERROR: a body that is not JSON, a NUL character, or a value the "
    "installation refuses (an unknown data center, GPU type, image)",
    401: "UNAUTHORIZED: missing or invalid API key",
    403: "FORBIDDEN: the key or the member's role may not do this",
    404: "NOT_FOUND: no such resource in the acting account",
    405: "METHOD_NOT_ALLOWED (with `Allow`)",
    409: "INVALID_STATE (not possible in the resource's status now), a name already "
    "taken, a resource still in use, INSUFFICIENT_CAPACITY",
    413: "PAYLOAD_TOO_LARGE",
    422: "VALIDATION_ERROR: the body breaks the schema; ``errors`` names each field",
    429: "RATE_LIMITED (see Retry-After)",
}
PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": why, "content": {PROBLEM_MEDIA_TYPE: {"schema": _PROBLEM_SCHEMA}}}
    for status, why in _WHY.items()
}


def answer_docs(model: type[BaseModel], status: int, description: str) -> dict[int | str, Any]:
    """A route's successful answer of ``status`` with ``model``'s JSON, for OpenAPI."""
    return {status: {"model": model, "description": description}}


def v2_router() -> APIRouter:
    """A router of v2 routes (paths after ``/runpod/v2``), documented under TAG.

    The prefix is the router's own, not that of a router it is included in: a route's
    template (``route.path_format``, which the role check in api/state.py reads) then
    is the whole path, ``/runpod/v2/pods/{id}``; a prefix given at inclusion would leave
    it relative to that router."""
    return APIRouter(
        prefix=RUNPOD_V2_PREFIX,
        tags=[TAG],
        responses=PROBLEM_RESPONSES,
        route_class=OffLoopJsonRoute,
    )


def answer(body: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def no_content() -> Response:
    return Response(status_code=204)


def documented(description: str, status: int = 200) -> dict[int | str, dict[str, Any]]:
    """The success answer of a route for OpenAPI (its schema is RunPod's document's)."""
    if status == 204:
        return {204: {"description": description}}
    return {status: {"description": description, "content": {"application/json": {}}}}


class V2Body(BaseModel):
    """A v2 request body: members the document does not name are refused (422), a NUL
    anywhere is refused naming where."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        where = nul_path(data)
        if where is not None:
            raise ValueError(f"{where or 'body'}: must not contain NUL (\\u0000) characters")
        return data


@contextmanager
def renamed(fields: Mapping[str, str]) -> Iterator[None]:
    """Re-raise a ValidationFailed on a gpuyard field under its v2 name."""
    try:
        yield
    except ValidationFailed as exc:
        name = fields.get(exc.field)
        if name is None:
            raise
        reason = exc.message.removeprefix(f"{exc.field}: ")
        details = {k: v for k, v in exc.details.items() if k != "field"}
        raise ValidationFailed(name, reason, details) from exc


def inputs(model: type[M], data: dict[str, Any], names: Mapping[str, str]) -> M:
    """``data`` (gpuyard's field names) as ``model``, a use case's inputs. Its
    validation errors are the request's (422), each under the v2 name of its field
    (``names``: gpuyard's -> v2's)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = []
        for err in exc.errors():
            loc = list(err.get("loc", ()))
            if loc and isinstance(loc[0], str):
                loc[0] = names.get(loc[0], loc[0])
            errors.append({**err, "loc": ("body", *loc)})
        raise RequestValidationError(errors) from None


def iso(t: datetime | None) -> str | None:
    """A date-time as RFC 3339 UTC (``2026-01-15T16:00:00Z``)."""
    if t is None:
        return None
    return t.replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


# ---------------------------------------------------------------- ports

_PROTOCOLS = ("http", "tcp", "udp")


def parse_port(text: str) -> PortSpec:
    """RunPod's ``"8888/http"`` (``/tcp``, ``/udp``) as gpuyard's port spec. Raises
    ValueError saying what is wrong."""
    number, sep, protocol = text.partition("/")
    if not sep or protocol not in _PROTOCOLS:
        raise ValueError(f"{text[:40]!r} is not PORT/http, PORT/tcp or PORT/udp")
    if not number.isascii() or not number.isdigit() or not 1 <= int(number) <= 65535:
        raise ValueError(f"{text[:40]!r}: the port must be 1 to 65535")
    return PortSpec(internal_port=int(number), protocol=protocol)


def port_text(port: Mapping[str, Any]) -> str:
    """A stored port spec as RunPod's ``"8888/http"``."""
    return f"{port['internal_port']}/{port.get('protocol', 'tcp')}"


class Unprocessable(ValidationFailed):
    """A well-formed request whose value the document's schema refuses (RunPod's 422),
    for what a route checks itself (query lists)."""

    http_status = 422


def query_list(value: str | None) -> list[str]:
    """A comma-separated query parameter's items (``style: form, explode: false``)."""
    if value is None:
        return []
    return [item.strip() for item in value.split(",") if item.strip()]


def enum_items(field: str, value: str | None, allowed: tuple[str, ...]) -> list[str]:
    """``value``'s items, each one of ``allowed``; Unprocessable naming ``field``."""
    items = query_list(value)
    for item in items:
        if item not in allowed:
            raise Unprocessable(
                field, f"{item[:40]!r} is not one of {', '.join(allowed)}", {"allowed": allowed}
            )
    return items
