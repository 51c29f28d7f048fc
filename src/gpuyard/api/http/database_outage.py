"""Requests that meet a database that is away (a failover, a restart) are answered
503 DATABASE_UNAVAILABLE with ``Retry-After``, in the envelope of their surface — never
a 500 and a stack trace. The server itself needs nothing done: its pool connects again
to the node that takes writes once there is one (store/outage.py).

:func:`outage_answer` is the answer; :class:`DatabaseOutage` gives it for what the
middlewares ahead of routing (the fast path, the rate limiter, the console session)
raise, and api/http/errors.py for what routes raise.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuyard.api.http.surface_errors import surface_error, surface_media_type
from gpuyard.store.outage import is_database_unavailable, unavailable

# A failover takes about the leader key's time to live (Patroni's ttl, 30 s by
# default, often 10): a client asks again soon, and again, rather than give up.
RETRY_AFTER_S = 2


def outage_answer(path: str, exc: BaseException) -> JSONResponse:
    """The 503 answer for a request to ``path`` that failed with outage ``exc``."""
    err = unavailable(exc)
    return JSONResponse(
        surface_error(path, err.http_status, err.code, err.message, err.details),
        status_code=err.http_status,
        headers={"Retry-After": str(RETRY_AFTER_S)},
        media_type=surface_media_type(path),
    )


class ErrorGuard:
    """ASGI middleware base: runs the app and hands an exception it raised before any
    answer began to :meth:`answer` (which answers, or returns False to let it pass on).
    Once half an answer is out, only closing the connection is honest: it is re-raised."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started or not await self.answer(exc, scope, receive, send):
                raise

    async def answer(self, exc: Exception, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer ``exc`` and say True, or say False to let it propagate. Each guard
        answers its own kind of error; this base answers none."""
        return False


class DatabaseOutage(ErrorGuard):
    """Outermost: a database outage raised by anything inside it becomes the 503 answer
    (when no answer has begun); other errors pass on."""

    async def answer(self, exc: Exception, scope: Scope, receive: Receive, send: Send) -> bool:
        if not is_database_unavailable(exc):
            return False
        await outage_answer(scope.get("path", ""), exc)(scope, receive, send)
        return True
