"""The body-limit middleware at the ASGI level: an oversize body is answered 413 in
the surface's envelope without being read (a ``Content-Length`` above the limit) or
without reading past the limit (a chunked body); a body within the limit reaches the
app whole. Over real sockets: tests/api/test_body_limit.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from gpuyard.api.http.body_limit import BodyLimit

LIMIT = 1000


class Client:
    """The server side of one request: body messages to hand out, what was sent back."""

    def __init__(self, chunks: list[bytes], *, more_after: bool = False) -> None:
        self.messages: list[Message] = [
            {"type": "http.request", "body": c, "more_body": more_after or i < len(chunks) - 1}
            for i, c in enumerate(chunks)
        ]
        self.reads = 0
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        self.reads += 1
        if self.messages:
            return self.messages.pop(0)
        await asyncio.sleep(3600)  # a client that never finishes its body
        raise AssertionError("unreachable")

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def json(self) -> Any:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])


class App:
    """Reads the whole body, answers 200 with its length."""

    def __init__(self) -> None:
        self.called = False
        self.body = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.called = True
        while True:
            message = await receive()
            self.body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"%d" % len(self.body)})


def scope(path: str = "/v1/projects", **headers: str) -> Scope:
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
    }


def run(s: Scope, client: Client) -> App:
    app = App()
    asyncio.run(asyncio.wait_for(BodyLimit(app, LIMIT)(s, client.receive, client.send), 5))
    return app


def test_announced_oversize_body_is_refused_unread() -> None:
    client = Client([b"x" * 100], more_after=True)
    app = run(scope(content_length=str(10 * 1024 * 1024)), client)
    assert client.reads == 0 and not app.called
    assert client.status == 413
    assert client.headers[b"connection"] == b"close"
    error = client.json["error"]
    assert error["code"] == "PAYLOAD_TOO_LARGE" and error["details"] == {"limit_bytes": LIMIT}


def test_chunked_body_is_refused_once_past_the_limit_without_reading_the_rest() -> None:
    # Twenty 100-byte chunks and then a client that never ends its body: the limit is
    # passed at the 11th chunk, and nothing after it is read.
    client = Client([b"x" * 100] * 20, more_after=True)
    app = run(scope(transfer_encoding="chunked"), client)
    assert client.reads == 11 and not app.called
    assert client.status == 413 and client.json["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert len(client.messages) == 9


def test_malformed_or_repeated_length_is_counted() -> None:
    for headers in ({"content_length": "12abc"}, {"content_length": "10"}):
        client = Client([b"x" * 600, b"x" * 600])
        s = scope(**headers)
        if headers["content_length"] == "10":
            s["headers"].append((b"content-length", b"10"))
        app = run(s, client)
        assert client.status == 413 and not app.called


def test_body_within_the_limit_reaches_the_app_whole() -> None:
    chunked = Client([b"a" * 400, b"b" * 400, b"c" * 200])
    app = run(scope(transfer_encoding="chunked"), chunked)
    assert chunked.status == 200 and app.body == b"a" * 400 + b"b" * 400 + b"c" * 200
    exact = Client([b"z" * LIMIT])
    app = run(scope(content_length=str(LIMIT)), exact)
    assert exact.status == 200 and app.body == b"z" * LIMIT
    empty = Client([b""])
    app = run(scope(), empty)
    assert empty.status == 200 and app.called


def test_each_surface_answers_in_its_own_envelope() -> None:
    big = str(LIMIT + 1)
    graphql = Client([])
    run(scope("/graphql", content_length=big), graphql)
    assert graphql.status == 413
    assert graphql.json["errors"][0]["extensions"]["code"] == "PAYLOAD_TOO_LARGE"
    training = Client([])
    run(scope("/distributed_jobs_v2/cluster/", content_length=big), training)
    body = training.json
    assert training.status == 413 == body["code"] and body["data"] == {}
    assert body["errors"]["code"] == "PAYLOAD_TOO_LARGE" and "bytes" in body["message"]
    v2 = Client([])
    run(scope("/v2/clusters/abc/start", content_length=big), v2)
    assert v2.status == 413 and v2.json["error"]["code"] == "PAYLOAD_TOO_LARGE"


def test_other_scopes_pass_through() -> None:
    called: list[str] = []

    async def app(s: Scope, receive: Receive, send: Send) -> None:
        called.append(s["type"])

    async def receive() -> Message:
        raise AssertionError("not read")

    async def send(message: Message) -> None:
        raise AssertionError("not answered")

    asyncio.run(BodyLimit(app, LIMIT)({"type": "lifespan"}, receive, send))
    assert called == ["lifespan"]
