"""A host port the user chose that something on the host holds (another program,
another installation's container) answers 409 PORT_IN_USE naming the port at once, on
create and on start: nothing is stored, no start is tried. One gpuyard's own cluster
holding it answers the same. Fake runtime (its ``listening`` host ports), real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, free_port, live_server, make_settings

A6000 = "NVIDIA RTX A6000"


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
def live(tmp_path: Path, runtime: FakeRuntime) -> Iterator[LiveServer]:
    settings = make_settings(tmp_path / "home", port=free_port())
    with live_server(settings, runtime) as srv:
        yield srv


def chosen_port(srv: LiveServer, offset: int) -> int:
    """A host port of the range a user may choose: ``offset`` into it, stepping past the
    server's own port (which the tests' servers also take from the range's numbers)."""
    settings = srv.server.ctx.settings
    port = settings.port_range_start + offset
    while port in (settings.port, settings.port - 1):
        port += 2
    return port


def create(c: httpx.Client, external_port: int) -> httpx.Response:
    return c.post(
        "/v1/clusters",
        json={
            "gpu_type": A6000,
            "docker_image": "img",
            "ports": [{"internal_port": 22, "external_port": external_port}],
        },
    )


def assert_port_in_use(r: httpx.Response, port: int) -> None:
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "PORT_IN_USE"
    assert f"host port {port}/tcp" in error["message"]
    assert error["details"]["external_port"] == port


def test_a_chosen_port_a_process_holds_answers_409_at_once(
    live: LiveServer, runtime: FakeRuntime
) -> None:
    port = chosen_port(live, 5)
    runtime.listening.add((port, "tcp"))
    with live.client() as c:
        assert_port_in_use(create(c, port), port)
        assert c.get("/v1/clusters").json()["data"]["clusters"] == []
        assert runtime.calls.get("create", 0) == 0
        # Another port is fine; a start that asks for the held one is refused too.
        r = create(c, port + 1)
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
        assert live.server.reconciler.wait_idle(10)
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert live.server.reconciler.wait_idle(10)
        update = {"port_mapping_updates": [{"internal_port": 22, "external_port": port}]}
        assert_port_in_use(c.post(f"/v1/clusters/{cid}/start", json=update), port)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "stopped"


def test_a_chosen_port_another_cluster_holds_answers_port_in_use(live: LiveServer) -> None:
    port = chosen_port(live, 9)
    with live.client() as c:
        assert create(c, port).status_code == 201
        assert_port_in_use(create(c, port), port)
