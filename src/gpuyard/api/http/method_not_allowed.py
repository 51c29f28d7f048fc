"""405 answers that say which methods the path does take (RFC 9110 §15.5.6: ``Allow``).

Starlette's router answers a method it has no route for with the ``Allow`` of the
first route whose path matched, so a path served by several routes (``GET`` and
``DELETE /v1/clusters/{id}``) would name only some of its methods. This handler names
every method of every route matching the path, in the v1 error envelope (seed 002's
paths in theirs).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from gpuyard.api.http.surface_errors import surface_error, surface_media_type

# The methods a route here may serve, in the order ``Allow`` lists them.
_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(routes: list[BaseRoute], scope: Scope) -> list[str]:
    """Every method of ``_ORDER`` that some route of ``routes`` fully matches for the
    path of ``scope``. Asked through ``matches``, the routes' public interface, so
    routers included in routers are covered too."""
    allowed = []
    for method in _ORDER:
        probe = {**scope, "method": method}
        if any(route.matches(probe)[0] is Match.FULL for route in routes):
            allowed.append(method)
    return allowed


def answer(request: Request) -> JSONResponse:
    """The 405 for ``request``: ``Allow`` and the surface's own error envelope."""
    allowed = allowed_methods(request.app.router.routes, request.scope)
    message = f"{request.method} is not allowed here; allowed: {', '.join(allowed) or 'none'}"
    body = surface_error(request.url.path, 405, "METHOD_NOT_ALLOWED", message, {"allowed": allowed})
    return JSONResponse(
        body,
        status_code=405,
        headers={"Allow": ", ".join(allowed)},
        media_type=surface_media_type(request.url.path),
    )


def install(app: FastAPI) -> None:
    """Answer every 405 with :func:`answer` (Starlette consults handlers by status
    before handlers by exception class, so the generic HTTPException one never sees it)."""

    async def _method_not_allowed(request: Request, _: Exception) -> JSONResponse:
        return answer(request)

    app.add_exception_handler(405, _method_not_allowed)
