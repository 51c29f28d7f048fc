"""``GET /metrics`` (Prometheus) and the API latency middleware.

Settings come from ``GPUYARD_METRICS_*`` variables (:class:`MetricsSettings`):
``GPUYARD_METRICS_ENABLED`` (default true) and ``GPUYARD_METRICS_TOKEN``, which when set
requires ``Authorization: Bearer <token>`` on scrapes.
"""

from __future__ import annotations

import hmac
import re
from time import perf_counter

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client.exposition import choose_encoder
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuyard.api.envelope import error_body
from gpuyard.observability.metrics import Metrics

# Requests the fast path (api/fastpath.py) answers before routing: they carry no route.
_FAST_PATH = re.compile(r"/v1/clusters/[^/]+")
_FAST_PATH_ROUTE = "/v1/clusters/{cluster_id}"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class MetricsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUYARD_METRICS_", extra="ignore")

    enabled: bool = True
    # When set, scrapes must send ``Authorization: Bearer <token>``.
    token: SecretStr | None = None


class RequestLatency:
    """Pure ASGI middleware observing every HTTP request's duration by method, route
    template (``"other"`` for unknown paths) and status. Outside the fast path, so it
    times that too. A request costs a timer, a send wrapper and a lock-free
    ``observe`` (a couple of microseconds in all)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.histogram = metrics.http_duration
        self._series: dict[tuple[str, str, int], list[float]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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


def _unauthorized() -> JSONResponse:
    return JSONResponse(
        error_body("UNAUTHORIZED", "a valid metrics token is required (Authorization: Bearer)"),
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


def install(app: FastAPI, metrics: Metrics, settings: MetricsSettings | None = None) -> None:
    """Add the latency middleware (call after every other middleware, so it is the
    outermost one) and the ``/metrics`` route."""
    settings = settings or MetricsSettings()
    if not settings.enabled:
        return
    app.add_middleware(RequestLatency, metrics=metrics)
    token = settings.token.get_secret_value().encode() if settings.token else None

    def scrape(request: Request) -> Response:
        if token is not None:
            given = request.headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token):
                return _unauthorized()
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(metrics.registry), headers={"Content-Type": content_type})

    app.add_api_route("/metrics", scrape, methods=["GET"], include_in_schema=False)
