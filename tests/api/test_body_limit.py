"""Request bodies over GPUYARD_MAX_BODY_BYTES are refused with 413 in the surface's
envelope before the server reads them, over real sockets: an announced length is
refused at once (the client need not send the rest), a chunked body as soon as it
passes the limit (the client never ends it here)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings

LIMIT = 4096
# Far above a local answer; a server waiting for the rest of a body never answers.
ANSWER_S = 5.0


@pytest.fixture
def small(tmp_path: Path) -> Iterator[LiveServer]:
    """A server with a 4 KiB body limit."""
    settings = make_settings(tmp_path / "home", max_body_bytes=LIMIT)
    with live_server(settings, FakeRuntime()) as server:
        yield server


def exchange(srv: LiveServer, head: str, body: bytes) -> tuple[int, dict[str, str], Any]:
    """Send ``head`` and ``body`` in one write and read the answer to the end of the
    connection (the server must close it). Raises TimeoutError when the server waits
    for more of the body instead of answering."""
    port = int(srv.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_S) as sock:
        sock.sendall(head.encode() + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_bytes, _, payload = data.partition(b"\r\n\r\n")
    lines = head_bytes.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    return status, headers, json.loads(payload)


def request_head(srv: LiveServer, path: str, framing: str) -> str:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {srv.key}\r\n"
        f"Content-Type: application/json\r\n{framing}\r\n\r\n"
    )


def test_announced_10_mb_body_is_refused_before_it_is_sent(srv: LiveServer) -> None:
    """The default limit (256 KiB); the client sends 1 KiB of its 10 MB and waits."""
    head = request_head(srv, "/v1/projects", f"Content-Length: {10 * 1024 * 1024}")
    status, headers, body = exchange(srv, head, b"[" * 1024)
    assert status == 413 and headers["connection"] == "close"
    assert body["success"] is False
    assert body["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert body["error"]["details"] == {"limit_bytes": 256 * 1024}
    # The server is fine afterwards.
    with srv.client() as c:
        assert c.get("/v1/projects").status_code == 200


def test_unending_chunked_body_is_refused_once_past_the_limit(small: LiveServer) -> None:
    chunk = b"[" * 1500
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(4))
    # No closing 0-chunk: the body never ends unless the server stops reading.
    head = request_head(small, "/v1/projects", "Transfer-Encoding: chunked")
    status, headers, body = exchange(small, head, chunks)
    assert status == 413 and headers["connection"] == "close"
    assert body["error"]["code"] == "PAYLOAD_TOO_LARGE"


def test_each_surface_answers_413_in_its_envelope(small: LiveServer) -> None:
    oversize = b" " * (LIMIT + 1)
    length = f"Content-Length: {len(oversize)}"
    status, _, body = exchange(small, request_head(small, "/graphql", length), oversize)
    assert status == 413
    assert body["errors"][0]["extensions"]["code"] == "PAYLOAD_TOO_LARGE"
    path = "/distributed_jobs_v2/cluster/?project_id=1&location=local"
    status, _, body = exchange(small, request_head(small, path, length), oversize)
    assert status == 413 == body["code"] and body["errors"]["code"] == "PAYLOAD_TOO_LARGE"
    status, _, body = exchange(small, request_head(small, "/v2/clusters/x/start", length), oversize)
    assert status == 413 and body["error"]["code"] == "PAYLOAD_TOO_LARGE"


def test_bodies_within_the_limit_are_served(small: LiveServer) -> None:
    with small.client() as c:
        # Exactly at the limit: judged by the route (a name that long is refused or
        # kept), never 413.
        padding = LIMIT - len(json.dumps({"name": ""}).encode())
        exact = json.dumps({"name": "p" * padding}).encode()
        assert len(exact) == LIMIT
        r = c.post("/v1/projects", content=exact, headers={"content-type": "application/json"})
        assert r.status_code in (201, 400), r.text

        # A chunked body (no Content-Length) within the limit reaches the route whole.
        def parts() -> Iterator[bytes]:
            yield b'{"name": '
            yield b'"chunked-project"}'

        r = c.post("/v1/projects", content=parts(), headers={"content-type": "application/json"})
        assert r.status_code == 201, r.text
        assert r.json()["data"]["name"] == "chunked-project"
        # And an oversize one sent by an ordinary client gets the 413 too.
        r = c.post("/v1/projects", json={"name": "q" * LIMIT})
        assert r.status_code == 413 and r.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"


def test_graphql_batch_over_the_limit(small: LiveServer) -> None:
    batch = [{"query": "{ myself { id } }", "variables": {"pad": "v" * 500}}] * 10
    r = httpx.post(
        f"{small.url}/graphql",
        json=batch,
        headers={"Authorization": small.key},
        verify=trusted_tls(),
    )
    assert r.status_code == 413
    assert r.json()["errors"][0]["extensions"]["code"] == "PAYLOAD_TOO_LARGE"
