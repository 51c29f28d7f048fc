"""``external_port`` lies in GPUYARD_PORT_RANGE_START..END and is never the server's
own port: 400 VALIDATION_ERROR naming the field on create and on start (v1 and v2), in
the v1 envelope; 0 still assigns one, and an assigned port skips the server's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, free_port, live_server, make_settings, refused

A6000 = "NVIDIA RTX A6000"


def create(c: httpx.Client, *ports: dict[str, Any]) -> httpx.Response:
    return c.post(
        "/v1/clusters",
        json={"gpu_type": A6000, "docker_image": "img", "ports": list(ports)},
    )


def stopped(srv: LiveServer, c: httpx.Client) -> str:
    r = create(c, {"internal_port": 8888, "protocol": "http"})
    assert r.status_code == 201, r.text
    cid: str = r.json()["data"]["id"]
    assert srv.server.reconciler.wait_idle(10)
    assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
    assert srv.server.reconciler.wait_idle(10)
    return cid


@pytest.mark.parametrize("port", [80, 19999, 30000, 65535])
def test_create_refuses_a_port_outside_the_range(srv: LiveServer, port: int) -> None:
    with srv.client() as c:
        error = refused(
            create(c, {"internal_port": 22}, {"internal_port": 8888, "external_port": port}),
            "ports[1].external_port",
        )
        assert "20000-29999" in error["message"]
        assert error["details"]["range_start"] == 20000
        assert error["details"]["range_end"] == 29999
        # Nothing was stored or placed.
        assert c.get("/v1/clusters").json()["data"]["clusters"] == []


@pytest.mark.parametrize("port", [0, 20000, 29999])
def test_create_takes_zero_and_ports_inside_the_range(srv: LiveServer, port: int) -> None:
    with srv.client() as c:
        r = create(c, {"internal_port": 8888, "external_port": port})
        assert r.status_code == 201, r.text
        got = r.json()["data"]["ports"][0]["external_port"]
        assert got == port if port else 20000 <= got <= 29999


def test_start_refuses_port_updates_outside_the_range(srv: LiveServer) -> None:
    with srv.client() as c:
        cid = stopped(srv, c)
        update = {"port_mapping_updates": [{"internal_port": 22, "external_port": 2222}]}
        refused(
            c.post(f"/v1/clusters/{cid}/start", json=update),
            "port_mapping_updates[0].external_port",
        )
        refused(
            c.post(f"/v2/clusters/{cid}/start", json=update),
            "port_mapping_updates[0].external_port",
        )
        # The refused starts changed nothing.
        data = c.get(f"/v1/clusters/{cid}").json()["data"]
        assert data["status"] == "stopped"
        assert [p["internal_port"] for p in data["ports"]] == [8888]
        ok = {"port_mapping_updates": [{"internal_port": 22, "external_port": 22222}]}
        r = c.post(f"/v1/clusters/{cid}/start", json=ok)
        assert r.status_code == 200, r.text
        ports = {p["internal_port"]: p["external_port"] for p in r.json()["data"]["ports"]}
        assert ports[22] == 22222


@pytest.fixture
def overlapping(tmp_path: Path) -> Iterator[LiveServer]:
    """A server whose port range begins at its own port (an operator's choice)."""
    port = free_port()
    settings = make_settings(
        tmp_path / "home", port=port, port_range_start=port, port_range_end=port + 3
    )
    with live_server(settings, FakeRuntime()) as live:
        yield live


def test_the_servers_own_port_is_never_given_to_a_cluster(overlapping: LiveServer) -> None:
    own = overlapping.server.ctx.settings.port
    with overlapping.client() as c:
        error = refused(
            create(c, {"internal_port": 8888, "external_port": own}), "ports[0].external_port"
        )
        assert "own port" in error["message"]
        r = create(c, {"internal_port": 8888})
        assert r.status_code == 201, r.text
        assert r.json()["data"]["ports"][0]["external_port"] == own + 1


def test_graphql_deploys_get_a_port_in_the_range_and_not_the_servers(
    overlapping: LiveServer,
) -> None:
    """GraphQL inputs name no host port (``ports: "8888/http"``): the one assigned
    follows the same rules."""
    own = overlapping.server.ctx.settings.port
    query = (
        'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "NVIDIA RTX A6000", '
        'imageName: "x", ports: "8888/http,22/tcp"}) { id } }'
    )
    r = httpx.post(
        f"{overlapping.url}/graphql",
        json={"query": query},
        headers={"Authorization": f"Bearer {overlapping.key}"},
        verify=trusted_tls(),
    )
    assert r.status_code == 200 and "errors" not in r.json(), r.text
    cid = r.json()["data"]["podFindAndDeployOnDemand"]["id"]
    with overlapping.client() as c:
        ports = [p["external_port"] for p in c.get(f"/v1/clusters/{cid}").json()["data"]["ports"]]
    assert sorted(ports) == [own + 1, own + 2]
