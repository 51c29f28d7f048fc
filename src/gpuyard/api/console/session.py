"""The web console's sign-in: ``/v1/console/session`` and the middleware that turns
its cookie into the API key's ``Authorization``.

``POST /v1/console/session {"api_key": KEY}`` checks the key as every route does
(api/state.py), opens a server-side session (services/tenancy/console_sessions.py) and sets
the cookie :data:`COOKIE` (HttpOnly, SameSite=Strict, Path=/; Secure over https) to
its secret; the answer's ``csrf_token`` is what the page sends in ``X-CSRF-Token``.
``GET`` says who the session is; ``DELETE`` signs out (the row is revoked, so a copy
of the cookie is worth nothing afterwards).

:class:`ConsoleSessions`, for a request with no ``Authorization`` header and a live
session cookie, requires ``X-CSRF-Token`` to be the session's token — on every
method, not only unsafe ones: cookies are scoped by host, not port, so a cluster's
published port on the same host receives the cookie too, and the cookie alone must
not read anything — then adds ``Authorization: Bearer KEY`` and passes the request
on. A wrong token, or none on an unsafe method, is 403 in the v1 envelope; a GET with
no token (a page the browser opens itself: /docs, /openapi.json) goes on with no key.
WebSockets (the terminal) cannot carry headers from a browser: the token comes as a subprotocol
``gpuyard.csrf.TOKEN`` (taken out before the app sees the offer), and the ``Origin``
must be this host. A request with its own ``Authorization`` is left alone.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from http.cookies import CookieError, SimpleCookie
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuyard.api.http.envelope import error_body, ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.rest.schemas.cluster_json import iso
from gpuyard.api.state import app_state
from gpuyard.core.errors import Forbidden, Unauthorized
from gpuyard.core.sealed_key import same_token, secret_id
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.console_sessions import (
    IDLE_LIMIT,
    LiveSession,
    find_session,
    open_session,
    revoke_session,
)

PATH = "/v1/console/session"
COOKIE = "gpuyard_console"
CSRF_HEADER = "x-csrf-token"
# Methods a browser uses to open a page: without the token they go on unauthenticated
# instead of being refused.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
WS_CSRF_PREFIX = "gpuyard.csrf."
# Revocation by another replica is seen within this many seconds (as keys: state.py).
CACHE_TTL_S = 5.0
# Paths the middleware never looks at: the console's own page and assets.
_STATIC = ("/console/",)

# The sign-in body is parsed off the event loop like every JSON body (api/http/json_body.py).
router = APIRouter(tags=["console"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)


class SignIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    api_key: str = Field(min_length=1, max_length=200, description="an API key of yours")


@dataclass
class SessionCache:
    """Sessions by secret hash, each answer fresh for ``ttl_s`` (monotonic time), so a
    page's polling does not read the session table on every request. Misses are kept
    too: a cookie that names no live session (ended, signed out, or junk sent over and
    over) costs one read per ``ttl_s``, not one per request."""

    ctx: Context
    idle: timedelta = IDLE_LIMIT
    ttl_s: float = CACHE_TTL_S
    max_entries: int = 10_000
    _entries: dict[str, tuple[float, LiveSession]] = field(default_factory=dict)
    # Misses apart: a flood of distinct junk cookies fills (and clears) only this.
    _misses: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def find(self, secret: str) -> LiveSession | None:
        """The live session of ``secret``, or None (also once it idled out or ended)."""
        sid = secret_id(secret)
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(sid)
            missed = self._misses.get(sid, 0.0) > now
        if missed:
            return None
        if hit is not None and hit[0] > now and hit[1].ends_at(self.idle) > self.ctx.clock.now():
            return hit[1]
        found = await run_in_threadpool(find_session, self.ctx, secret, self.idle)
        with self._lock:
            if found is None:
                if len(self._misses) >= self.max_entries:
                    self._misses.clear()
                self._entries.pop(sid, None)
                self._misses[sid] = time.monotonic() + self.ttl_s
            else:
                if len(self._entries) >= self.max_entries:
                    self._entries.clear()
                self._entries[sid] = (time.monotonic() + self.ttl_s, found)
        return found

    def forget(self, secret: str | None = None) -> None:
        """Drop ``secret``'s entry (sign-out), or every entry."""
        with self._lock:
            if secret is None:
                self._entries.clear()
                self._misses.clear()
            else:
                self._entries.pop(secret_id(secret), None)
                self._misses.pop(secret_id(secret), None)


def sessions_of(request: Request) -> SessionCache:
    cache: SessionCache = request.app.state.console_sessions
    return cache


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def cookie_secret(raw_cookie: str | None) -> str | None:
    """The session secret in a ``Cookie`` header; None when absent or unparseable."""
    if not raw_cookie:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw_cookie)
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None and morsel.value else None


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether a request's ``Origin`` names the host (and port) it was sent to."""
    if not origin or not host:
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


def _session_view(principal: Principal, key: str, csrf: str, ends: str) -> dict[str, object]:
    return {
        "csrf_token": csrf,
        "expires_at": ends,
        "idle_timeout_s": int(IDLE_LIMIT.total_seconds()),
        "key": {
            "id": principal.key_id,
            "name": principal.key_name,
            "prefix": key[:10],
            "scope": principal.scope.value,
            # A key restricted to a project acts only inside it (docs/roles.md): the
            # page offers nothing of the whole account then.
            "restricted_to_project": principal.key_project_id,
        },
    }


@router.post(PATH, status_code=201)
async def sign_in(body: SignIn, request: Request) -> JSONResponse:
    """Sign the browser in with an API key: sets the HttpOnly session cookie and
    answers the CSRF token (401 for a wrong or revoked key). Replaces a session the
    browser already had."""
    origin = request.headers.get("origin")
    if origin is not None and not same_origin(origin, request.headers.get("host")):
        raise Forbidden("sign-in from another site is refused", {"field": "Origin"})
    state = app_state(request)
    principal = await state.principal(body.api_key)
    cache = sessions_of(request)
    old = cookie_secret(request.headers.get("cookie"))
    if old is not None:
        cache.forget(old)
        await run_in_threadpool(revoke_session, state.ctx, old)
    opened = await run_in_threadpool(
        lambda: open_session(
            state.ctx,
            api_key_id=principal.key_id,
            key=body.api_key,
            user_agent=request.headers.get("user-agent", ""),
        )
    )
    answer = ok(
        _session_view(principal, body.api_key, opened.csrf_token, iso(opened.expires_at) or ""),
        status_code=201,
    )
    answer.set_cookie(
        COOKIE,
        opened.secret,
        max_age=int((opened.expires_at - state.ctx.clock.now()).total_seconds()),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return answer


@router.get(PATH)
async def whoami(request: Request) -> JSONResponse:
    """The signed-in session (cookie and ``X-CSRF-Token``): its key and when it ends
    if unused. 401 when signed out."""
    live: LiveSession | None = request.scope.get("gpuyard.console_session")
    if live is None:
        raise Unauthorized("not signed in to the console")
    principal = await app_state(request).principal(live.key)
    ends = iso(live.ends_at(sessions_of(request).idle)) or ""
    return ok(_session_view(principal, live.key, live.csrf_token, ends))


@router.delete(PATH)
async def sign_out(request: Request) -> JSONResponse:
    """Sign out: the session is revoked and the cookie cleared. Answers 200 also when
    the session had already ended (the cookie is cleared either way)."""
    secret = cookie_secret(request.headers.get("cookie"))
    revoked = False
    if secret is not None:
        sessions_of(request).forget(secret)
        revoked = await run_in_threadpool(revoke_session, app_state(request).ctx, secret)
    answer = ok({"signed_out": True, "revoked": revoked})
    answer.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return answer


class ConsoleSessions:
    """ASGI middleware: a console session's cookie becomes its key's ``Authorization``
    (see the module docstring for the rules)."""

    def __init__(self, app: ASGIApp, cache: SessionCache) -> None:
        self.app, self.cache = app, cache

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or _header(scope, b"authorization") is not None:
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        secret = cookie_secret(_header(scope, b"cookie"))
        if secret is None or path.startswith(_STATIC) or path == "/":
            await self.app(scope, receive, send)
            return
        live = await self.cache.find(secret)
        if live is None or (path == PATH and scope.get("method") == "POST"):
            # Signed out or ended: the request goes on with no key (the route answers
            # 401). A sign-in needs no session and replaces it.
            await self.app(scope, receive, send)
            return
        headers = list(scope["headers"])
        if kind == "websocket":
            offered = _header(scope, b"sec-websocket-protocol") or ""
            protocols = [p.strip() for p in offered.split(",") if p.strip()]
            tokens = [p[len(WS_CSRF_PREFIX) :] for p in protocols if p.startswith(WS_CSRF_PREFIX)]
            kept = [p for p in protocols if not p.startswith(WS_CSRF_PREFIX)]
            token = tokens[0] if tokens else None
            good = same_origin(_header(scope, b"origin"), _header(scope, b"host"))
            if not good or not same_token(token, live.csrf_token):
                # Closing before accepting: the server answers the handshake with 403.
                await send({"type": "websocket.close", "code": 1008})
                return
            headers = [(k, v) for k, v in headers if k != b"sec-websocket-protocol"]
            if kept:
                headers.append((b"sec-websocket-protocol", ", ".join(kept).encode()))
        else:
            token = _header(scope, CSRF_HEADER.encode())
            if token is None and scope.get("method") in _SAFE_METHODS:
                # A page the browser opens itself (/docs, /openapi.json, /healthz): it
                # goes on with no key, so an API read answers 401 as for anyone.
                await self.app(scope, receive, send)
                return
            if not same_token(token, live.csrf_token):
                await _refuse(send)
                return
        headers.append((b"authorization", f"Bearer {live.key}".encode()))
        inner = {**scope, "headers": headers, "gpuyard.console_session": live}
        await self.app(inner, receive, send)


async def _refuse(send: Send) -> None:
    body = JSONResponse(
        error_body(
            "FORBIDDEN",
            "console requests must carry the session's X-CSRF-Token header",
            {"field": "X-CSRF-Token"},
        ),
        status_code=403,
    )
    await send({"type": "http.response.start", "status": 403, "headers": body.raw_headers})
    await send({"type": "http.response.body", "body": body.body})
