"""A private http port is reachable only through the proxy (real Podman, real Caddy).

Another account's cluster tries the port on every address of the host it can name
(``host.containers.internal``, its network's gateway, the host's own addresses), as
does a container on a training cluster's network and a client of the host's external
address; all fail, while the same probes reach a public port (so they were aimed
right) and the owner gets through the proxy with a key or a session cookie. Through the
proxy the container sees no gpuyard credential (the web image echoes the headers it
got), and a session cookie is matched by its exact name and refused once its member is
removed. Clean-up is by installation label only.
"""

from __future__ import annotations

import ipaddress
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import docker
import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.core.training.clusters import NodeName
from gpuyard.devtools.web_image import WEB_IMAGE, build_web_image
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.hosts.firewall import LOOPBACK_GUARD
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys
from gpuyard.runtimes.slurm.nodes import SlurmNodeRuntime
from gpuyard.store.db import WRITE_OPTIONS
from gpuyard.store.schema import Member
from tests.e2e.podman_host import HOSTS_HOW, PodmanHost
from tests.e2e.podman_host import available as hosts_unavailable
from tests.e2e.test_network_isolation import as_key, new_account_key
from tests.e2e.test_server_e2e import ServerProcess, container_name, running_server, wait_status
from tests.helpers import free_port
from tests.required_parts import needs, needs_tools

pytestmark = [pytest.mark.e2e, needs_tools("caddy", how="apt-get install caddy")]

GET_HEALTHZ = "printf 'GET /healthz HTTP/1.0\\r\\nHost: probe\\r\\n\\r\\n'"


@pytest.fixture
def server(tmp_path: Path, engine_url: str) -> Iterator[tuple[ServerProcess, int]]:
    build_web_image("podman")
    proxy_port = free_port()
    env = {
        "GPUYARD_PROXY_ENABLED": "true",
        "GPUYARD_PROXY_PORT": str(proxy_port),
        "GPUYARD_PROXY_SYNC_INTERVAL_S": "0.5",
    }
    with running_server(tmp_path / "home", engine_url, env) as srv:
        yield srv, proxy_port


def make(c: httpx.Client, visibility: str) -> dict[str, Any]:
    r = c.post(
        "/v1/clusters",
        json={
            "docker_image": WEB_IMAGE,
            "memory_gb": 1,
            "cpu_cores": 1,
            "ports": [{"internal_port": 8888, "protocol": "http", "visibility": visibility}],
        },
    )
    assert r.status_code == 201, r.text
    data = wait_status(c, r.json()["data"]["id"], {"running", "error"}, timeout=90)
    assert data["status"] == "running", data.get("error_message")
    return data


def host_port(data: dict[str, Any]) -> int:
    port: int = data["network"]["ports"][0]["external_port"]
    assert port > 0
    return port


def host_addresses() -> list[str]:
    """Every IPv4 address of this host but loopback (its external and bridge addresses)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in out.splitlines():
        address = line.split()[3].split("/")[0]
        if not ipaddress.ip_address(address).is_loopback:
            found.append(address)
    assert found, out
    return found


def answers_from(container: Any, address: str, port: int) -> bool:
    """Whether an HTTP GET from inside ``container`` to ``address:port`` is answered."""
    _, out = container.exec_run(["sh", "-c", f"{GET_HEALTHZ} | nc -w 3 {address} {port}"])
    return b"HTTP/1.1 200" in out


def answers_here(address: str, port: int) -> bool:
    try:
        return (
            httpx.get(
                f"http://{address}:{port}/healthz", timeout=5, verify=trusted_tls()
            ).status_code
            == 200
        )
    except httpx.HTTPError:
        return False


def gateway(engine: docker.DockerClient, container: Any) -> str:
    network = next(iter(container.attrs["NetworkSettings"]["Networks"]))
    config = engine.networks.get(network).attrs["IPAM"]["Config"][0]
    return str(config["Gateway"])


def through_proxy(
    proxy_port: int, url: str, headers: dict[str, str], path: str = "/"
) -> httpx.Response:
    parts = urlsplit(url)
    return httpx.get(
        f"http://127.0.0.1:{proxy_port}{path}",
        headers={"Host": parts.netloc, **headers},
        timeout=30,
        follow_redirects=False,
        verify=trusted_tls(),
    )


def eventually(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.2)


@contextmanager
def training_node(
    srv: ServerProcess, engine_url: str, engine: docker.DockerClient
) -> Iterator[Any]:
    """A container on a training cluster's network, made as the training operator makes
    it (SlurmNodeRuntime.ensure_network, the host firewall kept), running the web image's
    busybox instead of Slurm; labelled with the server's installation."""
    owner = srv.installation
    nodes = SlurmNodeRuntime(
        engine_url, owner=owner, policy=EnginePolicy(manage_host_firewall=True)
    )
    names = NodeName(999_999, owner.training_prefix(999_999))
    nodes.ensure_network(names.network)
    container = engine.containers.run(
        WEB_IMAGE,
        name=names.worker(0),
        network=names.network,
        labels=owner.labels(),
        detach=True,
    )
    try:
        yield container
    finally:
        container.remove(force=True)
        nodes.remove_network(names.network)


def test_a_private_port_is_reachable_only_through_the_proxy(
    server: tuple[ServerProcess, int], engine_url: str, engine: docker.DockerClient
) -> None:
    srv, proxy_port = server
    owner = srv.client()
    intruder = as_key(srv, new_account_key(srv, "mallory@example.com"))
    private, public = make(owner, "private"), make(owner, "public")
    probe = engine.containers.get(container_name(srv, make(intruder, "private")["id"]))
    private_port, public_port = host_port(private), host_port(public)
    eventually(
        lambda: bool(
            owner.get(f"/v1/clusters/{private['id']}").json()["data"]["network"]["proxy_url"]
        )
    )
    url = owner.get(f"/v1/clusters/{private['id']}").json()["data"]["network"]["proxy_url"]

    # The owner gets through the proxy (the route may need a sync pass).
    key = {"Authorization": f"Bearer {srv.key}"}
    eventually(lambda: "gpuyard web" in through_proxy(proxy_port, url, key).text)

    # From another account's cluster: every address of the host it can name.
    names = ["host.containers.internal", gateway(engine, probe), *host_addresses()]
    # Aimed right: a public port answers (once its listener is up).
    eventually(lambda: answers_from(probe, names[0], public_port))
    reached = {a: answers_from(probe, a, private_port) for a in names}
    assert not any(reached.values()), reached
    assert all(answers_from(probe, a, public_port) for a in names[1:])

    # From a container on a training cluster's network.
    with training_node(srv, engine_url, engine) as node:
        eventually(lambda: answers_from(node, gateway(engine, node), public_port))
        reached = {a: answers_from(node, a, private_port) for a in names}
        assert not any(reached.values()), reached

    # Forged packets to the host's loopback from a bridge of ours are dropped before
    # the engine's DNAT could send them on to a loopback-published port.
    guard = ["iptables", "-w", "5", "-t", "raw", "-C", "PREROUTING", *LOOPBACK_GUARD]
    assert subprocess.run(guard, capture_output=True, check=False).returncode == 0

    # From outside, at the host's own addresses.
    for address in host_addresses():
        assert answers_here(address, public_port), address
        assert not answers_here(address, private_port), address


def test_no_gpuyard_credential_reaches_the_container_and_sessions_end(
    server: tuple[ServerProcess, int], engine_url: str
) -> None:
    srv, proxy_port = server
    owner = srv.client()
    private = make(owner, "private")
    cid = private["id"]
    eventually(
        lambda: bool(owner.get(f"/v1/clusters/{cid}").json()["data"]["network"]["proxy_url"])
    )
    url = owner.get(f"/v1/clusters/{cid}").json()["data"]["network"]["proxy_url"]
    eventually(
        lambda: "gpuyard web" in through_proxy(proxy_port, url, {"X-Gpuyard-Api-Key": srv.key}).text
    )

    # A member of the owner's account (a user with a home account of their own) opens
    # the port in a browser: a session of their own.
    member_key = new_account_key(srv, "dev@example.com")
    aid = owner.get("/v1/me").json()["data"]["acting"]["account_id"]
    me = as_key(srv, member_key).get("/v1/me").json()["data"]
    member_id = _add_member(srv, aid, me["user"]["id"])
    link = as_key(srv, member_key).get(
        f"/v1/clusters/{cid}/ports/8888/open", headers={"X-Gpuyard-Account": str(aid)}
    )
    assert link.status_code == 200, link.text
    parts = urlsplit(link.json()["data"]["url"])
    landed = through_proxy(proxy_port, url, {}, f"{parts.path}?{parts.query}")
    assert landed.status_code == 302, landed.text
    cookie = landed.headers["set-cookie"].split(";")[0]
    value = cookie.split("=", 1)[1]

    # What the container is shown: no key, no session cookie; its own cookies and
    # Authorization pass.
    seen = through_proxy(
        proxy_port,
        url,
        {"Cookie": f"app=1; {cookie}; theme=dark", "X-Gpuyard-Api-Key": "gy_x"},
        "/headers",
    )
    assert seen.status_code == 200, seen.text
    assert "gy_proxy" not in seen.text and value not in seen.text
    assert "x-gpuyard-api-key" not in seen.text.lower()
    assert "app=1; theme=dark" in seen.text
    seen = through_proxy(proxy_port, url, {"Authorization": f"Bearer {srv.key}"}, "/headers")
    assert seen.status_code == 200 and srv.key not in seen.text
    assert "authorization" not in seen.text.lower()
    seen = through_proxy(
        proxy_port, url, {"X-Gpuyard-Api-Key": srv.key, "Authorization": "Basic YTpi"}, "/headers"
    )
    assert seen.status_code == 200 and srv.key not in seen.text
    assert "Authorization: Basic YTpi" in seen.text
    public = make(owner, "public")
    eventually(
        lambda: bool(
            owner.get(f"/v1/clusters/{public['id']}").json()["data"]["network"]["proxy_url"]
        )
    )
    public_url = owner.get(f"/v1/clusters/{public['id']}").json()["data"]["network"]["proxy_url"]
    eventually(lambda: through_proxy(proxy_port, public_url, {}).status_code == 200)
    seen = through_proxy(
        proxy_port, public_url, {"Authorization": f"Bearer {srv.key}", "Cookie": cookie}, "/headers"
    )
    assert srv.key not in seen.text and value not in seen.text

    # The cookie is matched by its exact name.
    assert through_proxy(proxy_port, url, {"Cookie": f"x=a{cookie}"}).status_code == 401
    assert through_proxy(proxy_port, url, {"Cookie": f"x={cookie}"}).status_code == 401
    assert "gpuyard web" in through_proxy(proxy_port, url, {"Cookie": f"a=1; {cookie}"}).text

    # The member is removed: their session is refused within seconds.
    assert owner.delete(f"/v1/accounts/{aid}/members/{member_id}").status_code == 200
    eventually(lambda: through_proxy(proxy_port, url, {"Cookie": cookie}).status_code == 401)


def _add_member(srv: ServerProcess, account_id: int, user_id: int) -> int:
    """Make ``user_id`` a member of ``account_id`` (role member), beside the server."""
    from gpuyard.services.installation.bootstrap import open_store
    from gpuyard.settings import Settings

    engine, sessions = open_store(Settings(home=srv.home))
    try:
        with sessions() as session, session.begin():
            session.connection(execution_options=WRITE_OPTIONS)
            member = Member(account_id=account_id, user_id=user_id, role="member")
            session.add(member)
            session.flush()
            return member.id
    finally:
        engine.dispose()


@needs("simulated hosts", hosts_unavailable(), how=HOSTS_HOW)
def test_a_private_port_on_an_ssh_host_is_reached_through_a_forward(
    tmp_path: Path, engine_url: str
) -> None:
    """A host added as ssh:// (simulated: its own network namespace, Podman and sshd)
    publishes a private port on its loopback alone; the proxy, on this machine, reaches
    it over SSH, while the host's address answers only for the public port."""
    build_web_image("podman")
    home = tmp_path / "home"
    keys = SshKeys(home)
    proxy_port = free_port()
    env = {
        "GPUYARD_PROXY_ENABLED": "true",
        "GPUYARD_PROXY_PORT": str(proxy_port),
        "GPUYARD_PROXY_SYNC_INTERVAL_S": "0.5",
        "GPUYARD_HEARTBEAT_INTERVAL_S": "1",
    }
    with PodmanHost(ssh_key=keys.public_key()) as sim:
        sim.load_image(engine_url, WEB_IMAGE)
        with running_server(home, engine_url, env) as srv, srv.client() as c:
            assert c.post("/v1/hosts/1/cordon").status_code == 200  # nothing lands here
            r = c.post(
                "/v1/hosts",
                json={"name": "sim", "engine_url": sim.ssh_url, "gpus": "NVIDIA RTX A6000:2",
                      "location": "lab", "vcpus": 8, "memory_gb": 16, "disk_gb": 200},
            )  # fmt: skip
            assert r.status_code == 201, r.text
            host_id = r.json()["data"]["id"]
            eventually(
                lambda: c.get(f"/v1/hosts/{host_id}").json()["data"]["reachability"] == "reachable",
                60,
            )
            private, public = make(c, "private"), make(c, "public")
            for data in (private, public):
                assert data["host"]["id"] == host_id, data
            key = {"Authorization": f"Bearer {srv.key}"}
            for data in (private, public):
                eventually(lambda d=data: bool(proxy_url(c, d["id"])))  # type: ignore[misc]
                url = proxy_url(c, data["id"])
                eventually(lambda u=url: "gpuyard web" in through_proxy(proxy_port, u, key).text)  # type: ignore[misc]
            # At the host's address: the public port answers, the private one does not.
            eventually(lambda: answers_here(sim.address, host_port(public)))
            assert not answers_here(sim.address, host_port(private))
            # Terminated: its forward goes (the proxy answers 404 for the address).
            url = proxy_url(c, private["id"])
            assert c.delete(f"/v1/clusters/{private['id']}").status_code == 200
            wait_status(c, private["id"], {"terminated"}, timeout=90)
            eventually(lambda: through_proxy(proxy_port, url, key).status_code == 404)
            forwards = home / "ssh" / "fwd"
            eventually(
                lambda: (
                    not any(
                        p.name.endswith(f"-{host_port(private)}.sock") for p in forwards.iterdir()
                    )
                )
            )


def proxy_url(c: httpx.Client, cid: str) -> str:
    url: str | None = c.get(f"/v1/clusters/{cid}").json()["data"]["network"]["proxy_url"]
    return url or ""
