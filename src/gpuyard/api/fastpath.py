"""A framework-free answer for ``GET /v1/clusters/{id}``, the request clients poll.

Pure ASGI middleware: a request for exactly that path is answered here with the
same authentication, body and error envelope as the routed endpoint (which stays
in place, documented in OpenAPI, and serves anything this does not take). The
routing and parameter machinery cost more than the work itself on this path.

The read and the rendering run on the app's read lane (api/read_lane.py), never on the
event loop: a slow query holds up only its own request. A key found in the key cache
is checked on the loop; a miss is read in a worker thread (api/state.py).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, unquote

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuyard.api import views
from gpuyard.api.envelope import error_body
from gpuyard.api.state import ACCOUNT_HEADER, AppState, key_from, selection_from
from gpuyard.core.errors import ClusterNotFound, GpuyardError
from gpuyard.core.ids import new_request_id
from gpuyard.core.roles import Permission
from gpuyard.services import cluster_views
from gpuyard.services.auth import Principal
from gpuyard.services.context import Context

log = logging.getLogger(__name__)
_PATH = re.compile(r"/v1/clusters/([^/]+)")


def _dumps(body: Any) -> bytes:
    # The same encoding Starlette's JSONResponse uses.
    return json.dumps(
        body, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode()


def _read(ctx: Context, principal: Principal, cluster_id: str) -> bytes:
    # Rendering runs here too: one hand-off to the lane per request costs less than
    # handing the details back to the loop to render (bench/bench_get_cluster.py).
    details = cluster_views.load_visible(ctx, principal.account_id, cluster_id)
    if not principal.may_use_project(details.cluster.project_id):
        raise ClusterNotFound(f"cluster {cluster_id!r} not found", {"cluster_id": cluster_id})
    body = {
        "success": True,
        "data": views.cluster_v1(details),
        "meta": {"request_id": new_request_id()},
    }
    return _dumps(body)


async def answer(
    state: AppState,
    authorization: str | None,
    query: Callable[[str], str | None],
    cluster_id: str,
    selecting: HTTPConnection | None = None,
) -> tuple[int, bytes]:
    """Status and JSON body of ``GET /v1/clusters/{id}``, errors in the v1 envelope.
    ``selecting``: the routed request, whose ``X-Gpuyard-Account`` / ``active_iam``
    select the account acted for (the middleware takes only requests without them)."""
    try:
        selection = None if selecting is None else selection_from(selecting)
        principal = await state.principal(key_from(authorization, query), selection)
        principal.require_permission(Permission.READ_RESOURCES)
        return 200, await state.reads.run(_read, state.ctx, principal, cluster_id)
    except GpuyardError as exc:
        return exc.http_status, _dumps(error_body(exc.code, exc.message, exc.details))
    except Exception:
        log.exception("unhandled error reading cluster %s", cluster_id)
        return 500, _dumps(error_body("INTERNAL_ERROR", "internal error; see the server log"))


def _selects_account(scope: Scope) -> bool:
    header = ACCOUNT_HEADER.encode()
    return any(name == header for name, _ in scope["headers"])


class ClusterReadFastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = (
            _PATH.fullmatch(scope["path"])
            if scope["type"] == "http" and scope["method"] == "GET"
            else None
        )
        query = scope.get("query_string", b"") if match is not None else b""
        params = parse_qs(query.decode("latin-1")) if query else {}
        # A request that selects an account takes the full route (api/state.py).
        if match is None or "active_iam" in params or _selects_account(scope):
            await self.app(scope, receive, send)
            return
        authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        status, body = await answer(
            scope["app"].state.gpuyard,
            authorization,
            lambda name: (params.get(name) or [None])[0],
            unquote(match.group(1)),
        )
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
