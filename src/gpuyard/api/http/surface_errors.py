"""One error body in the envelope of the surface a request path belongs to.

Middlewares that answer before routing (the NUL guard, the body limit, the rate
limiter) know only the path; this picks the envelope for them, the same way the
routes' own handlers would answer: GraphQL ``{"errors": [...]}`` for ``/graphql``,
seed 002's ``{code, data, errors, message}`` for the training API, RFC 9457 problem
details for RunPod's REST v2 (``/runpod/v2``), else the REST v1 envelope (the seed's
``/v2/clusters`` keeps it for errors).
"""

from __future__ import annotations

from typing import Any

from gpuyard.api.graphql.errors import request_error
from gpuyard.api.http.envelope import error_body
from gpuyard.api.http.problems import PROBLEM_MEDIA_TYPE, detail_errors, is_runpod_v2, problem_body

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
    if is_runpod_v2(path):
        return problem_body(status, code, message, detail_errors(details))
    if path.startswith(TRAINING_PREFIX):
        errors = {"code": code, **({"field": details["field"]} if "field" in details else {})}
        errors["details"] = details
        return {"code": status, "data": {}, "errors": errors, "message": message}
    return error_body(code, message, details)


def surface_media_type(path: str) -> str:
    """The ``content-type`` of an error answer for a request to ``path``."""
    return PROBLEM_MEDIA_TYPE if is_runpod_v2(path) else "application/json"
