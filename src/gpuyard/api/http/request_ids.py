"""One id per HTTP request (core/ids.py): its envelope's ``meta.request_id`` and the
audit events it records name the same request."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from gpuyard.core.ids import begin_request, end_request


class RequestIds:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = begin_request()
        try:
            await self.app(scope, receive, send)
        finally:
            end_request(token)
