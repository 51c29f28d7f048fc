"""Host ports with real server processes on real Podman: a port is never handed out
while anything on the host holds it.

- Two installations on one engine with the same port range (each hands out the range's
  first port first) each run 5 clusters with HTTP ports: all 10 run, on 10 ports.
- A program listening on the range's first port: gpuyard never publishes on it; the
  cluster gets the next port, an event names both, ``network`` shows the new one; a
  user who chooses that port gets 409 PORT_IN_USE at once.
- A socket bound (not listening, so no listing shows it) on the next port: the start
  meets "address already in use" and moves on, with the event.

The servers share a port block this test process holds (tests/helpers.py port_block):
other test processes on this machine never publish there.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_ownership_e2e import ServerFactory, _servers, cluster, create
from tests.e2e.test_server_e2e import wait_status
from tests.helpers import port_block
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]

HTTP = [{"internal_port": 8888, "external_port": 0, "protocol": "http"}]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerFactory]:
    yield from _servers(tmp_path)


def host_port(c: httpx.Client, cid: str) -> int:
    port: int = cluster(c, cid)["ports"][0]["external_port"]
    return port


def events(c: httpx.Client, cid: str, kind: str) -> list[str]:
    r = c.get(f"/v1/clusters/{cid}/events", params={"limit": 100})
    assert r.status_code == 200, r.text
    return [e["message"] for e in r.json()["data"]["events"] if e["type"] == kind]


def running(c: httpx.Client, cid: str) -> dict[str, Any]:
    found = wait_status(c, cid, {"running", "error"}, timeout=180)
    assert found["status"] == "running", found
    return found


def test_two_installations_ports(servers: ServerFactory, engine_url: str) -> None:
    low = port_block()  # held by this process: no other test process publishes there
    same_range = {"GPUYARD_PORT_RANGE_START": str(low), "GPUYARD_PORT_RANGE_END": str(low + 99)}
    a = servers("a", engine_url, **same_range)
    b = servers("b", engine_url, **same_range)
    with a.client() as ca, b.client() as cb:
        made: list[tuple[httpx.Client, str]] = []
        for i in range(5):  # interleaved: both hand out the same first ports
            made.append((ca, create(ca, name=f"a{i}", gpu_count=0, ports=HTTP)))
            made.append((cb, create(cb, name=f"b{i}", gpu_count=0, ports=HTTP)))
        for c, cid in made:
            running(c, cid)
        ports = [host_port(c, cid) for c, cid in made]
        assert len(set(ports)) == 10, ports
        assert all(low <= p <= low + 99 for p in ports), ports
        for c, cid in made:  # no start failed on a taken port on the way
            retries = events(c, cid, "start_retry")
            assert not [m for m in retries if "already in use" in m], (cid, retries)


def test_a_process_on_a_range_port(servers: ServerFactory, engine_url: str) -> None:
    srv = servers("s", engine_url)
    low = srv.port_block
    with socket.socket() as listener, socket.socket() as bound, srv.client() as c:
        listener.bind(("0.0.0.0", low))
        listener.listen()
        # A user who chooses the held port is told at once.
        r = c.post(
            "/v1/clusters",
            json={
                "gpu_type": "NVIDIA RTX A6000",
                "gpu_count": 0,
                "docker_image": "unused",
                "ports": [{"internal_port": 22, "external_port": low}],
            },
        )
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "PORT_IN_USE"
        assert f"host port {low}/tcp" in r.json()["error"]["message"]

        first = create(c, name="first", gpu_count=0, ports=HTTP)
        running(c, first)
        assert host_port(c, first) == low + 1
        assert events(c, first, "port_moved") == [
            f"host port {low}/tcp is in use on the host; port 8888/tcp got host port "
            f"{low + 1} instead"
        ]

        # Bound but not listening: no listing shows it; the engine's bind meets it.
        bound.bind(("0.0.0.0", low + 2))
        second = create(c, name="second", gpu_count=0, ports=HTTP)
        running(c, second)
        assert host_port(c, second) == low + 3
        # (It was given the listener's port first, which the host's answer moved.)
        assert events(c, second, "port_moved")[-1] == (
            f"host port {low + 2}/tcp is in use on the host; port 8888/tcp got host port "
            f"{low + 3} instead"
        )
        retries = events(c, second, "start_retry")
        assert not [m for m in retries if "already in use" in m], retries
