"""Another account probes a cluster through every way in: the HTTP proxy, the SSH
gateway, the logs and the web terminal. One real server (proxy and gateway on), real
containers; every probe must fail, and the owner's own attempts show the probes were
aimed right (the same requests with the owner's credentials succeed)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import websockets

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.devtools.web_image import WEB_IMAGE, build_web_image
from tests.e2e.test_network_isolation import as_key, new_account_key
from tests.e2e.test_server_e2e import ServerProcess, running_server, wait_status
from tests.e2e.test_ssh_gateway_e2e import keygen, ssh, wait_port
from tests.helpers import free_port

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(tmp_path: Path, engine_url: str) -> Iterator[tuple[ServerProcess, int, int]]:
    build_web_image("podman")
    proxy_port, ssh_port = free_port(), free_port()
    env = {
        "GPUYARD_PROXY_ENABLED": "true",
        "GPUYARD_PROXY_PORT": str(proxy_port),
        "GPUYARD_SSH_PORT": str(ssh_port),
        "GPUYARD_SSH_BIND": "127.0.0.1",
    }
    with running_server(tmp_path / "home", engine_url, env) as srv:
        wait_port(ssh_port)
        yield srv, proxy_port, ssh_port


def proxied(proxy_port: int, url: str, headers: dict[str, str]) -> int:
    parts = urlsplit(url)
    target = f"http://127.0.0.1:{proxy_port}{parts.path or '/'}" + (
        f"?{parts.query}" if parts.query else ""
    )
    r = httpx.get(
        target, headers={"Host": parts.netloc, **headers}, timeout=10, verify=trusted_tls()
    )
    return r.status_code


def terminal_opens(srv: ServerProcess, cid: str, key: str) -> bool:
    async def attempt() -> bool:
        url = srv.url.replace("http://", "ws://") + f"/v1/clusters/{cid}/terminal"
        try:
            async with websockets.connect(
                url, additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=10
            ) as ws:
                await ws.send(b"echo probe\n")
                # The shell opens after the upgrade: slow on a loaded machine.
                await asyncio.wait_for(ws.recv(), 20)
                return True
        except (websockets.exceptions.WebSocketException, OSError, TimeoutError):
            return False

    return asyncio.run(attempt())


def test_another_account_gets_nowhere(
    server: tuple[ServerProcess, int, int], tmp_path: Path
) -> None:
    srv, proxy_port, ssh_port = server
    owner = srv.client()
    intruder_key = new_account_key(srv, "mallory@example.com")
    intruder = as_key(srv, intruder_key)
    keys = {name: keygen(tmp_path / name) for name in ("owner", "intruder")}
    for client, name in ((owner, "owner"), (intruder, "intruder")):
        r = client.post(
            "/v1/ssh-keys",
            json={"name": name, "public_key": keys[name].with_suffix(".pub").read_text()},
        )
        assert r.status_code == 201, r.text

    def make(client: httpx.Client) -> str:
        r = client.post(
            "/v1/clusters",
            json={
                "docker_image": WEB_IMAGE,
                "memory_gb": 1,
                "cpu_cores": 1,
                "ports": [{"internal_port": 8888, "protocol": "http"}],
            },
        )
        assert r.status_code == 201, r.text
        cid: str = r.json()["data"]["id"]
        assert wait_status(client, cid, {"running", "error"}, timeout=90)["status"] == "running"
        return cid

    target, own = make(owner), make(intruder)
    url = owner.get(f"/v1/clusters/{target}").json()["data"]["network"]["proxy_url"]
    assert url is not None
    # The intruder's own port opens with its own link: a cookie of its own to try.
    link = intruder.get(f"/v1/clusters/{own}/ports/8888/open").json()["data"]["url"]
    parts = urlsplit(link)
    landed = httpx.get(
        f"http://127.0.0.1:{proxy_port}{parts.path}?{parts.query}",
        headers={"Host": parts.netloc},
        verify=trusted_tls(),
    )
    assert landed.status_code == 302
    own_cookie = landed.headers["set-cookie"].split(";")[0]

    probes: dict[str, Callable[[str, Path], bool]] = {
        "proxy, key header": lambda k, _: (
            proxied(proxy_port, url, {"Authorization": f"Bearer {k}"}) == 200
        ),
        "proxy, key as X-Gpuyard-Api-Key": lambda k, _: (
            proxied(proxy_port, url, {"X-Gpuyard-Api-Key": k}) == 200
        ),
        "proxy, open link": lambda k, _: (
            as_key(srv, k).get(f"/v1/clusters/{target}/ports/8888/open").status_code == 200
        ),
        "logs": lambda k, _: as_key(srv, k).get(f"/v1/clusters/{target}/logs").status_code == 200,
        "logs, follow": lambda k, _: (
            as_key(srv, k)
            .get(f"/v1/clusters/{target}/logs", params={"follow": "true", "tail": 1}, timeout=5)
            .status_code
            == 200
            if k != srv.key
            else True
        ),  # the owner's follow would stream forever
        "terminal": lambda k, _: terminal_opens(srv, target, k),
        "ssh gateway": lambda _, key: ssh(key, ssh_port, target, "echo in").returncode == 0,
    }
    failures = {name: probe(intruder_key, keys["intruder"]) for name, probe in probes.items()}
    # Another port's cookie does not open this one.
    failures["proxy, another cluster's cookie"] = (
        proxied(proxy_port, url, {"Cookie": own_cookie}) == 200
    )
    assert [name for name, ok in failures.items() if ok] == [], failures
    # Aimed right: the owner's credentials pass each way in.
    owner_passes = {name: probe(srv.key, keys["owner"]) for name, probe in probes.items()}
    assert all(owner_passes.values()), owner_passes
    with socket.create_connection(("127.0.0.1", ssh_port), timeout=5):
        pass  # the gateway is still up after the refusals

    # A stranger guessing keys through the proxy is throttled as itself, not as the
    # proxy: the owner, from another address, still gets through.
    def from_address(address: str, key: str) -> int:
        parts = urlsplit(url)
        transport = httpx.HTTPTransport(local_address=address)
        with httpx.Client(transport=transport, timeout=10, verify=trusted_tls()) as client:
            r = client.get(
                f"http://127.0.0.1:{proxy_port}/",
                headers={"Host": parts.netloc, "Authorization": f"Bearer {key}"},
            )
            return r.status_code

    guesses = [from_address("127.0.0.2", f"gy_guess{i}") for i in range(15)]
    assert guesses[0] == 401 and guesses[-1] == 429, guesses
    assert from_address("127.0.0.3", srv.key) == 200
