"""Refuse request bodies larger than ``GPUYARD_MAX_BODY_BYTES`` before anything reads
or parses them, in the envelope of the surface the request was meant for.

Contract:
- a ``Content-Length`` above the limit answers 413 at once: the body is never read
  (``receive`` is not called), so a client announcing 10 MB costs the server nothing;
- a body without a length (``Transfer-Encoding: chunked``, or a length that is not a
  number) is read here, counted, and refused with 413 as soon as it passes the limit,
  without reading the rest; a body within the limit is handed to the app whole, as one
  message, so the app sees exactly what the client sent;
- a body with a valid ``Content-Length`` within the limit passes through untouched: the
  HTTP server delivers at most that many bytes;
- every 413 carries ``Connection: close``: the unread rest of the body must never be
  taken for the next request on the connection.

Pure ASGI (no BaseHTTPMiddleware): it adds no task, no buffering and no copy for the
requests that carry no body.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuyard.api.http.surface_errors import surface_error, surface_media_type

CODE = "PAYLOAD_TOO_LARGE"


def too_large_body(path: str, limit: int) -> dict[str, Any]:
    """The 413 body in the envelope of the surface ``path`` belongs to: GraphQL
    ``errors[]``, the training API's ``{code, data, errors, message}``, else REST v1
    (v2 keeps the v1 envelope for errors)."""
    message = f"request body is larger than {limit} bytes (GPUYARD_MAX_BODY_BYTES)"
    return surface_error(path, 413, CODE, message, {"limit_bytes": limit})


def _framing(scope: Scope) -> tuple[int | None, bool]:
    """``(content_length, must_count)``: the announced length when it is a valid one,
    and whether the body's size is unknown up front (chunked, or a length that is not
    a plain number) so it must be counted."""
    length: int | None = None
    must_count = False
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            if length is not None or not value.isdigit():
                must_count = True  # repeated or malformed: trust only what arrives
            else:
                length = int(value)
        elif name == b"transfer-encoding":
            must_count = True
    return length, must_count


# A route's own limit: ``(method, path) -> bytes``, or None for the default.
PathLimits = Callable[[str, str], int | None]


def _no_path_limits(_method: str, _path: str) -> int | None:
    return None


class BodyLimit:
    """ASGI middleware enforcing ``max_bytes`` on every HTTP request body, or the
    larger limit ``path_limits`` gives a route (a serverless job's input, a worker's
    result)."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, path_limits: PathLimits = _no_path_limits
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = path_limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits(scope.get("method", ""), scope.get("path", "")) or self.max_bytes
        length, must_count = _framing(scope)
        if length is not None and length > limit:
            await self._refuse(scope, send, limit)
            return
        if not must_count:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body was complete
            body: bytes = message.get("body", b"")
            size += len(body)
            if size > limit:
                await self._refuse(scope, send, limit)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: only http.disconnect
            replayed = True
            return whole

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send, limit: int) -> None:
        path = scope.get("path", "")
        body = json.dumps(too_large_body(path, limit)).encode()
        headers = [
            (b"content-type", surface_media_type(path).encode()),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
