"""The web console: its page at ``/``, its assets under ``/console/``, its sign-in
routes and session middleware (api/console/session.py).

The console is plain ES modules and CSS in gpuyard/console/static (no build step, no
CDN): a single page that calls the public API with ``fetch`` like any client.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

import gpuyard
from gpuyard.api.console import session as console_session
from gpuyard.api.state import AppState

STATIC = Path(gpuyard.__file__).resolve().parent / "console" / "static"

# The page loads only its own files and talks only to this origin (WebSocket included).
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; "
        "script-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
        "form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-cache",
}


class PageAssets(StaticFiles):
    """StaticFiles with the page's security headers; revalidated (ETag) every load."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


def install(app: FastAPI) -> None:
    """Serve the console from ``app`` and accept console sessions."""
    state: AppState = app.state.gpuyard
    cache = console_session.SessionCache(state.ctx)
    app.state.console_sessions = cache
    app.include_router(console_session.router)

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return FileResponse(STATIC / "index.html", headers=HEADERS)

    app.mount("/console", PageAssets(directory=STATIC), name="console")
    app.add_middleware(console_session.ConsoleSessions, cache=cache)
