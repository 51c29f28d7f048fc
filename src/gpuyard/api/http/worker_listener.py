"""The serverless worker listener's gate: with the server on loopback only, ``gpuyard
serve`` also listens on every address at the worker port
(services/serverless/callback.py), so that workers' containers reach it through their
network's gateway. Requests that arrive on that port are let through only when they
are under ``/runpod/v2/`` and carry a worker's key (``RUNPOD_AI_API_KEY``, sent as
RunPod's workers send it: the bare key in ``Authorization``, or as a Bearer token);
everything else there answers 404, so the port opens nothing of the API to the network
but what a worker's key may already do. Requests on the main listener pass untouched.
"""

from __future__ import annotations

import json
from typing import Any

from gpuyard.core.ids import is_worker_key

_PREFIX = "/runpod/v2/"
_NOT_HERE = json.dumps(
    {"title": "Not Found", "status": 404, "detail": "only serverless workers are served here"}
).encode()


def _worker_request(scope: dict[str, Any]) -> bool:
    if not str(scope.get("path", "")).startswith(_PREFIX):
        return False
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            token = value.decode("latin-1").strip()
            if token.lower().startswith("bearer "):
                token = token[7:].strip()
            return is_worker_key(token)
    return False


class WorkerListenerGate:
    """Wraps the app: on local port ``worker_port``, only workers' requests pass."""

    def __init__(self, app: Any, worker_port: int) -> None:
        self.app = app
        self.worker_port = worker_port

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            server = scope.get("server") or (None, None)
            if server[1] == self.worker_port and not _worker_request(scope):
                await self._refuse(scope, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(scope: dict[str, Any], send: Any) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 404,
                "headers": [
                    (b"content-type", b"application/problem+json"),
                    (b"content-length", str(len(_NOT_HERE)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": _NOT_HERE})
