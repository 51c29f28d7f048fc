"""Network volumes on real Podman through the real server (``gpuyard serve``): two
clusters on one host share a volume's data, it outlives them for a third, its usage is
measured from the engine, and it is deleted only once nothing mounts it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gpuyard.core.ownership import LABEL_CLUSTER, LABEL_INSTALLATION
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_server_e2e import ServerProcess, gone, sh, wait_status
from tests.helpers import free_port
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]


@pytest.fixture
def engine(engine_url: str) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=engine_url)
    yield client
    client.close()


def volumes_named(engine: docker.DockerClient, name: str) -> list[Any]:
    return [v for v in engine.volumes.list() if v.name == name]


def wait_used(c: httpx.Client, vid: str, at_least: int, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        data: dict[str, Any] = c.get(f"/v1/networkvolumes/{vid}").json()["data"]
        if data["used_bytes"] is not None and data["used_bytes"] >= at_least:
            return data
        assert time.monotonic() < deadline, data
        time.sleep(0.2)


def test_a_network_volume_is_shared_and_outlives_its_clusters(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    server = ServerProcess(tmp_path / "home", engine_url, free_port())
    server.extra_env = {"GPUYARD_VOLUME_USAGE_INTERVAL_S": "0.5"}
    server.start()
    try:
        with server.client() as c:
            r = c.post(
                "/v1/networkvolumes", json={"name": "shared", "size": 1, "dataCenterId": "local"}
            )
            assert r.status_code == 201, r.text
            vid = r.json()["data"]["id"]
            body = {
                "gpu_type": "NVIDIA RTX A6000",
                "docker_image": DEV_IMAGE,
                "cpu_cores": 1,
                "memory_gb": 1,
                "network_volume_id": vid,
            }
            ids = []
            for name in ("writer", "reader"):
                r = c.post("/v1/clusters", json={**body, "name": name})
                assert r.status_code == 201, r.text
                ids.append(r.json()["data"]["id"])
            writer, reader = ids
            for cid in ids:
                data = wait_status(c, cid, {"running", "error"})
                assert data["status"] == "running", (data.get("error_message"), server.log_tail())

            # One engine volume, ours, labelled for the network volume, mounted by both.
            name = server.installation.network_volume(vid)
            (volume,) = volumes_named(engine, name)
            assert volume.attrs["Labels"][LABEL_INSTALLATION] == server.installation.installation_id
            assert volume.attrs["Labels"][LABEL_CLUSTER] == vid
            for cid in ids:
                container = engine.containers.get(server.installation.container(cid))
                mounts = {m["Name"]: m["Destination"] for m in container.attrs["Mounts"]}
                assert mounts.get(name) == "/workspace", container.attrs["Mounts"]

            assert sh(engine, server, writer, "echo shared-data > /workspace/hello.txt")[0] == 0
            assert sh(engine, server, reader, "cat /workspace/hello.txt") == (0, "shared-data\n")
            # Measured from the engine's disk-usage report (the file's 12 bytes).
            assert wait_used(c, vid, 12)["used_bytes"] >= 12
            seen = c.get(f"/v1/clusters/{reader}").json()["data"]["volume"]
            assert seen["network_volume_id"] == vid and seen["size_gb"] == 1

            r = c.delete(f"/v1/networkvolumes/{vid}")
            assert r.status_code == 409, r.text
            assert sorted(r.json()["error"]["details"]["cluster_ids"]) == sorted(ids)

            for cid in ids:
                assert c.delete(f"/v1/clusters/{cid}").status_code == 200
            for cid in ids:
                wait_status(c, cid, {"terminated"})
                assert gone(engine, server, cid)
            assert volumes_named(engine, name)  # it outlives its clusters

            r = c.post("/v1/clusters", json={**body, "name": "later"})
            third = r.json()["data"]["id"]
            assert wait_status(c, third, {"running", "error"})["status"] == "running"
            assert sh(engine, server, third, "cat /workspace/hello.txt") == (0, "shared-data\n")
            r = c.delete(f"/v1/networkvolumes/{vid}")
            assert r.status_code == 409 and r.json()["error"]["details"]["cluster_ids"] == [third]
            c.delete(f"/v1/clusters/{third}")
            wait_status(c, third, {"terminated"})

            r = c.delete(f"/v1/networkvolumes/{vid}")
            assert r.status_code == 200, r.text
            assert not volumes_named(engine, name)
            assert c.get(f"/v1/networkvolumes/{vid}").status_code == 404
    finally:
        server.cleanup()
