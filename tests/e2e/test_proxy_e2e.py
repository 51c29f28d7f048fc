"""The HTTP proxy end to end: ``gpuyard serve`` configures a real Caddy, which carries
requests to real containers (the web test image) through each cluster's ``proxy_url``.

Checked: private ports (401 without a key, through with the owner's key or an open
link's cookie, 404 for another account's key), public ports, WebSocket echo, HTTP/2
(h2c), a response streamed for over two minutes, the stopped page, 404 after
terminate, and routes re-created after Caddy is killed and after gpuyard restarts
(SIGTERM, and kill -9 with Caddy kept serving).
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.devtools.web_image import WEB_IMAGE, build_web_image
from gpuyard.edge.caddy import CaddyProcess
from gpuyard.services.installation.bootstrap import open_store
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.settings import Settings
from tests.e2e.test_server_e2e import ServerProcess, running_server, wait_status
from tests.helpers import free_port
from tests.required_parts import needs_tools

pytestmark = [pytest.mark.e2e, needs_tools("caddy", how="apt-get install caddy")]

STREAM_SECONDS = 125  # longer than two minutes: no response-time cut-off anywhere


@pytest.fixture(scope="module")
def web_image(engine_url: str) -> str:
    return build_web_image("podman")


class Proxy:
    """Requests to proxy URLs, sent to the proxy's loopback port (``*.proxy.localhost``
    need not resolve on the test machine)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.client = httpx.Client(
            timeout=30, follow_redirects=False, trust_env=False, verify=trusted_tls()
        )

    def get(self, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
        parts = urlsplit(url)
        target = f"http://127.0.0.1:{self.port}{parts.path or '/'}"
        if parts.query:
            target += "?" + parts.query
        return self.client.get(target, headers={"Host": parts.netloc, **(headers or {})})


def wait_until(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"condition not met in {timeout} s (last: {last!r})")


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def other_account_key(home: Path) -> str:
    _, sessions = open_store(Settings(home=home))
    with sessions.begin() as session:
        user, account, _ = create_account(session, email="mallory@example.com", name="m")
        return issue_key(
            session, user_id=user.id, account_id=account.id, name="m", scope=Scope.WRITE
        ).key


def create(c: httpx.Client, name: str, visibility: str) -> dict[str, Any]:
    r = c.post(
        "/v1/clusters",
        json={
            "name": name,
            "gpu_type": "NVIDIA RTX A6000",
            "gpu_count": 1,
            "docker_image": WEB_IMAGE,
            "volume_gb": 1,
            "ports": [{"internal_port": 8888, "protocol": "http", "visibility": visibility}],
        },
    )
    assert r.status_code in (200, 201), r.text
    cid: str = r.json()["data"]["id"]
    return wait_status(c, cid, {"running"}, timeout=90)


def proxy_url_of(c: httpx.Client, cid: str) -> str | None:
    url: str | None = c.get(f"/v1/clusters/{cid}").json()["data"]["network"]["proxy_url"]
    return url


def ws_echo(proxy: Proxy, url: str, headers: dict[str, str]) -> str:
    parts = urlsplit(url)
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    with ws_connect(
        f"ws://{parts.netloc}/ws", sock=sock, additional_headers=headers, open_timeout=10
    ) as ws:
        ws.send("hello through the proxy")
        answer = ws.recv(timeout=10)
    return str(answer)


def h2c_status(proxy: Proxy, url: str, key: str) -> tuple[str, str]:
    """(HTTP version, status) of a GET with HTTP/2 over cleartext (prior knowledge)."""
    parts = urlsplit(url)
    out = subprocess.run(
        [
            "curl", "-s", "-o", "/dev/null", "-w", "%{http_version} %{http_code}",
            "--http2-prior-knowledge", "--resolve", f"{parts.hostname}:{proxy.port}:127.0.0.1",
            "-H", f"Authorization: Bearer {key}", f"http://{parts.netloc}/",
        ],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    version, status = out.stdout.split()
    return version, status


@pytest.fixture
def proxied_server(tmp_path: Path, engine_url: str) -> Iterator[tuple[ServerProcess, Proxy]]:
    port = free_port()
    env = {
        "GPUYARD_PROXY_ENABLED": "true",
        "GPUYARD_PROXY_PORT": str(port),
        "GPUYARD_PROXY_SYNC_INTERVAL_S": "0.5",
    }
    with running_server(tmp_path / "home", engine_url, env) as server:
        proxy = Proxy(port)
        try:
            yield server, proxy
        finally:
            proxy.client.close()


def test_proxy_urls_through_real_caddy(
    proxied_server: tuple[ServerProcess, Proxy], web_image: str
) -> None:
    server, proxy = proxied_server
    with server.client() as c:
        public = create(c, "stream", "public")
        private = create(c, "web", "private")
        url = wait_until(lambda: proxy_url_of(c, private["id"]))
        assert url == f"http://{private['id']}-8888.proxy.localhost:{proxy.port}"
        ports = c.get(f"/v1/clusters/{private['id']}").json()["data"]["network"]["ports"]
        assert ports[0]["proxy_url"] == url and ports[0]["visibility"] == "private"
        public_url = wait_until(lambda: proxy_url_of(c, public["id"]))

        # A response streamed for over two minutes, running while the rest is checked.
        lines: list[str] = []
        arrived: list[float] = []
        failure: list[BaseException] = []
        began = time.monotonic()

        def stream() -> None:
            try:
                parts = urlsplit(public_url)
                stream_url = (
                    f"http://127.0.0.1:{proxy.port}/stream?seconds={STREAM_SECONDS}&interval=5"
                )
                with (
                    httpx.Client(
                        timeout=httpx.Timeout(30, read=60), trust_env=False, verify=trusted_tls()
                    ) as s,
                    s.stream("GET", stream_url, headers={"Host": parts.netloc}) as r,
                ):
                    assert r.status_code == 200
                    for line in r.iter_lines():
                        if line.strip():
                            lines.append(line)
                            # Each line passes as it is written, not at the end.
                            arrived.append(time.monotonic() - began)
            except BaseException as e:  # reported by the main thread
                failure.append(e)

        streamer = threading.Thread(target=stream)
        streamer.start()

        # Routes reach Caddy within a pass of the cluster running.
        page = wait_until(lambda: (r := proxy.get(public_url)).status_code == 200 and r)
        assert "<html" in page.text.lower()

        # Private: 401 without a key, through with the owner's key, 404 for another's.
        anonymous = proxy.get(url)
        assert anonymous.status_code == 401 and "private" in anonymous.text
        owner = proxy.get(url, {"Authorization": f"Bearer {server.key}"})
        assert owner.status_code == 200, owner.text
        assert proxy.get(url, {"X-Gpuyard-Api-Key": server.key}).status_code == 200
        foreign = other_account_key(server.home)
        assert proxy.get(url, {"Authorization": f"Bearer {foreign}"}).status_code == 404
        assert proxy.get(url, {"Authorization": "Bearer gy_notakey"}).status_code == 401
        # A request body streams to the container, past the key check, whole.
        upload = bytes(range(256)) * 20_000  # 5 MB
        counted = proxy.client.post(
            f"http://127.0.0.1:{proxy.port}/count",
            headers={"Host": urlsplit(url).netloc, "Authorization": f"Bearer {server.key}"},
            content=upload,
        )
        assert counted.status_code == 200, counted.text
        assert counted.text.strip() == f"bytes={len(upload)} fnv1a64={fnv1a64(upload):016x}"

        # An open link: one use, then a cookie for this host only.
        r = c.get(f"/v1/clusters/{private['id']}/ports/8888/open")
        assert r.status_code == 200, r.text
        link = r.json()["data"]["url"]
        assert link.startswith(url + "/v1/clusters/")
        landed = proxy.get(link)
        assert landed.status_code == 302 and landed.headers["location"] == "/"
        cookie = landed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "gy_proxy=" in cookie
        session = cookie.split(";")[0]
        assert proxy.get(url, {"Cookie": session}).status_code == 200
        assert proxy.get(link).status_code == 403  # used up
        nobody = f"http://{'z' * 14}-8888.proxy.localhost:{proxy.port}"
        assert proxy.get(nobody).status_code == 404
        events = c.get(f"/v1/clusters/{private['id']}/events").json()["data"]["events"]
        messages = [e["message"] for e in events]
        assert any("open link" in m and "used" in m for m in messages)

        # WebSocket and HTTP/2 through the proxy.
        assert ws_echo(proxy, url, {"Cookie": session}) == "hello through the proxy"
        assert h2c_status(proxy, url, server.key) == ("2", "200")

        # Stop: the stopped page. Start: serves again. Terminate: 404.
        assert c.post(f"/v1/clusters/{private['id']}/stop").status_code == 200
        wait_status(c, private["id"], {"stopped"})
        stopped = wait_until(
            lambda: (r := proxy.get(url, {"Cookie": session})).status_code == 502 and r
        )
        assert "stopped" in stopped.text
        assert c.post(f"/v1/clusters/{private['id']}/start").status_code == 200
        wait_status(c, private["id"], {"running"}, timeout=90)
        wait_until(lambda: proxy.get(url, {"Cookie": session}).status_code == 200, timeout=30)

        # Stops, starts and open links left the stream alone (nothing a cluster does
        # reloads Caddy: tests/e2e/test_proxy_routes_e2e.py terminates others under a
        # stream); the terminate comes once it is whole.
        streamer.join(timeout=STREAM_SECONDS + 60)
        assert not failure, failure
        assert len(lines) >= STREAM_SECONDS // 5, lines[-3:]
        assert arrived[0] < 10 and arrived[-1] - arrived[0] > STREAM_SECONDS - 10
        assert c.delete(f"/v1/clusters/{private['id']}").status_code == 200
        wait_status(c, private["id"], {"terminated"})
        wait_until(lambda: proxy.get(url, {"Cookie": session}).status_code == 404)
        assert proxy_url_of(c, private["id"]) is None

        # Caddy killed: gpuyard starts another and loads the routes again.
        caddy = CaddyProcess(server.home / "caddy")
        first_pid = caddy.pid()
        assert first_pid is not None
        subprocess.run(["kill", "-9", str(first_pid)], check=True)
        wait_until(lambda: caddy.pid() not in (None, first_pid) or None, timeout=30)
        # The new Caddy listens once its configuration is loaded: until then, refused.
        wait_until(lambda: _answers(proxy, public_url), timeout=30)

    # gpuyard killed: Caddy keeps serving; the next gpuyard adopts it.
    server.kill9()
    assert proxy.get(public_url).status_code == 200
    server.start()
    with server.client() as c:
        assert wait_until(lambda: proxy_url_of(c, public["id"])) == public_url
    assert proxy.get(public_url).status_code == 200
    # gpuyard stopped cleanly: its Caddy goes with it; the next start brings both back.
    server.stop()
    with pytest.raises(httpx.HTTPError):
        proxy.get(public_url)
    server.start()
    wait_until(lambda: _answers(proxy, public_url), timeout=30)


def _answers(proxy: Proxy, url: str) -> bool:
    try:
        return proxy.get(url).status_code == 200
    except httpx.HTTPError:
        return False
