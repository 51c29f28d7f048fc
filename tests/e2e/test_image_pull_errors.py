"""A real Podman pull from a registry address the operator allowed but that is not a
registry: a closed port, a port that closes at once and an HTTP server all end in the
same fixed message, without the engine's network detail (runtimes/engines/pull_errors.py).

Everything listens on 127.0.0.1 in this process; no registry is reached.
"""

from __future__ import annotations

import contextlib
import http.server
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.engines.pull_errors import NOT_FOUND, UNREACHABLE
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from tests.e2e.test_server_e2e import ServerProcess, wait_status
from tests.helpers import free_port

# What the engine would have said: any of it in a message tells the ports apart.
ENGINE_WORDING = re.compile(
    r"refused|dial|HTTP response|EOF|tls|handshake|pinging|invalid status|Get \"", re.I
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextlib.contextmanager
def _closing_server() -> Iterator[int]:
    """Accepts connections and closes them at once (an open, non-HTTP port)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        sock.close()


@contextlib.contextmanager
def _http_server() -> Iterator[int]:
    """A plain HTTP server (404 for everything it serves from an empty directory)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextlib.contextmanager
def _three_ports() -> Iterator[dict[str, int]]:
    with _closing_server() as closing, _http_server() as web:
        yield {"closed": _closed_port(), "closes": closing, "http": web}


def _pull_failure(rt: DockerEngineRuntime, image: str) -> str:
    with pytest.raises(RuntimeFailure) as info:
        rt.ensure_image(image)
    return info.value.message


def test_closed_open_and_http_ports_read_the_same(engine_url: str) -> None:
    rt = DockerEngineRuntime(engine_url, timeout_s=60, owner=Ownership.new())
    with _three_ports() as ports:
        messages = {
            kind: _pull_failure(rt, f"127.0.0.1:{port}/probe/x:1").replace(str(port), "PORT")
            for kind, port in ports.items()
        }
    assert len(set(messages.values())) == 1, messages
    message = messages["closed"]
    assert UNREACHABLE in message and not ENGINE_WORDING.search(message), message


def test_local_images_are_never_pulled(engine_url: str) -> None:
    rt = DockerEngineRuntime(engine_url, timeout_s=60, owner=Ownership.new())
    message = _pull_failure(rt, "localhost/gpuyard/never-built:1")
    assert "localhost/gpuyard/never-built:1 is not present" in message
    assert NOT_FOUND in message and not ENGINE_WORDING.search(message), message


def test_a_clusters_error_message_has_no_network_detail(tmp_path: Path, engine_url: str) -> None:
    """Through the server: an operator allowed three addresses; the clusters whose
    images name them fail with the same error_message."""
    with _three_ports() as ports:
        server = ServerProcess(tmp_path / "home", engine_url, free_port())
        allowed = ",".join(f"127.0.0.1:{p}" for p in ports.values())
        server.extra_env["GPUYARD_ALLOWED_REGISTRIES"] = allowed
        try:
            server.start()
            with server.client() as c:
                ids = {}
                for kind, port in ports.items():
                    r = c.post("/v1/clusters", json={"docker_image": f"127.0.0.1:{port}/x:1"})
                    assert r.status_code == 201, r.text
                    ids[kind] = r.json()["data"]["id"]
                messages = {}
                for kind, cid in ids.items():
                    data = wait_status(c, cid, {"error", "running"})
                    assert data["status"] == "error", data
                    messages[kind] = data["error_message"].replace(str(ports[kind]), "PORT")
                # Not allowed by the setting: refused before anything reaches the engine.
                r = c.post("/v1/clusters", json={"docker_image": "127.0.0.1:1/x"})
                assert r.status_code == 400, r.text
        finally:
            server.cleanup()
    assert len(set(messages.values())) == 1, messages
    message = messages["closed"]
    assert UNREACHABLE in message and not ENGINE_WORDING.search(message), message
