"""Baseline for bench_get_cluster.py: a minimal FastAPI app with one async GET route
that returns a fixed JSON document (the body gpuyard returned for the same cluster),
rendered per request through JSONResponse like gpuyard's envelope. Same uvicorn
settings as the gpuyard launcher (one worker, log level warning).

    python bench/_bare_server.py --body FILE.json --port PORT
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse


def make_app(body: dict[str, Any]) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/clusters/{cluster_id}")
    async def get_cluster(cluster_id: str) -> JSONResponse:
        return JSONResponse(body)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"ok": True})

    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--body", required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    with open(args.body) as f:
        body = json.load(f)
    uvicorn.run(make_app(body), host="127.0.0.1", port=args.port, workers=1, log_level="warning")


if __name__ == "__main__":
    main()
