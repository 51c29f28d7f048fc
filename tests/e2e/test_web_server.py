"""The web test image's server (devtools/web_server.c), compiled with gcc and run as a
plain process on a free port: every endpoint, keep-alive, the WebSocket protocol's
corners (RFC 6455's handshake example, fragments, ping/pong, close codes, unmasked
frames) and a prompt exit on SIGTERM. The image itself is tested on Podman in
test_web_image.py."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.devtools.web_image import compile_web_server
from tests.helpers import free_port
from tests.required_parts import needs_tools

# The web server is compiled.
pytestmark = [pytest.mark.e2e, needs_tools("gcc", how="apt-get install gcc")]


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_web_server(tmp_path_factory.mktemp("web") / "gpuyard-web")


def start(binary: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen([str(binary), str(port)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert b"listening on port" in line, line
    return proc, port


@pytest.fixture(scope="module")
def server(binary: Path) -> Iterator[str]:
    proc, port = start(binary)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def pattern(n: int) -> bytes:
    return (bytes(range(256)) * (n // 256 + 1))[:n]


def test_index_names_the_host(server: str) -> None:
    r = httpx.get(f"http://{server}/", verify=trusted_tls())
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert f"host: {socket.gethostname()}" in r.text
    head = httpx.head(f"http://{server}/", verify=trusted_tls())
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == len(r.content)


def test_bytes_keep_alive(server: str) -> None:
    with httpx.Client(verify=trusted_tls()) as client:
        for n in (0, 1, 1000, 1 << 20, (1 << 20) + 7):
            r = client.get(f"http://{server}/bytes/{n}")
            assert r.status_code == 200
            assert r.headers["content-length"] == str(n)
            assert r.content == pattern(n)
        assert client.get(f"http://{server}/bytes/x").status_code == 400
        assert client.get(f"http://{server}/bytes/1").status_code == 200


def test_one_connection_serves_many_requests(server: str) -> None:
    host, port = server.split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(
            b"GET /bytes/3 HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        data = b""
        while data.count(b"HTTP/1.1 200") < 2 or not data.endswith(b"ok\n"):
            chunk = s.recv(4096)
            assert chunk, data
            data += chunk
        assert b"\x00\x01\x02HTTP/1.1 200" in data


def test_stream_writes_a_line_per_interval(server: str) -> None:
    times: list[float] = []
    lines: list[str] = []
    start_t = time.monotonic()
    with httpx.stream(
        "GET", f"http://{server}/stream?seconds=1&interval=0.25", verify=trusted_tls()
    ) as r:
        assert r.headers["transfer-encoding"] == "chunked"
        for line in r.iter_lines():
            times.append(time.monotonic() - start_t)
            lines.append(line)
    assert [line.split()[1] for line in lines] == ["0", "1", "2", "3", "4"]
    # Lines arrive as they are written, not all at the end.
    assert times[2] - times[0] > 0.4 and times[-1] - times[0] >= 0.9
    assert httpx.get(f"http://{server}/stream?interval=0", verify=trusted_tls()).status_code == 400


def test_echo_sized_and_chunked(server: str) -> None:
    body = os.urandom(300_000)
    r = httpx.post(
        f"http://{server}/echo", content=body, headers={"content-type": "x/y"}, verify=trusted_tls()
    )
    assert r.content == body and r.headers["content-type"] == "x/y"

    def parts() -> Iterator[bytes]:
        for i in range(20):
            yield bytes([i]) * 1000

    r = httpx.post(f"http://{server}/echo", content=parts(), verify=trusted_tls())
    assert r.headers["transfer-encoding"] == "chunked"
    assert r.content == b"".join(bytes([i]) * 1000 for i in range(20))
    assert httpx.post(f"http://{server}/echo", verify=trusted_tls()).content == b""
    assert httpx.get(f"http://{server}/echo", verify=trusted_tls()).status_code == 405
    assert httpx.post(f"http://{server}/", content=b"x", verify=trusted_tls()).status_code == 405
    assert httpx.get(f"http://{server}/nope", verify=trusted_tls()).status_code == 404


def test_expect_continue(server: str) -> None:
    host, port = server.split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Expect: 100-continue\r\nConnection: close\r\n\r\n"
        )
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(b"hello")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\nhello")


def test_websocket_echo(server: str) -> None:
    async def go() -> None:
        async with websockets.connect(f"ws://{server}/ws", max_size=None) as ws:
            await ws.send("héllo")
            assert await ws.recv() == "héllo"
            blob = os.urandom(200_000)
            await ws.send(blob)
            assert await ws.recv() == blob
            await ws.send(["frag", "ments"])
            assert await ws.recv() == "fragments"
            pong = await ws.ping(b"abc")
            await asyncio.wait_for(pong, 5)
            await ws.close(code=4001, reason="bye")
        assert ws.close_code == 4001

    asyncio.run(go())


def raw_handshake(
    server: str, key: str = "dGhlIHNhbXBsZSBub25jZQ=="
) -> tuple[socket.socket, bytes]:
    host, port = server.split(":")
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(
        f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    return s, head


def test_websocket_handshake_matches_rfc_example(server: str) -> None:
    # RFC 6455 section 1.3's example key and answer (SHA-1 and base64 written in C).
    s, head = raw_handshake(server)
    with s:
        assert head.startswith(b"HTTP/1.1 101")
        assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in head
    # And a random key, checked against Python's SHA-1.
    key = base64.b64encode(os.urandom(16)).decode()
    want = base64.b64encode(
        hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
    )
    s, head = raw_handshake(server, key)
    with s:
        assert b"Sec-WebSocket-Accept: " + want + b"\r\n" in head


def test_websocket_unmasked_frame_is_a_protocol_error(server: str) -> None:
    s, _ = raw_handshake(server)
    with s:
        s.sendall(b"\x81\x02hi")  # text frame without a mask
        frame = s.recv(16)
        assert frame[:2] == b"\x88\x02" and struct.unpack("!H", frame[2:4])[0] == 1002


def test_websocket_needs_an_upgrade(server: str) -> None:
    assert httpx.get(f"http://{server}/ws", verify=trusted_tls()).status_code == 400
    r = httpx.get(
        f"http://{server}/ws",
        headers={
            "upgrade": "websocket",
            "connection": "upgrade",
            "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
            "sec-websocket-version": "8",
        },
        verify=trusted_tls(),
    )
    assert r.status_code == 426 and r.headers["sec-websocket-version"] == "13"


def test_sigterm_ends_server_and_connections(binary: Path) -> None:
    proc, port = start(binary)
    # A connection in the middle of a long stream has its own process; it must go too.
    with httpx.stream(
        "GET", f"http://127.0.0.1:{port}/stream?seconds=60&interval=1", verify=trusted_tls()
    ) as r:
        lines = r.iter_lines()
        next(lines)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        # The stream ends (cut short) instead of running for its minute.
        with pytest.raises(httpx.HTTPError):
            for _ in lines:
                pass
        assert time.monotonic() - t0 < 30
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/", verify=trusted_tls())
