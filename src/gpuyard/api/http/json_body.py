"""JSON request bodies parsed off the event loop.

A body is at most ``GPUYARD_MAX_BODY_BYTES`` (api/http/body_limit.py refuses larger ones
before they are read), but even a few hundred KiB of JSON takes milliseconds to parse,
and every other request on the loop would wait for it. So a body above
:data:`OFF_LOOP_BYTES` is parsed on a worker thread; smaller ones are parsed in place,
where a thread hand-off would cost more than the parse.

- :func:`loads` is that rule, for the surfaces that read their bodies themselves
  (GraphQL, the training API);
- :class:`OffLoopJsonRoute` applies it to FastAPI's own parsing of pydantic body
  parameters: give it as ``APIRouter(route_class=OffLoopJsonRoute)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import anyio.to_thread
from fastapi import Request, Response
from fastapi.routing import APIRoute

# Above this many bytes a body is parsed on a worker thread (about 0.1 ms of parsing).
OFF_LOOP_BYTES = 16 * 1024


async def loads(raw: bytes | str, parse: Callable[[bytes | str], Any] = json.loads) -> Any:
    """``parse(raw)`` (``json.loads``), on a worker thread when ``raw`` is larger than
    :data:`OFF_LOOP_BYTES`. Raises what ``parse`` raises (for ``json.loads``:
    ValueError, including JSONDecodeError, and RecursionError for absurd nesting)."""
    if len(raw) <= OFF_LOOP_BYTES:
        return parse(raw)
    return await anyio.to_thread.run_sync(parse, raw)


class OffLoopJsonRequest(Request):
    """A request whose ``json()`` follows :func:`loads` with :attr:`parse`."""

    parse: Callable[[bytes | str], Any] = staticmethod(json.loads)

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await loads(await self.body(), self.parse)
        return self._json


class OffLoopJsonRoute(APIRoute):
    """An APIRoute whose JSON body is parsed by :class:`OffLoopJsonRequest`; everything
    else (validation, errors, the OpenAPI document) is FastAPI's own."""

    request_class: type[OffLoopJsonRequest] = OffLoopJsonRequest

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            ours = self.request_class(request.scope, request.receive, request._send)
            return await handler(ours)

        return handle
