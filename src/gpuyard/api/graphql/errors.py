"""GraphQL errors: the REST codes in ``errors[].extensions.code``, internals masked.

Resolvers raise only :class:`~gpuyard.core.errors.GpuyardError` subclasses; anything
else reaching :func:`format_error` is logged with its traceback and shown as
``INTERNAL_ERROR`` without detail. Errors raised by graphql-core itself (syntax,
validation, argument coercion) carry no original error and become
``VALIDATION_ERROR``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from graphql import GraphQLError
from pydantic import ValidationError

from gpuyard.core.errors import DatabaseUnavailable, GpuyardError, ValidationFailed
from gpuyard.store.outage import is_database_unavailable, unavailable

log = logging.getLogger(__name__)

INTERNAL_MESSAGE = "internal error; see the server log"


def limit_error(message: str, limit: str, maximum: int) -> GraphQLError:
    """A validation error for a document over one of the configured limits."""
    return GraphQLError(
        message,
        extensions={"code": "VALIDATION_ERROR", "details": {"limit": limit, "max": maximum}},
    )


def from_pydantic(
    exc: ValidationError, names: Mapping[str, str], prefix: str = "input"
) -> ValidationFailed:
    """The first problem of a use-case body as VALIDATION_ERROR, the field named as the
    GraphQL input names it (``names`` maps body fields to GraphQL field names)."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid input"}
    parts = []
    for p in first.get("loc", ()):
        if isinstance(p, int):
            parts.append(f"[{p}]")
        else:
            parts.append("." + names.get(str(p), str(p)))
    field = prefix + "".join(parts)
    return ValidationFailed(field, str(first.get("msg", "invalid")))


def renamed(exc: ValidationFailed, names: Mapping[str, str]) -> ValidationFailed:
    """A use case's VALIDATION_ERROR with its field named as the GraphQL input names it
    (``bid_per_gpu`` -> ``input.bidPerGpu``); unchanged when the field is not an input's."""
    name = names.get(exc.field)
    if name is None:
        return exc
    message = exc.message.removeprefix(f"{exc.field}: ")
    details = {k: v for k, v in exc.details.items() if k != "field"}
    return ValidationFailed(f"input.{name}", message, details)


def format_error(error: GraphQLError) -> dict[str, Any]:
    """The JSON of one error. Never exposes an unexpected exception's text."""
    original = error.original_error
    body: dict[str, Any] = {"message": error.message}
    if error.locations:
        body["locations"] = [{"line": loc.line, "column": loc.column} for loc in error.locations]
    if error.path:
        body["path"] = list(error.path)
    if original is not None and is_database_unavailable(original):
        original = unavailable(original)
    if isinstance(original, GpuyardError):
        if original.http_status >= 500 and not isinstance(original, DatabaseUnavailable):
            log.error("%s: %s", original.code, original.message)
        body["message"] = original.message
        body["extensions"] = {"code": original.code, "details": original.details}
    elif original is not None and not isinstance(original, GraphQLError):
        log.error("unhandled error in a GraphQL resolver", exc_info=original)
        body["message"] = INTERNAL_MESSAGE
        body["extensions"] = {"code": "INTERNAL_ERROR"}
    else:
        extensions = dict(error.extensions or {})
        extensions.setdefault("code", "VALIDATION_ERROR")
        body["extensions"] = extensions
    return body


def request_error(code: str, message: str) -> dict[str, Any]:
    """A whole-request failure (bad body, auth) as a GraphQL response body."""
    return {"errors": [{"message": message, "extensions": {"code": code}}]}
