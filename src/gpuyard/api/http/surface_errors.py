"""One error body in the envelope of the surface a request path belongs to.

Middlewares that answer before routing (the NUL guard, the body limit, the rate
limiter) know only the path; this picks the envelope for them, the same way the
routes' own handlers would answer: GraphQL ``{"errors": [...]}`` for ``/graphql``,
seed 002's ``{code, data, errors, message}`` for the training API, else the REST v1
envelope (v2 keeps it for errors).
"""

from __future__ import annotations

from typing import Any

from gpuyard.api.graphql.errors import request_error
from gpuyard.api.http.envelope import error_body

TRAINING_PREFIX = "/distributed_jobs_v2"


def is_graphql(path: str) -> bool:
    return path == "/graphql" or path.startswith("/graphql/")


def surface_error(
    path: str, status: int, code: str, message: str, details: dict[str, Any]
) -> dict[str, Any]:
    """The body of an error answer with HTTP ``status`` for a request to ``path``."""
    if is_graphql(path):
        body = request_error(code, message)
        body["errors"][0]["extensions"]["details"] = details
        return body
    if path.startswith(TRAINING_PREFIX):
        errors = {"code": code, **({"field": details["field"]} if "field" in details else {})}
        errors["details"] = details
        return {"code": status, "data": {}, "errors": errors, "message": message}
    return error_body(code, message, details)
