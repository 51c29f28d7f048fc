"""``GET /metrics`` (Prometheus) and the API latency middleware.

The scrape shows fleet-wide counts and spend, so it is not public by default. Settings
(:class:`gpuyard.settings.Settings`): ``GPUYARD_METRICS_ENABLED`` (default true),
``GPUYARD_METRICS_TOKEN`` and ``GPUYARD_METRICS_PUBLIC`` (default false). A scrape is
answered when the endpoint is public, when it sends ``Authorization: Bearer <token>``
with the metrics token, or when it sends an API key (any accepted spelling) of admin
scope; otherwise 401 (no or unknown credentials) or 403 (a key of smaller scope), in
the REST v1 envelope.
"""

from __future__ import annotations

import hmac
import re
from time import perf_counter

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client.exposition import choose_encoder
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from gpuyard.api.http.envelope import error_body
from gpuyard.api.state import app_state, key_from_request
from gpuyard.core.errors import Forbidden, GpuyardError, Unauthorized
from gpuyard.observability.metrics import Metrics
from gpuyard.services.tenancy.auth import Scope
from gpuyard.settings import Settings

# Requests the fast path (api/fast/fastpath.py) answers before routing: they carry no route.
_FAST_PATH = re.compile(r"/v1/clusters/[^/]+")
_FAST_PATH_ROUTE = "/v1/clusters/{cluster_id}"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestLatency:
    """Pure ASGI middleware observing every HTTP request's duration by method, route
    template (``"other"`` for unknown paths) and status. Outside the fast path, so it
    times that too. A request costs a timer, a send wrapper and a lock-free
    ``observe`` (a couple of microseconds in all)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.histogram = metrics.http_duration
        self._series: dict[tuple[str, str, int], list[float]] = {}

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        start = perf_counter()
        try:
            await self.app(scope, receive, send_with_status)
        finally:
            elapsed = perf_counter() - start
            method = scope["method"]
            if method not in _METHODS:
                method = "OTHER"
            route = scope.get("route")
            template = getattr(route, "path", None) if route is not None else None
            if template is None:
                template = (
                    _FAST_PATH_ROUTE
                    if method == "GET" and _FAST_PATH.fullmatch(scope["path"])
                    else "other"
                )
            key = (method, template, status)
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = self.histogram.series((method, template, str(status)))
            self.histogram.observe(series, elapsed)


def _refusal(exc: GpuyardError) -> JSONResponse:
    message = (
        "a metrics token or an admin-scope API key is required (Authorization: Bearer)"
        if isinstance(exc, Unauthorized)
        else exc.message
    )
    headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
    return JSONResponse(
        error_body(exc.code, message, exc.details), status_code=exc.http_status, headers=headers
    )


def _bearer(request: Request) -> bytes | None:
    scheme, _, value = request.headers.get("authorization", "").strip().partition(" ")
    return value.strip().encode() if scheme.lower() == "bearer" and value.strip() else None


async def authorize_scrape(request: Request, token: bytes | None) -> GpuyardError | None:
    """None when the scrape may be answered: the metrics token, or an API key of admin
    scope. Otherwise the error to answer (Unauthorized or Forbidden)."""
    given = _bearer(request)
    if token is not None and given is not None and hmac.compare_digest(given, token):
        return None
    try:
        principal = await app_state(request).principal(key_from_request(request))
        principal.require(Scope.ADMIN)
    except (Unauthorized, Forbidden) as exc:
        return exc
    return None


def install(app: FastAPI, metrics: Metrics, settings: Settings) -> None:
    """Add the latency middleware (call after every other middleware, so it is the
    outermost one) and the ``/metrics`` route."""
    if not settings.metrics_enabled:
        return
    app.add_middleware(RequestLatency, metrics=metrics)
    secret = settings.metrics_token
    token = secret.get_secret_value().encode() if secret and secret.get_secret_value() else None
    public = settings.metrics_public

    async def scrape(request: Request) -> Response:
        if not public:
            refused = await authorize_scrape(request, token)
            if refused is not None:
                return _refusal(refused)
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        # Collecting reads the store (gauges at scrape time): never on the event loop.
        output = await run_in_threadpool(encoder, metrics.registry)
        return Response(output, headers={"Content-Type": content_type})

    app.add_api_route("/metrics", scrape, methods=["GET"], include_in_schema=False)
