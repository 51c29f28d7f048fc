"""The worker listener's gate: on the worker port only requests under /runpod/v2/ with
a worker's key pass; the main listener is untouched."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuyard.api.http.worker_listener import WorkerListenerGate
from gpuyard.core.ids import new_worker_key


def call(gate: WorkerListenerGate, port: int, path: str, auth: str | None) -> int:
    headers = [(b"authorization", auth.encode())] if auth is not None else []
    scope = {"type": "http", "path": path, "headers": headers, "server": ("0.0.0.0", port)}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(gate(scope, receive, send))
    return int(sent[0]["status"])


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_only_workers_pass_on_the_worker_port() -> None:
    gate = WorkerListenerGate(app, 8001)
    key = new_worker_key()
    path = "/runpod/v2/abcdefghijklm1/job-take/wk1"
    assert call(gate, 8001, path, key) == 200  # RunPod's workers send the bare key
    assert call(gate, 8001, path, f"Bearer {key}") == 200
    assert call(gate, 8001, path, None) == 404
    assert call(gate, 8001, path, "Bearer gy_" + "x" * 40) == 404  # an API key
    assert call(gate, 8001, "/v1/clusters", key) == 404
    assert call(gate, 8001, "/graphql", key) == 404
    # The main listener is not the gate's business.
    assert call(gate, 8000, "/v1/clusters", None) == 200
