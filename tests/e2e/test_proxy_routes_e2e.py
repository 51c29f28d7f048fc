"""The proxy routes per request (docs/decisions.md "The proxy routes per request"):
with ``gpuyard serve``, a real Caddy and its resolver, and real containers (the web
test image), a long response and WebSockets to one cluster keep flowing while 20 other
clusters are created and terminated; Caddy loads no configuration meanwhile. A
private port's WebSocket takes the owner's key in Authorization (another account's is
refused), and a terminated cluster's port stops answering within seconds.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import dns.message
import dns.query
import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.devtools.web_image import WEB_IMAGE
from gpuyard.edge.caddy import CaddyAdmin, CaddyProcess
from gpuyard.edge.proxy_resolver import ZONE, ResolverProcess
from tests.e2e.test_proxy_e2e import (
    Proxy,
    create,
    other_account_key,
    proxied_server,
    proxy_url_of,
    wait_until,
    web_image,
)
from tests.e2e.test_server_e2e import ServerProcess, wait_status
from tests.required_parts import needs_tools

pytestmark = [pytest.mark.e2e, needs_tools("caddy", how="apt-get install caddy")]

__all__ = ["proxied_server", "web_image"]  # fixtures, shared with test_proxy_e2e

# Longer than the churn; the test ends it once the churn is over.
STREAM_SECONDS = 600
CHURN = 20
BATCH = 5  # clusters up at once


def ws_open(proxy: Proxy, url: str, headers: dict[str, str]) -> ClientConnection:
    parts = urlsplit(url)
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    return ws_connect(
        f"ws://{parts.netloc}/ws", sock=sock, additional_headers=headers, open_timeout=10
    )


def echoes(ws: ClientConnection, text: str) -> bool:
    ws.send(text)
    return ws.recv(timeout=10) == text


def config_loads(server: ServerProcess) -> int:
    """How many configurations the gpuyard-run Caddy has loaded (its log says)."""
    log = (server.home / "caddy" / "caddy.log").read_text(errors="replace")
    return log.count('"msg":"load complete"')


def resolves(server: ServerProcess, url: str) -> bool:
    """Whether the proxy's resolver still routes ``url``'s cluster port."""
    resolver = ResolverProcess(server.home / "caddy")
    port = resolver.port()
    assert port is not None
    label = urlsplit(url).hostname.split(".")[0]  # type: ignore[union-attr]
    q = dns.message.make_query(f"{label}.port.{ZONE}", "SRV")
    return bool(dns.query.udp(q, "127.0.0.1", port=port, timeout=2).answer)


def create_only(c: httpx.Client, name: str) -> str:
    r = c.post(
        "/v1/clusters",
        json={
            "name": name,
            "gpu_count": 0,
            "cpu_cores": 1,
            "memory_gb": 1,
            "docker_image": WEB_IMAGE,
            "volume_gb": 1,
            "ports": [{"internal_port": 8888, "protocol": "http", "visibility": "public"}],
        },
    )
    assert r.status_code in (200, 201), r.text
    cid: str = r.json()["data"]["id"]
    return cid


@pytest.fixture
def two_clusters(
    proxied_server: tuple[ServerProcess, Proxy], web_image: str
) -> Iterator[tuple[ServerProcess, Proxy, str, str]]:
    server, proxy = proxied_server
    with server.client() as c:
        public = create(c, "a-public", "public")
        private = create(c, "a-private", "private")
        public_url = wait_until(lambda: proxy_url_of(c, public["id"]))
        private_url = wait_until(lambda: proxy_url_of(c, private["id"]))
    wait_until(lambda: proxy.get(public_url).status_code == 200)
    yield server, proxy, public_url, private_url


def test_streams_and_websockets_outlive_other_clusters(
    two_clusters: tuple[ServerProcess, Proxy, str, str],
) -> None:
    server, proxy, public_url, private_url = two_clusters
    lines: list[float] = []
    failure: list[BaseException] = []
    enough = threading.Event()
    began = time.monotonic()

    def stream() -> None:
        try:
            with (
                httpx.Client(
                    timeout=httpx.Timeout(30, read=20), trust_env=False, verify=trusted_tls()
                ) as s,
                s.stream(
                    "GET",
                    f"http://127.0.0.1:{proxy.port}/stream?seconds={STREAM_SECONDS}&interval=1",
                    headers={"Host": urlsplit(public_url).netloc},
                ) as r,
            ):
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.strip():
                        lines.append(time.monotonic() - began)
                    if enough.is_set():
                        return
        except BaseException as e:  # reported by the main thread
            failure.append(e)

    streamer = threading.Thread(target=stream)
    streamer.start()
    key = {"Authorization": f"Bearer {server.key}"}
    public_ws = ws_open(proxy, public_url, {})
    private_ws = ws_open(proxy, private_url, key)
    assert echoes(public_ws, "first") and echoes(private_ws, "first")
    loads_before = config_loads(server)
    caddy_pid = CaddyProcess(server.home / "caddy").pid()

    gone_after: list[float] = []
    unrouted: list[float] = []
    domain = urlsplit(public_url).netloc.split(".", 1)[1]
    with server.client() as c:
        for batch in range(CHURN // BATCH):
            churned = [create_only(c, f"churn-{batch}-{i}") for i in range(BATCH)]
            for n, cid in enumerate(churned):
                wait_status(c, cid, {"running"}, timeout=120)
                assert echoes(public_ws, f"up {n}") and echoes(private_ws, f"up {n}")
            # A new port answers at once, with no configuration loaded for it.
            last = f"http://{churned[-1]}-8888.{domain}"
            wait_until(lambda u=last: proxy.get(u).status_code == 200, timeout=10)
            for n, cid in enumerate(churned):
                assert c.delete(f"/v1/clusters/{cid}").status_code == 200
                assert echoes(public_ws, f"down {n}") and echoes(private_ws, f"down {n}")
            for cid in churned:
                wait_status(c, cid, {"terminated"}, timeout=120)
            # A terminated cluster's port stops answering within seconds: its route
            # leaves the resolver's table in the sync's next pass (Caddy keeps a
            # lookup at most 1 s more), and the API's page says 404.
            done = time.monotonic()
            wait_until(lambda u=last: not resolves(server, u), timeout=10)
            unrouted.append(time.monotonic() - done)
            wait_until(lambda u=last: proxy.get(u).status_code == 404, timeout=10)
            gone_after.append(time.monotonic() - done)
    churn_ended = time.monotonic() - began
    assert echoes(public_ws, "after") and echoes(private_ws, "after")
    print(
        f"after 'terminated': route gone from the resolver in "
        f"{[round(g * 1000) for g in unrouted]} ms, port answering 404 in "
        f"{[round(g * 1000) for g in gone_after]} ms"
    )
    assert max(gone_after) < 3.0 and max(unrouted) < 3.0

    # The stream ran through the whole churn, a line a second, and still runs.
    wait_until(lambda: lines and lines[-1] > churn_ended, timeout=5)
    enough.set()
    streamer.join(timeout=10)
    assert not failure, failure
    gaps = [b - a for a, b in itertools.pairwise(lines)]
    assert lines[0] < 5 and max(gaps) < 3, (lines[:3], max(gaps))
    print(f"stream: {len(lines)} lines over {lines[-1] - lines[0]:.0f} s of churn")
    # Caddy is the same process, and it loaded nothing while clusters came and went.
    assert CaddyProcess(server.home / "caddy").pid() == caddy_pid
    assert config_loads(server) == loads_before
    public_ws.close()
    private_ws.close()


def test_a_private_ports_websocket_takes_the_owners_key_only(
    two_clusters: tuple[ServerProcess, Proxy, str, str],
) -> None:
    server, proxy, _, private_url = two_clusters
    for headers in (
        {"Authorization": f"Bearer {server.key}"},
        {"Authorization": server.key},
        {"X-Gpuyard-Api-Key": server.key},
    ):
        with ws_open(proxy, private_url, headers) as ws:
            assert echoes(ws, "hello through the proxy"), headers
    # Another account's key, a wrong key, none: the handshake is refused.
    foreign = other_account_key(server.home)
    for headers, status in (
        ({"Authorization": f"Bearer {foreign}"}, 404),
        ({"Authorization": "Bearer gy_notakey"}, 401),
        ({}, 401),
    ):
        with pytest.raises(InvalidStatus) as refused:
            ws_open(proxy, private_url, headers)
        assert refused.value.response.status_code == status, headers
    # The configuration Caddy runs names no cluster.
    admin = CaddyAdmin(CaddyProcess(server.home / "caddy").admin_address)
    try:
        running: Any = admin.config()
    finally:
        admin.close()
    assert urlsplit(private_url).hostname.split("-")[0] not in str(running)  # type: ignore[union-attr]
