"""The API's side of the HTTP proxy: open links for private ports, and the per-request
key check the proxy asks (Caddy's forward_auth). The proxy itself is Caddy; nothing
here carries user traffic.

``GET /v1/clusters/{id}/ports/{port}/open`` has two faces:

- with an API key (write scope) and no ``token``: answers a one-time ``url`` on the
  port's proxy host, for a browser;
- with ``?token=``, as the browser follows that link through the proxy: swaps the
  token for an HttpOnly cookie on that host and redirects to ``/``. A used, expired
  or wrong token answers a 403 page; nothing about the token is logged.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict

from gpuyard.api.http.envelope import ErrorEnvelope, ok
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.rest.schemas.cluster_json import iso
from gpuyard.api.rest.schemas.responses import Meta, documented
from gpuyard.api.state import AppState, app_state, current_principal
from gpuyard.core.errors import Forbidden, NotFound, Unauthorized
from gpuyard.core.network.proxy import (
    SESSION_COOKIE,
    Visibility,
    page_html,
    parse_host,
    presented_key,
    session_cookies,
)
from gpuyard.edge.caddy_config import AUTHORIZE_PATH, KEY_HEADER, UNAVAILABLE_PATH
from gpuyard.services.access import proxy_access
from gpuyard.services.access.proxy_routes import proxy_base
from gpuyard.services.tenancy.auth import AccountSelection, Principal

router = APIRouter(tags=["access"], responses=ERROR_RESPONSES)


class OpenLinkOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    expires_at: str | None
    session_expires_at: str | None


class OpenLinkEnvelope(BaseModel):
    model_config = ConfigDict(extra="forbid")

    success: Literal[True]
    data: OpenLinkOut
    meta: Meta


def _page(status: int, title: str, text: str) -> HTMLResponse:
    body = page_html(title, text)
    return HTMLResponse(
        body,
        status_code=status,
        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"},
    )


_OPEN_RESPONSES: dict[int | str, dict[str, Any]] = {
    **documented(OpenLinkEnvelope),
    302: {"description": "with `token`: the cookie is set, on to `/` of the port"},
    403: {
        **ERROR_RESPONSES[403],
        "content": {"text/html": {"schema": {"type": "string"}}},
        "description": "FORBIDDEN (read key); with `token`: a page saying the link is "
        "used, expired or another port's",
    },
    503: {"model": ErrorEnvelope, "description": "PROXY_UNAVAILABLE: the proxy does not serve"},
}


@router.get("/v1/clusters/{cluster_id}/ports/{port}/open", responses=_OPEN_RESPONSES)
async def open_port(
    request: Request,
    cluster_id: str = Path(min_length=1, max_length=100),
    port: int = Path(ge=1, le=65535),
    token: str | None = Query(default=None, min_length=1, max_length=200),
) -> Response:
    """A one-time link that opens a private http port in a browser (API key, write
    scope), or, followed with its ``token`` through the proxy, the cookie it grants."""
    state = app_state(request)
    if token is not None:
        # Through the proxy, a link opens only the port whose host it is on (every
        # proxy host routes this path here): the cookie is set on that host alone.
        host = request.headers.get("x-forwarded-host") or request.headers.get("host") or ""
        target = parse_host(host, state.ctx.settings.proxy_domain)
        grant = (
            None
            if target is not None and target != (cluster_id, port)
            else await run_in_threadpool(
                proxy_access.redeem_link, state.ctx, cluster_id, port, token
            )
        )
        if grant is None:
            return _page(
                403,
                "This link does not open anything",
                "It was used already, has expired, or belongs to another port. Ask for a "
                "new one (gpuyard clusters open, or the console).",
            )
        base = proxy_base(state.ctx.settings)
        response = RedirectResponse(
            "/", status_code=302, headers={"Referrer-Policy": "no-referrer"}
        )
        max_age = int((grant.expires_at - state.ctx.clock.now()).total_seconds())
        response.set_cookie(
            SESSION_COOKIE,
            grant.secret,
            max_age=max(max_age, 0),
            path="/",
            httponly=True,
            samesite="lax",
            secure=base.scheme == "https",
        )
        return response
    principal: Principal = await current_principal(request)
    link = await run_in_threadpool(
        proxy_access.issue_link,
        state.ctx,
        principal,
        proxy_base(state.ctx.settings),
        cluster_id,
        port,
        state.ctx.proxy.problem(),
    )
    return ok(
        {
            "url": link.url,
            "expires_at": iso(link.expires_at),
            "session_expires_at": iso(link.session_expires_at),
        }
    )


class RevokedOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    revoked: int


class RevokedEnvelope(BaseModel):
    model_config = ConfigDict(extra="forbid")

    success: Literal[True]
    data: RevokedOut
    meta: Meta


@router.delete(
    "/v1/clusters/{cluster_id}/ports/{port}/sessions", responses=documented(RevokedEnvelope)
)
async def revoke_port_sessions(
    request: Request,
    cluster_id: str = Path(min_length=1, max_length=100),
    port: int = Path(ge=1, le=65535),
) -> Response:
    """End every proxy session (open-link cookie) of a private port, and its unused
    links (API key, write scope): the proxy refuses their cookies within seconds.
    ``revoked``: how many were live."""
    state = app_state(request)
    principal: Principal = await current_principal(request)
    count = await run_in_threadpool(
        proxy_access.revoke_sessions, state.ctx, principal, cluster_id, port
    )
    return ok({"revoked": count})


_NOT_YOURS = ("No such cluster port", "No cluster port of yours is at this address.")


@router.get(AUTHORIZE_PATH, include_in_schema=False)
async def authorize(request: Request) -> Response:
    """The proxy's check of a request to a private port that carries a credential
    (forward_auth): 200 lets it through; the 401/403/404 pages are what the browser then shows.

    A public port (made so since the proxy looked) lets every request through.
    Else a session cookie (named exactly ``gy_proxy``) passes while its session is live
    (services/access/proxy_access.py session_allows; answers kept a few seconds).
    Else an API key: it acts for the cluster's account (its user must be a member of
    it) and needs WRITE_RESOURCES there (a private port is often a notebook, which runs
    code: as much as the terminal); a cluster of a project the key may not use is 404.
    A wrong key answers 401, which the rate limiter counts as a failed key of the
    client's address (api/http/rate_limit.py reads the same key as
    :func:`presented_key`). The proxy sends a WebSocket handshake's check as a plain
    GET, so the key passes a WebSocket exactly as it passes any other request."""
    state = app_state(request)
    host = request.headers.get("x-forwarded-host") or request.headers.get("host") or ""
    refusal = await _check(request, state, host)
    if refusal is None:
        return _passed()
    # A port made public since the proxy looked passes whatever the request carries
    # (asked only on refusal: a private port's pass costs no extra read). Every other
    # refusal stands as it is: a wrong key's 401 is what the rate limiter counts.
    visibility = await run_in_threadpool(proxy_access.port_visibility, state.ctx, host)
    if visibility is Visibility.PUBLIC:
        return _passed()
    return refusal


def _passed() -> Response:
    return Response(status_code=200, headers={"Cache-Control": "no-store"})


async def _check(request: Request, state: AppState, host: str) -> Response | None:
    """None when the request's cookie or key opens the private port ``host`` names;
    else the page refusing it."""
    cookies = session_cookies(request.headers.getlist("cookie"))
    if cookies:
        checks = state.proxy_sessions
        allowed = checks.cached(host, cookies)
        if allowed is None:  # only a miss reads the store, on a worker thread
            allowed = await run_in_threadpool(proxy_access.session_allows, state.ctx, host, cookies)
            checks.store(host, cookies, allowed)
        if allowed:
            return None
    key = presented_key(request.headers.get(KEY_HEADER), request.headers.get("authorization"))
    if key is None:
        return _page(
            401,
            "Sign-in required",
            "Your session for this port has ended (it expired, was revoked, or its API "
            "key or membership is gone). Open the port again with a new link.",
        )
    target = parse_host(host, state.ctx.settings.proxy_domain)
    owner = (
        None
        if target is None
        else await run_in_threadpool(proxy_access.cluster_owner, state.ctx, target[0])
    )
    # The key acts for the cluster's account: a member of it through another home
    # account passes; a key that may not act for it (no membership, restricted to
    # another account) hears what a stranger hears.
    selection = None if owner is None else AccountSelection(account_id=owner[0])
    try:
        principal = await state.principal(key, selection)
    except Unauthorized:
        return _page(401, "Sign-in required", "The API key was not accepted.")
    except Forbidden:
        return _page(404, *_NOT_YOURS)
    if owner is not None and not principal.may_use_project(owner[1]):
        return _page(404, *_NOT_YOURS)
    try:
        await run_in_threadpool(proxy_access.authorize, state.ctx, principal, host)
    except NotFound:
        return _page(404, *_NOT_YOURS)
    except Forbidden:
        return _page(
            403,
            "Not allowed",
            "A private port needs a key with write scope, of a member whose role may "
            "change clusters (not viewer or billing).",
        )
    return None


@router.get(UNAVAILABLE_PATH, include_in_schema=False)
async def unavailable(request: Request) -> Response:
    """The page the proxy shows when a container does not answer: 404 when the address
    names no live cluster port, else 502 naming the cluster's status
    (services/access/proxy_access.py unavailable_page)."""
    state = app_state(request)
    host = request.headers.get("x-forwarded-host") or request.headers.get("host") or ""
    verdict = await run_in_threadpool(proxy_access.unavailable_page, state.ctx, host)
    return _page(verdict.status, verdict.title, verdict.text)
