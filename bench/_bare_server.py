"""Baselines for bench_get_cluster.py: a minimal app with one ``async`` GET route that
returns a fixed JSON document (the body gpuyard returned for the same cluster),
rendered per request through ``JSONResponse`` like gpuyard's envelope. Same uvicorn
settings as the gpuyard launcher (one worker, log level warning).

- ``--kind starlette`` (the issue's baseline): a bare Starlette app, one ``Route``, no
  middleware, no dependency injection, no validation.
- ``--kind fastapi`` (for reference): a minimal FastAPI app, the same route through
  FastAPI's routing and parameter machinery.

    python bench/_bare_server.py --body FILE.json --port PORT [--kind starlette]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp


def make_fastapi_app(body: dict[str, Any]) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/clusters/{cluster_id}")
    async def get_cluster(cluster_id: str) -> JSONResponse:
        return JSONResponse(body)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"ok": True})

    return app


def make_starlette_app(body: dict[str, Any]) -> Starlette:
    async def get_cluster(request: Request) -> JSONResponse:
        return JSONResponse(body)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/v1/clusters/{cluster_id}", get_cluster, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )


def make_app(body: dict[str, Any], kind: str = "starlette") -> ASGIApp:
    """The baseline app of ``kind`` (``starlette`` or ``fastapi``) serving ``body``."""
    if kind == "fastapi":
        return make_fastapi_app(body)
    if kind == "starlette":
        return make_starlette_app(body)
    raise ValueError(f"unknown baseline kind {kind!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--body", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--kind", choices=["starlette", "fastapi"], default="starlette")
    args = ap.parse_args()
    with open(args.body) as f:
        body = json.load(f)
    uvicorn.run(
        make_app(body, args.kind), host="127.0.0.1", port=args.port, workers=1, log_level="warning"
    )


if __name__ == "__main__":
    main()
