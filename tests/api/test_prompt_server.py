"""The server's uvicorn (api/http/prompt_server.py): an exit request ends it without
cutting what is in flight, and the application's shutdown still runs.

A small ASGI app under a real PromptServer on a real port; events, not clocks, say
when the request is in flight and when the app's shutdown ran.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import httpx
import uvicorn

from gpuyard.api.http.prompt_server import PromptServer
from gpuyard.core.tls_trust import trusted_tls
from tests.helpers import free_port

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class SlowApp:
    """Answers ``/slow`` once ``release`` is set; records its lifespan's shutdown."""

    def __init__(self) -> None:
        self.in_flight = threading.Event()
        self.release = threading.Event()
        self.shut_down = threading.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    self.shut_down.set()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        self.in_flight.set()
        await anyio.to_thread.run_sync(self.release.wait, 30)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})


def serve(app: SlowApp) -> tuple[PromptServer, threading.Thread, str]:
    port = free_port()
    server = PromptServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the server did not start"
        threading.Event().wait(0.005)
    return server, thread, f"http://127.0.0.1:{port}"


def test_an_exit_request_ends_the_server_and_runs_the_apps_shutdown() -> None:
    app = SlowApp()
    server, thread, _ = serve(app)
    server.request_exit()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert app.shut_down.is_set()


def stopped_listening(server: PromptServer) -> None:
    """Wait until the server has closed its listeners (its shutdown has begun)."""
    while not server.servers or any(s.is_serving() for s in server.servers):
        threading.Event().wait(0.005)


def test_a_request_in_flight_is_answered_before_the_server_ends() -> None:
    app = SlowApp()
    server, thread, base = serve(app)
    answers: list[httpx.Response] = []
    asker = threading.Thread(
        target=lambda: answers.append(httpx.get(f"{base}/s", timeout=30, verify=trusted_tls()))
    )
    asker.start()
    assert app.in_flight.wait(10)
    server.request_exit()
    stopped_listening(server)
    # Shutting down: no new connection, but the held request keeps the server (and the
    # app's shutdown) waiting.
    try:
        httpx.get(f"{base}/late", timeout=5, verify=trusted_tls())
        refused = False
    except httpx.ConnectError:
        refused = True
    assert refused
    assert thread.is_alive()
    assert not app.shut_down.is_set()
    app.release.set()
    asker.join(timeout=10)
    thread.join(timeout=10)
    assert [(a.status_code, a.text) for a in answers] == [(200, "done")]
    assert not thread.is_alive()
    assert app.shut_down.is_set()
