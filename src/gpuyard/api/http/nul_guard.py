"""Refuse a request whose path or query string holds a NUL character (raw or ``%00``)
before any routing, in the envelope of the surface it was meant for: no such text can
reach a query (PostgreSQL would fail it with an error the user should never see).
Bodies are checked where each surface parses them (core.text.nul_path)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from gpuyard.api.http.surface_errors import surface_error, surface_media_type
from gpuyard.core.text import NUL


def _field(scope: Scope) -> str | None:
    """The part of the request holding a NUL: ``path``, a query parameter's name, or
    None when there is none."""
    if NUL in scope.get("path", ""):
        return "path"
    raw: bytes = scope.get("query_string", b"")
    if b"%00" not in raw and b"\x00" not in raw:
        return None
    for name, value in parse_qsl(raw.decode("latin-1"), keep_blank_values=True):
        if NUL in name or NUL in value:
            return name.replace(NUL, "") or "query"
    return "query"


def _answer(path: str, field: str) -> dict[str, Any]:
    message = f"{field}: must not contain NUL (\\u0000) characters"
    return surface_error(path, 400, "VALIDATION_ERROR", message, {"field": field})


class NulGuard:
    """Pure ASGI middleware; outermost, so the fast paths behind it are covered too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        field = _field(scope) if scope["type"] == "http" else None
        if field is None:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        body = json.dumps(_answer(path, field)).encode()
        headers = [
            (b"content-type", surface_media_type(path).encode()),
            (b"content-length", b"%d" % len(body)),
        ]
        await send({"type": "http.response.start", "status": 400, "headers": headers})
        await send({"type": "http.response.body", "body": body})
