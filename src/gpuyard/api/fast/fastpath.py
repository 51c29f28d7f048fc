"""A framework-free answer for ``GET /v1/clusters/{id}``, the request clients poll.

Pure ASGI middleware: a request for exactly that path is answered here with the
same authentication, body and error envelope as the routed endpoint (which stays
in place, documented in OpenAPI, and serves anything this does not take). The
routing and parameter machinery cost more than the work itself on this path.

The read and the rendering run on the app's read lane (api/fast/read_lane.py), never on the
event loop: a slow query holds up only its own request. A key found in the key cache
is checked on the loop; a miss is read in a worker thread (api/state.py). The rendered
``data`` is kept for a moment (api/fast/view_cache.py): a poll of the same cluster then
reads nothing and is answered on the loop, its envelope (a request id of its own)
built around the kept bytes.

``GET /runpod/v2/pods/{id}`` (RunPod v2's poll of one pod) is answered the same way,
its body RunPod's ``Pod`` and its errors RFC 9457 problems (a ``Surface``).

``GET /v1/clusters`` is answered here only from a page the routed endpoint rendered
and kept for the same query and caller scope (``list_subject``); anything else (a
miss, a bad key, a refused permission) goes to the route.

Both answer an ``ETag``, the digest of their ``data`` (``etag_of``), and ``304`` with
no body to an ``If-None-Match`` naming it; an error carries none.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import weakref
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuyard.api.fast.view_cache import Rendered, ViewCache
from gpuyard.api.http.envelope import error_body
from gpuyard.api.rest.schemas import cluster_json as views
from gpuyard.api.state import (
    ACCOUNT_HEADER,
    KEY_QUERY_PARAMS,
    AppState,
    key_from,
    selection_from,
)
from gpuyard.core.errors import ClusterNotFound, GpuyardError
from gpuyard.core.ids import new_request_id
from gpuyard.core.roles import Permission
from gpuyard.services.clusters import views as cluster_views
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.outage import is_database_unavailable

log = logging.getLogger(__name__)
_PATH = re.compile(r"/v1/clusters/([^/]+)")


def dumps(body: Any) -> bytes:
    # The same encoding Starlette's JSONResponse uses.
    return json.dumps(
        body, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode()


def _marks(ctx: Context, cluster_id: str) -> tuple[object, ...]:
    """What the view reads from memory rather than the store (api/fast/view_cache.py)."""
    return (ctx.idle_since.get(cluster_id), ctx.proxy.problem())


@dataclass(frozen=True)
class Surface:
    """How one API answers a cluster read: the view cache's subject prefix, the
    ``data`` of a cluster, the whole body around it, and an error's body and type."""

    prefix: str
    render: Callable[[cluster_views.ClusterDetails, datetime], Any]
    wrap: Callable[[bytes], bytes]
    error: Callable[[GpuyardError], bytes]
    error_type: bytes


def _v1_error(exc: GpuyardError) -> bytes:
    return dumps(error_body(exc.code, exc.message, exc.details))


def ok_bytes(data: bytes) -> bytes:
    # The bytes _dumps gives for {"success": True, "data": ..., "meta": {...}}; a
    # request id is letters and digits, nothing to escape.
    return b'{"success":true,"data":%s,"meta":{"request_id":"%s"}}' % (
        data,
        new_request_id().encode(),
    )


# REST v1's ``{success, data, meta}`` envelope.
V1 = Surface("", lambda d, _now: views.cluster_v1(d), ok_bytes, _v1_error, b"application/json")


def _render(
    ctx: Context, cache: ViewCache, account_id: int, cluster_id: str, surface: Surface = V1
) -> Rendered:
    # Rendering runs here too: one hand-off to the lane per request costs less than
    # handing the details back to the loop to render (bench/bench_get_cluster.py).
    stamp, marks = cache.stamp(), _marks(ctx, cluster_id)
    details = cluster_views.load_visible(ctx, account_id, cluster_id)
    data = dumps(surface.render(details, ctx.clock.now()))
    rendered = Rendered(details.cluster.project_id, data)
    cache.put(surface.prefix + cluster_id, account_id, marks, rendered, stamp)
    return rendered


# Reads in flight on each event loop, by what they render: when a kept answer ages out
# under load, every poll waiting at that moment shares one read instead of queueing
# one each.
_IN_FLIGHT: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[Hashable, asyncio.Future[Rendered]]
] = weakref.WeakKeyDictionary()


async def shared(key: Hashable, read: Callable[[], Awaitable[Rendered]]) -> Rendered:
    """The rendered answer of ``read()``, shared with every request for the same
    ``key`` that arrives while it runs. A request that goes away does not cancel the
    read the others wait for."""
    flights = _IN_FLIGHT.setdefault(asyncio.get_running_loop(), {})
    flight = flights.get(key)
    if flight is None:
        flight = asyncio.ensure_future(read())
        flights[key] = flight

        def landed(done: asyncio.Future[Rendered]) -> None:
            flights.pop(key, None)
            if not done.cancelled():
                done.exception()  # retrieved, even when every waiter has gone

        flight.add_done_callback(landed)
    return await asyncio.shield(flight)


async def _shared_read(
    state: AppState, account_id: int, cluster_id: str, surface: Surface = V1
) -> Rendered:
    """One cluster's rendered answer, read on the lane and shared (``shared``)."""
    return await shared(
        (surface.prefix + cluster_id, account_id),
        lambda: state.reads.run(_render, state.ctx, state.views, account_id, cluster_id, surface),
    )


async def answer(
    state: AppState,
    authorization: str | None,
    query: Callable[[str], str | None],
    cluster_id: str,
    selecting: HTTPConnection | None = None,
    if_none_match: str | None = None,
    surface: Surface = V1,
) -> tuple[int, bytes, str | None]:
    """Status, JSON body and ``ETag`` of ``GET /v1/clusters/{id}``, errors in the v1
    envelope (and without an ETag: an error is never 304). The ETag is the digest of
    the cluster's ``data`` (``etag_of``); when ``if_none_match`` names it the answer is
    304 with an empty body. ``selecting``: the routed request, whose
    ``X-Gpuyard-Account`` / ``active_iam`` select the account acted for (the middleware
    takes only requests without them)."""
    try:
        selection = None if selecting is None else selection_from(selecting)
        principal = await state.principal(key_from(authorization, query), selection)
        principal.require_permission(Permission.READ_RESOURCES)
        ctx, cache = state.ctx, state.views
        subject = surface.prefix + cluster_id
        rendered = cache.get(subject, principal.account_id, _marks(ctx, cluster_id))
        if rendered is None:
            rendered = await _shared_read(state, principal.account_id, cluster_id, surface)
        if not principal.may_use_project(rendered.project_id):
            raise ClusterNotFound(f"cluster {cluster_id!r} not found", {"cluster_id": cluster_id})
        etag = etag_of(rendered.data)
        if not_modified(if_none_match, etag):
            return 304, b"", etag
        return 200, surface.wrap(rendered.data), etag
    except GpuyardError as exc:
        return exc.http_status, surface.error(exc), None
    except Exception as exc:
        if is_database_unavailable(exc):
            raise  # 503 with Retry-After (api/http/database_outage.py)
        log.exception("unhandled error reading cluster %s", cluster_id)
        return 500, surface.error(GpuyardError("internal error; see the server log")), None


# -- GET /v1/clusters: a page kept in the view cache -------------------------------


def list_subject(principal: Principal, query: list[tuple[str, str]], prefix: str = "") -> str:
    """The view cache's name for a page of the cluster list: the request's query as
    sent (minus a key given as a parameter) and the caller's project scope; the account
    is the cache key's other half. The route keeps a page under this name only after
    validating that query, so the middleware may answer a kept one."""
    # Sorted by name only: a repeated parameter keeps its order (the route reads the
    # last one), so ``?a=1&a=2`` and ``?a=2&a=1`` are different pages.
    shown = sorted(
        ((name, value) for name, value in query if name not in KEY_QUERY_PARAMS),
        key=lambda pair: pair[0],
    )
    scope = "all" if principal.project_ids is None else sorted(principal.project_ids)
    return f"{prefix}list?{urlencode(shown)}&scope={scope}"


def list_marks(ctx: Context) -> tuple[object, ...]:
    """What a page's views read from memory rather than the store (``_marks`` for each
    of its clusters)."""
    return (ctx.proxy.problem(), ctx.idle_since.version)


def etag_of(data: bytes) -> str:
    """A page's entity tag: a digest of its ``data`` (the envelope's request id aside,
    which differs per answer), so a poller whose page has not changed gets a 304."""
    return '"' + hashlib.blake2b(data, digest_size=12).hexdigest() + '"'


def not_modified(if_none_match: str | None, etag: str) -> bool:
    """Whether ``If-None-Match`` names ``etag`` (weak or strong) or is ``*``."""
    if not if_none_match:
        return False
    tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return etag in tags or "*" in tags


async def _kept_list(
    state: AppState, authorization: str | None, raw_query: str, surface: Surface
) -> Rendered | None:
    """The answer to a list request from a kept page, else None: the route answers
    (a miss, or any error: bad key, no permission)."""
    query = parse_qsl(raw_query, keep_blank_values=True)
    try:
        principal = await state.principal(
            key_from(authorization, lambda name: dict(query).get(name)), None
        )
    except GpuyardError:
        return None
    if not principal.allows(Permission.READ_RESOURCES):
        return None
    subject = list_subject(principal, query, surface.prefix)
    return state.views.get(subject, principal.account_id, list_marks(state.ctx))


def _selects_account(scope: Scope) -> bool:
    header = ACCOUNT_HEADER.encode()
    return any(name == header for name, _ in scope["headers"])


class ClusterReadFastPath:
    """``more``: other surfaces' reads of one cluster, by the pattern of their path
    (its one group the cluster id) and the path of their list (whose route keeps its
    pages under ``list_subject`` with the surface's prefix)."""

    def __init__(
        self, app: ASGIApp, more: tuple[tuple[re.Pattern[str], str, Surface], ...] = ()
    ) -> None:
        self.app = app
        self.reads = ((_PATH, V1), *((pattern, surface) for pattern, _, surface in more))
        self.lists = {"/v1/clusters": V1, **{path: surface for _, path, surface in more}}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        get = scope["type"] == "http" and scope["method"] == "GET"
        match, surface = None, V1
        for pattern, read in self.reads if get else ():
            match = pattern.fullmatch(scope["path"])
            if match is not None:
                surface = read
                break
        listing = get and match is None and scope["path"] in self.lists
        if listing:
            surface = self.lists[scope["path"]]
        query = scope.get("query_string", b"") if match is not None or listing else b""
        params = parse_qs(query.decode("latin-1")) if query else {}
        # A request that selects an account takes the full route (api/state.py).
        if (match is None and not listing) or "active_iam" in params or _selects_account(scope):
            await self.app(scope, receive, send)
            return
        authorization = if_none_match = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"if-none-match":
                if_none_match = value.decode("latin-1")
        if listing:
            kept = await _kept_list(
                scope["app"].state.gpuyard, authorization, query.decode(), surface
            )
            if kept is None:
                await self.app(scope, receive, send)
                return
            etag = etag_of(kept.data)
            if not_modified(if_none_match, etag):
                await _send(send, 304, b"", etag)
            else:
                await _send(send, 200, surface.wrap(kept.data), etag)
            return
        assert match is not None
        status, body, tag = await answer(
            scope["app"].state.gpuyard,
            authorization,
            lambda name: (params.get(name) or [None])[0],
            unquote(match.group(1)),
            if_none_match=if_none_match,
            surface=surface,
        )
        await _send(send, status, body, tag, surface.error_type if status >= 400 else None)


async def _send(
    send: Send, status: int, body: bytes, etag: str | None = None, media: bytes | None = None
) -> None:
    headers = [
        (b"content-type", media or b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if etag is not None:
        headers.append((b"etag", etag.encode()))
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
