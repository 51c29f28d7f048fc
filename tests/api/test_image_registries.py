"""Image names cannot point the engine at an address or an unlisted registry: every
surface that takes an image answers 400 VALIDATION_ERROR naming its own field, and
nothing is created (GPUYARD_ALLOWED_REGISTRIES; core/image_refs.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings, refused

A6000 = "NVIDIA RTX A6000"
REFUSED = [
    "127.0.0.1:8765/x",
    "[::1]:5000/x",
    "10.0.0.5/x",
    "169.254.169.254/x",
    "evil.example.com/x",
    "localhost:8000/x",
    "127.1/x",
]
ALLOWED = [
    "runpod/pytorch:2.1",
    "ghcr.io/org/img:v1",
    "localhost/gpuyard/busybox:latest",
]


def gql(srv: LiveServer, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    return srv.graphql(query, variables)


POD_DEPLOY = (
    "mutation($image: String!) { podFindAndDeployOnDemand(input: "
    '{gpuTypeId: "NVIDIA RTX A6000", gpuCount: 1, imageName: $image}) { id } }'
)
SEED_DEPLOY = (
    "mutation($image: String!) { clusterFindAndDeployOnDemand(input: "
    '{gpuTypeId: "NVIDIA RTX A6000", gpuCount: 1, imageName: $image}) { id } }'
)


def no_clusters(srv: LiveServer) -> None:
    with srv.client() as c:
        assert c.get("/v1/clusters").json()["data"]["clusters"] == []


@pytest.mark.parametrize("image", REFUSED)
def test_rest_v1_create_refuses_addresses_and_unlisted_registries(
    srv: LiveServer, image: str
) -> None:
    with srv.client() as c:
        error = refused(
            c.post("/v1/clusters", json={"gpu_type": A6000, "docker_image": image}),
            "docker_image",
        )
    assert error["details"]["registry"] in image
    no_clusters(srv)


@pytest.mark.parametrize("image", REFUSED)
def test_graphql_deploys_refuse_them_naming_image_name(srv: LiveServer, image: str) -> None:
    for query in (POD_DEPLOY, SEED_DEPLOY):
        body = gql(srv, query, {"image": image})
        assert [e["extensions"]["code"] for e in body["errors"]] == ["VALIDATION_ERROR"], body
        assert body["errors"][0]["extensions"]["details"]["field"] == "input.imageName"
    no_clusters(srv)


@pytest.mark.parametrize("image", ALLOWED)
def test_public_registries_and_local_images_are_accepted(srv: LiveServer, image: str) -> None:
    with srv.client() as c:
        r = c.post("/v1/clusters", json={"gpu_type": A6000, "docker_image": image})
        assert r.status_code == 201, r.text
    body = gql(srv, POD_DEPLOY, {"image": image})
    assert "errors" not in body, body


def test_start_with_a_new_image_refuses_them_in_v1_and_v2(srv: LiveServer) -> None:
    with srv.client() as c:
        r = c.post("/v1/clusters", json={"gpu_type": A6000, "docker_image": "img"})
        cid = r.json()["data"]["id"]
        assert srv.server.reconciler.wait_idle(10)
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        for image in REFUSED:
            update = {"update_configuration": {"docker_image": image}}
            field = "update_configuration.docker_image"
            refused(c.post(f"/v1/clusters/{cid}/start", json=update), field)
            refused(c.post(f"/v2/clusters/{cid}/start", json=update), field)
        data = c.get(f"/v1/clusters/{cid}").json()["data"]
        assert data["status"] == "stopped" and data["docker_image"] == "img"
        r = c.post(
            f"/v2/clusters/{cid}/start",
            json={"update_configuration": {"docker_image": "ghcr.io/org/img:2"}},
        )
        assert r.status_code == 200, r.text
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["docker_image"] == "ghcr.io/org/img:2"


def test_image_versions_refuse_them(srv: LiveServer) -> None:
    with srv.client() as c:
        before = c.get("/v1/images").json()["data"]["images"]
        for image in REFUSED:
            body = {"name": "n", "version": "1", "image": image}
            refused(c.post("/v1/images", json=body), "image")
        assert c.get("/v1/images").json()["data"]["images"] == before


@pytest.fixture
def private_registry(tmp_path: Path) -> Iterator[LiveServer]:
    """An operator who runs a registry at 10.0.0.5:5000 and lists it exactly."""
    settings = make_settings(
        tmp_path / "home", allowed_registries="public,localhost,10.0.0.5:5000,*.corp.test"
    )
    with live_server(settings, FakeRuntime()) as live:
        yield live


def test_an_operator_listed_address_is_allowed_and_nothing_near_it(
    private_registry: LiveServer,
) -> None:
    with private_registry.client() as c:
        for image in ("10.0.0.5:5000/team/x:1", "reg.corp.test/x", "ubuntu"):
            r = c.post("/v1/clusters", json={"docker_image": image})
            assert r.status_code == 201, r.text
        for image in ("10.0.0.5/x", "10.0.0.5:5001/x", "10.0.0.6:5000/x", "127.0.0.1:5000/x"):
            refused(c.post("/v1/clusters", json={"docker_image": image}), "docker_image")
